"""Ownership that Ctrl-C cannot split."""

from __future__ import annotations

import _signal
import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def atomic() -> Iterator[None]:
    """A block that no Ctrl-C splits: a KeyboardInterrupt (SIGINT) arriving meanwhile is raised when the block
    ends (through the handler that was in force: Python's raises KeyboardInterrupt). Caches hand tensors over
    inside one, so a tensor is always owned by exactly one side. Off the main thread (where Python delivers no
    signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[object] = []
    previous = _signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))  # (the C module:
    try:  # it runs every step, and signal.signal's enum conversions cost ten times as much)
        yield
    finally:
        _signal.signal(signal.SIGINT, previous)
    if pending and callable(previous):
        previous(signal.SIGINT, None)
