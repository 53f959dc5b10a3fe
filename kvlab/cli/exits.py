"""The ``kvlab`` command's exit statuses and its one-line messages (the table is ``kvlab.cli``'s docstring).
Standard library only: ``kvlab.cli.main`` uses these before the subcommands are imported."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sys

FAILED = 1  # the command ran and what it checks failed, or a defect ("internal error")
USER_ERROR = 2  # a bad flag, and every kvlab error
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, or SIGTERM handled as Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout's reader went away (``kvlab ... | head -1``)


def say(line: str) -> None:
    """``line`` on stderr, flushed; nothing where stderr itself is gone (closed, a pipe nobody reads)."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: stderr closed in this process
        print(line, file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    """``exc``'s message as one line: its lines joined with "; " (the type's name where it has none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


def stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone: the kernel reports an error condition on its
    write end (POLLERR). False where it cannot be told (no ``poll``, stdout not a file descriptor)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout's file descriptor at the null device, so that Python's flush of stdout at exit, with what is
    still buffered, finds nowhere to fail (the recipe of Python's ``signal`` documentation, "Note on SIGPIPE")."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def stdout_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is stdout's device refusing the output (a full disk, ``/dev/full``, a file-size limit): an
    OSError of that kind naming no file (a file kvlab writes is named in its error), or any OSError while stdout
    still holds bytes it cannot write (flushing it fails again)."""
    if not isinstance(exc, OSError) or isinstance(exc, BrokenPipeError) or sys.stdout is None:
        return False
    from ..core.paths import NO_ROOM  # here: the module is standard library only at import

    try:
        sys.stdout.flush()
    except OSError:
        return True
    except ValueError:  # stdout closed meanwhile
        return False
    return exc.errno in NO_ROOM | {errno.EIO} and exc.filename is None  # EIO: a device that takes no more


def stdout_failed(exc: OSError) -> str:
    """The line for stdout refusing the output: where it points and why."""
    try:
        where = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (AttributeError, OSError, ValueError):
        where = "its file"
    return (
        f"stdout ({where}) took no more of the output ({exc.strerror or exc}), so the output is incomplete: "
        "give it a file on a disk with room, or /dev/null"
    )
