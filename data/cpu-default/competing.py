"""CPU-bound processes competing for the cores for a block of code: the load of this folder's recordings.

    from competing import competing
    with competing(2):  # two Python processes spinning on arithmetic, running before the block starts
        ...             # and killed and reaped when it ends, exactly once whatever happens (Ctrl-C included)

On Linux each competitor also dies with the process that started it (PR_SET_PDEATHSIG), so a run killed without its
cleanup (SIGKILL, a timeout's SIGTERM) leaves none spinning.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvlab import ConfigError

SPIN = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush()\nwhile True: pass"


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux's PR_SET_PDEATHSIG);
    None elsewhere."""
    if sys.platform != "linux":
        return None
    parent = os.getpid()

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return arm


def check_load(load: object, flag: str = "--load") -> int:
    """``load`` competing processes, from 0 to 4 per logical CPU; else a ConfigError naming ``flag``. More only
    thrashes the scheduler, and a slip such as 1000000000 would start processes until the machine stops."""
    top = 4 * (os.cpu_count() or 1)
    if isinstance(load, bool) or not isinstance(load, int) or not 0 <= load <= top:
        raise ConfigError(f"{flag} {load!r} must be at least 0 and at most {top} (4 per logical CPU)")
    return load


@contextmanager
def competing(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` CPU-bound processes (``check_load``), each running (it has said so) before the block starts, killed and
    reaped when it ends."""
    check_load(n, "competing processes")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True, preexec_fn=dies_with_parent()
                )
            )
        for p in procs:
            p.stdout.readline()
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            p.stdout.close()
