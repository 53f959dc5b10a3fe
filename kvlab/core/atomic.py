"""Ownership that Ctrl-C cannot split."""

from __future__ import annotations

import _signal
import threading
from typing import Any

SIGINT = 2


class atomic:  # noqa: N801 - used as a context manager, like contextlib's
    """``with atomic(): ...``: a block that no Ctrl-C splits: a KeyboardInterrupt (SIGINT) arriving meanwhile is
    raised when the block ends (through the handler that was in force: Python's raises KeyboardInterrupt; a SIGTERM
    the CLI passes on as Ctrl-C goes back to the CLI's handler). Caches hand tensors over inside one, so a tensor is
    always owned by exactly one side. Off the main thread (where Python delivers no signals) it does nothing. A
    class, and the C signal module: it runs every decode step."""

    __slots__ = ("_pending", "_previous")

    def __enter__(self) -> None:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._pending: list[int] = []
            self._previous = _signal.signal(SIGINT, lambda signum, frame: self._pending.append(signum))

    def __exit__(self, *exc: Any) -> None:
        if self._previous is None:
            return
        _signal.signal(SIGINT, self._previous)
        if self._pending:  # a signal another handler passed on (the CLI's SIGTERM) goes back to that handler
            signum = self._pending[0]
            handler = self._previous if signum == SIGINT else _signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)
