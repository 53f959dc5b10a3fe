"""What keeps a step whole: its token ids checked before anything moves (``check_token_ids``), one user at a time
(a cache runs one generation at a time, a stepper one with block and one step at a time; a second user gets a
CacheStateError naming the misuse instead of a race), and blocks that Ctrl-C cannot split (``atomic``: a tensor
handed over inside one is always owned by exactly one side)."""

from __future__ import annotations

import _signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .errors import CacheStateError, ConfigError

SIGINT = 2


def check_token_ids(ids: Any, vocab_size: int) -> np.ndarray:
    """Token ids as a 1-D int64 array, each checked against the vocabulary (batch size 1); ConfigError otherwise."""
    fast = type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1  # a step's own token ids
    if fast and (
        ids.size == 1 and 0 <= ids[0] < vocab_size or ids.size > 1 and ids.min() >= 0 and ids.max() < vocab_size
    ):
        return ids
    try:
        ids = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as exc:  # a ragged list ([[1, 2], [3]]), ...
        raise ConfigError(f"token ids must be a 1-D list of ints, got {ids!r:.60} ({exc})") from None
    if ids.ndim == 2 and ids.shape[0] != 1:
        raise ConfigError(
            f"batch size {ids.shape[0]} is not supported: kvlab generates one sequence at a time (batch size 1)"
        )
    ids = ids.reshape(-1) if ids.ndim == 2 else ids
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token ids must be a 1-D list of ints, got shape {ids.shape} dtype {ids.dtype}")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ConfigError(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab_size})")
    return ids.astype(np.int64)


class atomic:  # noqa: N801 - used as a context manager, like contextlib's
    """``with atomic(): ...``: a block that no Ctrl-C splits: a SIGINT arriving meanwhile is handed, when the block
    ends, to the handler that was in force (a SIGTERM the CLI passes on as Ctrl-C, to the CLI's). Caches hand tensors
    over inside one: a tensor is always owned by exactly one side. Off the main thread (no signals) it does nothing."""

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


NEW, OPEN, CLOSED = "new", "open", "closed"  # before, inside and after a with block


class OneAtATime:
    """Held by one thread at a time: ``with holder.hold(refusal):`` holds it for the block, or raises ``refusal()``
    at once when another holds it (no waiting: a second user is a mistake to name, not to queue)."""

    __slots__ = ("_lock", "owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None  # the ident of the thread holding it

    @property
    def held(self) -> bool:
        """Whether a thread holds it now."""
        return self._lock.locked()

    @property
    def mine(self) -> bool:
        """Whether the calling thread holds it."""
        return self.owner == threading.get_ident()

    def give_back(self) -> None:
        """Release it for a holder whose block ended without releasing it (a Ctrl-C that landed as the release
        began, before any of its code ran: nothing can defer that one); the holder establishes that first."""
        with atomic():
            self.owner = None
            self._lock.release()

    def hold(self, refusal: Callable[[], BaseException]) -> _Held:
        """A context manager that holds it for its block, or raises ``refusal()`` when another thread holds it."""
        return _Held(self, refusal)


def atomic_enter(enter: Callable[[], object], undo: Callable[[], object]) -> None:
    """Run ``enter()`` (take a hold, open a use) in a block no Ctrl-C splits. A Ctrl-C raised as the block ends,
    after ``enter`` succeeded, runs ``undo()`` before it propagates: the ``with`` never opens, so what ``enter``
    took is given back exactly once. Raises what ``enter`` raises (nothing taken then)."""
    entered = False
    try:
        with atomic():
            enter()
            entered = True
    except BaseException:
        if entered:
            undo()
        raise


class _Held:
    __slots__ = ("_holder", "_refusal")

    def __init__(self, holder: OneAtATime, refusal: Callable[[], BaseException]):
        self._holder, self._refusal = holder, refusal

    def __enter__(self) -> None:
        atomic_enter(self._take, self.__exit__)

    def _take(self) -> None:
        """Held and its owner set, or neither (inside ``atomic_enter``'s block)."""
        if not self._holder._lock.acquire(blocking=False):
            raise self._refusal()
        self._holder.owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        with atomic():  # released exactly once, also when a Ctrl-C arrives meanwhile (it is raised after)
            self._holder.owner = None
            self._holder._lock.release()


class OneBlock:
    """The life of an object used inside one with block (``name``: what it is, ``how``: how to open it): opened once,
    closed once, called inside it one call at a time (another thread's call meanwhile is refused, not queued)."""

    def __init__(self, name: str, how: str):
        self.name, self.how, self.state = name, how, NEW
        self._calls = OneAtATime()

    @contextmanager
    def opening(self) -> Iterator[None]:
        """The block's entry: refused once the block was entered; open when the body of the ``with`` succeeds."""
        if self.state != NEW:
            where = "its with block is still open" if self.state == OPEN else "its with block has ended"
            raise CacheStateError(
                f"this {self.name} was entered already ({where}); a {self.name} is one with block, entered once: "
                f"make a new {self.name}"
            )
        yield
        self.state = OPEN

    def close(self) -> None:
        """The block ended: every later call is refused."""
        self.state = CLOSED

    def call(self, what: str) -> _Held:
        """The hold for one call ``what`` (e.g. "step"): refused outside the block, or while another runs."""
        if self.state != OPEN:
            where = "before its with block" if self.state == NEW else "after its with block ended"
            raise CacheStateError(f"{self.name}.{what}() was called {where}; call it inside {self.how}")
        return self._calls.hold(
            lambda: CacheStateError(
                f"{self.name}.{what}() was called while another thread's call runs on this {self.name}; a "
                f"{self.name} runs one call at a time (give each thread its own {self.name} and cache)"
            )
        )
