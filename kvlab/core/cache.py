"""A cache's life, the same for every cache kind and backend: a cache is a list of slots (``kvlab.core.slots``),
one per entry of the model's layout, held together and stepped by ``kvlab.core.steps``; ``Cache`` adds its life.

``use(info, device, positions)`` holds the cache for one generation (one at a time; capacity checked; buffers
allocated lazily, all or nothing); ``crop(n)`` keeps the first ``n`` positions; ``reset()`` forgets the sequence;
``dispose()`` releases everything, once; ``receive(other)`` takes over a sequence another cache of the same kind
holds on another device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import CacheStateError, CapacityError, check_int
from .labels import CacheSpec
from .records import CacheStep
from .slots import Slot
from .steps import COMMITTED, CacheSteps


class Cache(CacheSteps):
    """A cache's life: bound to one model layout and device, one generation at a time, reset, crop, dispose, and
    the handoff. A cache kind says which slot holds each entry (``_slot``)."""

    kind = "cache"

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0  # uses so far: who remembers it knows whether another use came between two of its own

    @property
    def spec(self) -> CacheSpec:
        """Kind and size, as data (``str(cache.spec)`` names it)."""
        return CacheSpec(self.kind)

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def in_use(self) -> bool:
        return self._user.held

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    @contextmanager
    def use(self, info: Any, device: Any, positions: int, keep: bool = False) -> Iterator[Cache]:
        """Hold the cache for one generation of ``positions`` positions of the model ``info`` describes (its
        ``name`` and ``layout``) on ``device``, starting from an empty sequence; ``keep=True``: from the sequence it
        holds (a conversation's next turn; ``positions`` counts the held ones too). Every use counts in ``epoch``.
        Raises CacheStateError (disposed, in use, bound to another model or device) and CapacityError
        (``positions`` do not fit)."""
        self._check_alive()
        busy = CacheStateError(
            f"this {self.kind} cache is in use by another generation; a cache serves one "
            "generation at a time (make one cache per concurrent generation)"
        )
        with self._user.hold(lambda: busy):
            self._attach(info, device)
            if positions > info.context_length:
                raise CapacityError(
                    f"{positions} positions are needed but model {info.name} holds at most "
                    f"{info.context_length} (its context length: its rotary table ends there); "
                    "shorten the prompt or max_new_tokens"
                )
            self.check_capacity(positions)
            self._fits = positions
            if not keep:
                self._reset()
            self.epoch += 1
            self._allocate()
            yield self

    def _attach(self, info: Any, device: Any) -> None:
        """Serve this model on this device (a kind checks first what it cannot serve); the slots, at the first use."""
        mine = self._info
        if mine is not None and (mine.layout != info.layout or self._device is not device):
            raise CacheStateError(
                f"this cache is bound to model {mine.name} on {self._device.name} ({mine.layout})"
                f"; it cannot serve {info.name} on {device.name} ({info.layout}). Use a new cache."
            )
        if mine is None:
            self._hold([self._slot(entry, device) for entry in info.layout.entries])
        self._info, self._device = info, device

    def _slot(self, entry: Any, device: Any) -> Slot:
        """The slot that holds ``entry`` on ``device``: what makes a cache kind."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the sequence (the length goes to 0); CacheStateError while disposed or in use."""
        self._check_alive()
        if self._user.held:
            raise CacheStateError(f"cannot reset this {self.kind} cache while a generation is using it")
        self._reset()

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (0 <= n <= seq_length) and forget the rest, in every slot or in none: a
        growing KV slot keeps copies of its first ``n`` positions, a fixed one its buffer (later steps overwrite the
        rest); a state refuses, it cannot be rewound without a snapshot (``crop(0)`` starts it over). Raises
        ConfigError (``n`` out of range) and CacheStateError (disposed, in use by another thread, between a step's
        commit and its settle, a slot that cannot rewind); nothing changes then."""
        self._check_alive()
        n = check_int(n, "n", 0, self.seq_length, subject=f"crop({n!r}): n", note=" (the positions held)")
        if self._user.mine:  # inside this thread's own use
            self._crop_now(n)
            return
        with self._user.hold(lambda: CacheStateError(f"cannot crop this {self.kind} cache: another thread uses it")):
            self._crop_now(n)

    def _crop_now(self, n: int) -> None:
        if self._step == COMMITTED:
            raise CacheStateError("cannot crop in the middle of a step (between its commit and its settle)")
        if self._lost and n:
            raise CacheStateError(self._lost)
        if n < self.seq_length:
            self._crop(n)
        if not n:  # a sequence started over reads no state: what a failed step left in them is never read
            self._lost, self._step = "", ""

    def dispose(self) -> None:
        """Release every buffer. Idempotent; any later use is a CacheStateError (as is disposing while in use)."""
        if self._disposed:
            return
        if self._user.held:
            raise CacheStateError(f"cannot dispose this {self.kind} cache while a generation is using it")
        self._release_all()
        self._disposed = True
        self._seen.clear()

    def empty_like(self) -> Cache:
        """A new, empty cache of the same kind and size that can hand its sequence to this one (``receive``): the
        other side of a handoff (e.g. a CPU prefill)."""
        raise NotImplementedError

    def twin(self) -> Cache:
        """``empty_like()``, by the name it had first."""
        return self.empty_like()

    def receive(self, src: Cache) -> tuple[CacheStep, int]:
        """Take over the sequence ``src`` holds on another device (e.g. a CPU prefill): copy it into this cache.
        Returns the step's allocations and the bytes copied. On any failure nothing is half-copied: this cache stays
        empty (length 0) and reusable. Raises CacheStateError (outside ``use``, not empty, an empty or lost
        source), ConfigError (another kind, size or layout), DeviceError (no copy path), CapacityError."""
        self._check_alive()
        if not self._user.held:
            raise CacheStateError("receive() runs inside cache.use() (generate does it)")
        self._check_source(src)
        self._device.check_copy_from(src._device)
        self.check_capacity(src.seq_length)
        return self._receive(src)
