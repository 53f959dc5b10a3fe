"""The cache contract: what a generation loop may ask of a KV cache, and the lifecycle every cache shares.

Per step (the loop in ``kvlab.ort.stepper`` does exactly this):

1. ``binding(session, n_new)``: check that ``n_new`` more tokens fit (no side effects) and return the step's
   binding with every ``past_key_values.*`` input and ``present.*`` output bound;
2. the loop binds the token ids, the attention mask and the logits, and runs it;
3. ``commit(result, n_new)``: only after a successful run; checks what the runtime returned, then advances;
4. the loop records the step and calls its hooks; then ``settle()`` makes the step final, or, when a hook raised
   (Ctrl-C included), ``rollback(n_new)`` undoes the commit.
   A failed run, check or hook leaves the cache as it was before the step, so the step can be retried.

Lifecycle: ``use(info, device, needed)`` holds the cache for one generation (one at a time; capacity checked;
buffers allocated lazily, all or nothing); ``reset()`` forgets the sequence; ``dispose()`` releases everything,
once; ``receive(other)`` takes over a sequence another cache of the same kind holds on another device.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import CacheStateError, CapacityError, ConfigError
from .labels import CacheSpec
from .records import CacheStep


class Cache:
    """Shared lifecycle: attachment to one KV layout and device, one user at a time, reset, dispose."""

    kind = "cache"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._info: Any = None  # the model served: its name and KV layout (kvlab.ort.ModelInfo)
        self._device: Any = None
        self._disposed = False
        self._seen: set[int] = set()  # buffer identities this cache has held (new_buffers counts the others)
        self.seq_length = 0  # tokens held

    @property
    def spec(self) -> CacheSpec:
        """Kind and size, as data (``str(cache.spec)`` names it)."""
        return CacheSpec(self.kind)

    # -- lifecycle
    @contextmanager
    def use(self, info: Any, device: Any, needed: int) -> Iterator[Cache]:
        """Hold the cache for one generation of ``needed`` positions of the model ``info`` describes (its
        ``name`` and KV ``layout``) on ``device``, starting from an empty sequence. Raises CacheStateError (disposed,
        in use, bound to another model or device) and CapacityError (``needed`` does not fit)."""
        self._check_alive()
        if not self._lock.acquire(blocking=False):
            raise CacheStateError(
                f"this {self.kind} cache is in use by another generation; a cache serves one "
                "generation at a time (make one cache per concurrent generation)"
            )
        try:
            self._attach(info, device)
            if needed > info.context_length:
                raise CapacityError(
                    f"{needed} positions are needed but model {info.name} holds at most "
                    f"{info.context_length} (its context length: its rotary table ends there); "
                    "shorten the prompt or max_new_tokens"
                )
            self.check_capacity(needed)
            self._reset()
            self._allocate()
            yield self
        finally:
            self._lock.release()

    def _attach(self, info: Any, device: Any) -> None:
        mine = self._info
        if mine is not None and (mine.layout != info.layout or self._device is not device):
            raise CacheStateError(
                f"this cache is bound to model {mine.name} on {self._device.name} ({mine.layout})"
                f"; it cannot serve {info.name} on {device.name} ({info.layout}). Use a new cache."
            )
        self._info, self._device = info, device

    def _check_alive(self) -> None:
        if self._disposed:
            raise CacheStateError(f"this {self.kind} cache was disposed; create a new one")

    def reset(self) -> None:
        """Forget the sequence (the length goes to 0); CacheStateError while disposed or in use."""
        self._check_alive()
        if self._lock.locked():
            raise CacheStateError(f"cannot reset this {self.kind} cache while a generation is using it")
        self._reset()

    def dispose(self) -> None:
        """Release every buffer. Idempotent; any later use is a CacheStateError (as is disposing while in use)."""
        if self._disposed:
            return
        if self._lock.locked():
            raise CacheStateError(f"cannot dispose this {self.kind} cache while a generation is using it")
        self._release_all()
        self._disposed = True
        self._seen.clear()

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def device(self) -> Any:
        """The device the cache's tensors live on (None before its first use)."""
        return self._device

    @property
    def in_use(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    # -- what the cache holds
    @property
    def tensors(self) -> tuple[Any, ...]:
        """The KV tensors held now, in the model's past-input order (key, value per layer)."""
        raise NotImplementedError

    @property
    def live_bytes(self) -> int:
        """Bytes of cache tensors alive now (exact, as requested from the runtime)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def used_bytes(self) -> int:
        """Bytes the held tokens need: seq_length x bytes per token, plus one copy of each fixed-size state (conv,
        recurrent) once a sequence is held."""
        if self._info is None:
            return 0
        layout = self._info.layout
        return self.seq_length * layout.bytes_per_token + (layout.fixed_bytes if self.seq_length else 0)

    def held(self) -> list[tuple[Any, tuple[Any, ...]]]:
        """Each cache entry of the model (``kvlab.core.layout.CacheEntry``) with the tensor(s) holding it now."""
        raise NotImplementedError

    def held_bytes_by_layer(self) -> dict[int, int]:
        """Bytes of the tensors held now, per layer, summed from the tensors themselves (their runtime shapes)."""
        out: dict[int, int] = {}
        for entry, tensors in self.held():
            out[entry.layer] = out.get(entry.layer, 0) + sum(t.nbytes for t in tensors)
        return out

    def _count_new(self, tensors: Any) -> int:
        fresh = {t.data_ptr for t in tensors} - self._seen
        self._seen |= fresh
        return len(fresh)

    # -- the per-step contract (implemented by each cache kind)
    def check_capacity(self, needed: int) -> None:
        """Raise CapacityError when ``needed`` positions do not fit. No side effects."""

    def binding(self, session: Any, n_new: int) -> Any:
        raise NotImplementedError

    def commit(self, result: Any, n_new: int) -> CacheStep:
        raise NotImplementedError

    def settle(self) -> None:
        """The step the last commit advanced by is final: release what it replaced."""

    def rollback(self, n_new: int) -> None:
        """Undo the last commit (its step failed after it): the sequence is as it was before that step."""
        raise NotImplementedError

    def twin(self) -> Cache:
        """A new, empty cache of the same kind and size (e.g. the CPU side of a handoff)."""
        raise NotImplementedError

    def _allocate(self) -> None:
        pass

    def _reset(self) -> None:
        self.seq_length = 0

    def _release_all(self) -> None:
        raise NotImplementedError

    # -- cross-device handoff
    def receive(self, src: Cache) -> tuple[CacheStep, int]:
        """Take over the sequence ``src`` holds on another device (e.g. a CPU prefill): copy its KV into this
        cache. Returns the step's allocations and the bytes copied. On any failure nothing is half-copied: this
        cache stays empty (length 0) and reusable. Raises CacheStateError (outside ``use``, not empty, an empty
        source), ConfigError (another kind or layout), DeviceError (no copy path), CapacityError."""
        self._check_alive()
        if not self._lock.locked():
            raise CacheStateError("receive() runs inside cache.use() (generate does it)")
        if src.kind != self.kind:  # e.g. a captured static cache takes a plain one's (a CPU prefill)
            raise ConfigError(f"a {self.kind} cache cannot receive a {src.kind} cache's KV; use the same kind")
        if self.seq_length:
            raise CacheStateError(
                f"this cache already holds a sequence of {self.seq_length} tokens; a handoff "
                "needs an empty cache (reset it first)"
            )
        if not src.seq_length or src._info is None:
            raise CacheStateError("the source cache holds no sequence to hand off")
        theirs, mine = src._info, self._info
        if theirs.layout != mine.layout:
            raise ConfigError(
                f"cannot hand off KV of {theirs.name} on {src._device.name} ({theirs.layout}) to "
                f"{mine.name} on {self._device.name} ({mine.layout}): they must be equal"
            )
        self._device.check_copy_from(src._device)
        self.check_capacity(src.seq_length)
        step, copied = self._receive(src)
        self.seq_length = src.seq_length
        return step, copied

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        raise NotImplementedError
