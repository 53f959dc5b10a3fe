"""The ``kvlab`` command: doctor, inspect, generate (compare), chat, chat-bench, bench, profile ops|phases,
trace, conformance, browser-bench, prepare.

Every failure is one line on stderr, never a traceback. The exit statuses (``kvlab.cli.exits``):

- 0: done.
- 1: what the command checks failed (``kvlab doctor`` found problems, ``kvlab chat-bench``'s tokens differ; stdout
  says which), or a defect: ``kvlab: internal error: ...``, with where it was raised and a request to report it
  (``KVLAB_TRACEBACK=1`` shows its traceback).
- 2: a user error: a bad flag (``kvlab: error: ...`` with the subcommand and ``--help``); every kvlab error
  (``kvlab.KvlabError``), DeviceError included (its fix is the user's: another ``--device``, a driver, ``kvlab
  doctor``'s advice); an output path kvlab cannot write, found before anything is measured; stdout closed (``>&-``)
  or on a device that takes no more (a full disk, ``/dev/full``), said in one line.
- 130 (128 + SIGINT): Ctrl-C, from the moment the ``kvlab`` package is imported: ``kvlab: interrupted ...``.
  SIGTERM stops a command as Ctrl-C does, through the same releases (``kvlab bench`` keeps the contexts it
  finished). Once the first has landed, a second Ctrl-C or SIGTERM is ignored: the releases run whole.
- 141 (128 + SIGPIPE): stdout's reader went away (``kvlab generate --json | head -1``): the command stops quietly,
  as a Unix tool killed by SIGPIPE does for ``set -o pipefail`` (``--help`` may exit 0: argparse ignores a failed
  write of its text).

The room: the parser and its flag groups (``commands``, ``flags``), the commands' modules (``generate``, ``chat``,
``bench``: bench, trace, conformance, profile; ``browser``, ``doctor``, ``prepare``) and doctor's platform logic
(``platform_facts``). The commands import every package below them; nothing in kvlab imports this room but
``kvlab.__main__``. This module and ``kvlab.cli.exits`` import only the standard library (and ``kvlab``'s lazy
``__init__``), so that ``main`` handles Ctrl-C before the subcommands load; under ``python -m kvlab`` the package's
own handler exits 130 with the same line until ``main`` takes over."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from .. import _interrupted_at_startup
from .exits import BROKEN_PIPE, INTERRUPTED, USER_ERROR, say, silence_stdout, stdout_failed, stdout_refused

__all__ = ["main", "stop"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvlab`` command on ``argv`` (default ``sys.argv[1:]``); returns its exit status (the module
    docstring). argparse's errors and ``--help`` raise SystemExit, as argparse does. The first Ctrl-C or SIGTERM
    stops the command (130, one line); those after it, while its releases run, are ignored. Called as the process's
    command (``argv`` None) it leaves signals ignored for the interpreter's teardown, so that a late signal cannot
    turn the status into "killed"; called with ``argv`` it gives the caller's handlers back."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): every line it prints would be lost
        say("kvlab: error: stdout is closed, so the command's output would be lost: give it a file or /dev/null")
        return USER_ERROR
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _terminate)
    try:
        # python -m kvlab: Ctrl-C is ours from here (inside the try, so no signal lands between the two handlers)
        if previous[signal.SIGINT] in (_interrupted_at_startup, signal.default_int_handler):
            signal.signal(signal.SIGINT, _interrupt)
        try:
            from .commands import run  # the subcommands and all they import

            return run(argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a reader gone shows here, not in Python's flush at exit
    except KeyboardInterrupt:
        _stopping()
        say("kvlab: interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return BROKEN_PIPE
    except OSError as exc:  # stdout's device took no more (a full disk, /dev/full): said as the command's failure
        if not stdout_refused(exc):
            raise
        say(f"kvlab: error: {stdout_failed(exc)}")
        silence_stdout()
        return USER_ERROR
    finally:
        if argv is None:
            _stopping()
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def stop(signum: int, frame: object) -> None:
    """SIGTERM, handled as Ctrl-C: through the SIGINT handler in force (Python's raises KeyboardInterrupt;
    ``kvlab.core.guards.atomic``'s defers it to its block's end), or straight away where Ctrl-C is ignored (a job
    started in the background by a script inherits that) but a SIGTERM still means stop."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signum, frame)


def _interrupt(signum: int, frame: object) -> None:
    """``main``'s SIGINT handler: the first Ctrl-C (or a SIGTERM passed on as one) stops the command; from then on
    both signals are ignored, so that a second one cannot cut the first one's releases short."""
    _stopping()
    raise KeyboardInterrupt


def _terminate(signum: int, frame: object) -> None:
    """``main``'s SIGTERM handler: ``stop``, and where Ctrl-C is ignored (so ``_interrupt`` never runs) the later
    signals ignored as ``_interrupt`` does."""
    if not callable(signal.getsignal(signal.SIGINT)):
        _stopping()
    stop(signum, frame)


def _stopping() -> None:
    """Ignore SIGINT and SIGTERM from now on, in the kernel's sense (SIG_IGN): Python's own finalization keeps an
    ignored signal ignored, where it would put a Python handler back to the default (killed by the signal)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
