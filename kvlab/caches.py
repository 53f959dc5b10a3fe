"""KV caches for the generation loop: ``DynamicCache`` and ``StaticCache``.

The contract the loop uses, per step (names as in the code):

1. ``binding(session, n_new)``: check the step fits (no side effects), return a ``Binding`` with every
   ``past_key_values.*`` input and ``present.*`` output bound.
2. the loop binds ``input_ids``, ``attention_mask`` and ``logits``, and runs it.
3. ``commit(result, n_new)``: only after a successful run; checks what the runtime returned, then advances.
   A failed run (or a failed check) leaves the length unchanged, so the step can be retried.

Lifecycle: ``use(model, device, needed)`` holds the cache for one generation (one at a time; capacity checked,
buffers allocated lazily, all or nothing); ``reset()`` forgets the sequence; ``dispose()`` releases everything.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .errors import CacheStateError, CapacityError, ConfigError, InPlaceError, ModelError
from .models import ModelInfo
from .runtime import Binding, Device, DeviceTensor, RunResult, Session, check_copy_path, copy_tensor


@dataclass(frozen=True)
class CacheStep:
    """What one step did to the cache's memory (see kvlab.instrument.COLUMNS for exactness)."""

    allocated_tensors: int  # cache tensors created this step (by the runtime, or by kvlab's lazy allocation)
    allocated_bytes: int  # their bytes, as requested
    new_buffers: int  # of those, buffers whose identity (data_ptr) this cache had never seen
    live_bytes: int  # bytes of cache tensors alive after the step


@dataclass(frozen=True)
class MemoryReport:
    max_cache_len: int
    bytes_per_token: int
    total_bytes: int
    tensors: int
    tensor_shape: tuple[int, ...]

    def __str__(self) -> str:
        return (f"StaticCache: {self.tensors} tensors of {list(self.tensor_shape)}, {self.bytes_per_token:,} bytes "
                f"per token, {self.total_bytes / 2**20:,.1f} MiB at max_cache_len={self.max_cache_len}")


class Cache:
    """Shared lifecycle: attachment to one model layout and device, one user at a time, dispose."""

    kind = "cache"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._info: ModelInfo | None = None
        self._device: Device | None = None
        self._disposed = False
        self._seen: set[int] = set()
        self.seq_length = 0  # tokens held

    # -- lifecycle
    @contextmanager
    def use(self, info: ModelInfo, device: Device, needed: int) -> Iterator["Cache"]:
        """Hold the cache for one generation of ``needed`` positions, starting from an empty sequence."""
        self._check_alive()
        if not self._lock.acquire(blocking=False):
            raise CacheStateError(f"this {self.kind} cache is in use by another generation; a cache serves one "
                                  "generation at a time (make one cache per concurrent generation)")
        try:
            self._attach(info, device)
            self.check_capacity(needed)
            self._reset()
            self._allocate()
            yield self
        finally:
            self._lock.release()

    def _attach(self, info: ModelInfo, device: Device) -> None:
        layout = self._layout(info)
        if self._info is not None:
            mine = self._layout(self._info)
            if mine != layout or self._device is not device:
                raise CacheStateError(f"this cache is bound to model {self._info.name} on {self._device.name} "
                                      f"(layers, kv heads, head dim, dtype = {mine}); it cannot serve {info.name} on "
                                      f"{device.name} {layout}. Use a new cache.")
        self._info, self._device = info, device

    def _check_alive(self) -> None:
        if self._disposed:
            raise CacheStateError(f"this {self.kind} cache was disposed; create a new one")

    def _check_idle(self, action: str) -> None:
        self._check_alive()
        if self._lock.locked():
            raise CacheStateError(f"cannot {action} this {self.kind} cache while a generation is using it")

    def reset(self) -> None:
        """Forget the sequence (the length goes to 0)."""
        self._check_idle("reset")
        self._reset()

    def dispose(self) -> None:
        """Release every buffer. Idempotent; any later use is an error."""
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

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    # -- the per-step contract (implemented by subclasses)
    def check_capacity(self, needed: int) -> None:
        """Raise CapacityError when ``needed`` positions do not fit. No side effects."""

    def binding(self, session: Session, n_new: int) -> Binding:
        raise NotImplementedError

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        raise NotImplementedError

    @property
    def live_bytes(self) -> int:
        """Bytes of cache tensors alive now (exact, as requested from the runtime)."""
        raise NotImplementedError

    @property
    def used_bytes(self) -> int:
        """Bytes the held tokens need (seq_length x bytes per token)."""
        return self.seq_length * (self._info.bytes_per_token if self._info else 0)

    def _allocate(self) -> None:
        pass

    def _reset(self) -> None:
        self.seq_length = 0

    def _release_all(self) -> None:
        raise NotImplementedError

    def _count_new(self, tensors: list[DeviceTensor]) -> int:
        fresh = {t.data_ptr for t in tensors} - self._seen
        self._seen |= fresh
        return len(fresh)

    # -- cross-device handoff
    def receive(self, src: "Cache") -> tuple[CacheStep, int]:
        """Take over the sequence ``src`` holds on another device (e.g. a CPU prefill): copy its KV into this
        cache. Returns the step's allocations and the bytes copied. On any failure nothing is half-copied: this
        cache stays empty (length 0) and reusable."""
        self._check_alive()
        if not self._lock.locked():
            raise CacheStateError("receive() runs inside cache.use() (generate does it)")
        if type(src) is not type(self):
            raise ConfigError(f"a {self.kind} cache cannot receive a {src.kind} cache's KV; use the same kind")
        if self.seq_length:
            raise CacheStateError(f"this cache already holds a sequence of {self.seq_length} tokens; a handoff "
                                  "needs an empty cache (reset it first)")
        if not src.seq_length or src._info is None or src._device is None:
            raise CacheStateError("the source cache holds no sequence to hand off")
        assert self._info is not None and self._device is not None
        mine, theirs = self._layout(self._info), self._layout(src._info)
        if mine != theirs:
            raise ConfigError(f"cannot hand off KV of {src._info.name} on {src._device.name} (layers, kv heads, head "
                              f"dim, dtype = {theirs}) to {self._info.name} on {self._device.name} ({mine}): they "
                              "must be equal")
        check_copy_path(src._device, self._device)
        self.check_capacity(src.seq_length)
        step, copied = self._receive(src)
        self.seq_length = src.seq_length
        return step, copied

    @staticmethod
    def _layout(info: ModelInfo) -> tuple:
        return (info.num_layers, info.num_kv_heads, info.head_dim, np.dtype(info.dtype).name)

    def _receive(self, src: "Cache") -> tuple[CacheStep, int]:
        raise NotImplementedError

    def twin(self) -> "Cache":
        """A new, empty cache of the same kind and size (e.g. the CPU side of a handoff)."""
        raise NotImplementedError

    def _names(self) -> tuple[list[str], list[str]]:
        info = self._info
        assert info is not None
        return ([n for pair in info.past_names for n in pair], [n for pair in info.present_names for n in pair])

    def _step_shape(self, length: int) -> tuple[int, int, int, int]:
        info = self._info
        assert info is not None
        return (1, info.num_kv_heads, length, info.head_dim)


class DynamicCache(Cache):
    """The runtime allocates new ``present.*`` tensors every step (one token longer: a full copy of the past)
    and the previous ones are released, as transformers.js does by default. Past tensors stay on the device
    between steps (no host round trip), so the churn measured is the runtime's real one."""

    kind = "dynamic"

    def __init__(self) -> None:
        super().__init__()
        self._presents: list[DeviceTensor] = []  # past for the next step, in past_names order

    def twin(self) -> "DynamicCache":
        return DynamicCache()

    def binding(self, session: Session, n_new: int) -> Binding:
        self._check_alive()
        past_names, present_names = self._names()
        b = session.binding()
        empty = np.zeros(self._step_shape(0), self._info.dtype) if not self._presents else None
        for i, name in enumerate(past_names):
            b.input(name, self._presents[i] if self._presents else empty)
        for name in present_names:
            b.output_new(name)
        return b

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        _, present_names = self._names()
        new = [result.new[n] for n in present_names]
        want = self._step_shape(self.seq_length + n_new)
        bad = [(n, t.shape) for n, t in zip(present_names, new) if t.shape != want]
        if bad:
            for t in new:
                t.release()
            raise InPlaceError(f"present {bad[0][0]} came back with shape {bad[0][1]}, expected {want}")
        for t in self._presents:
            t.release()
        self._presents = new
        self.seq_length += n_new
        return CacheStep(len(new), sum(t.nbytes for t in new), self._count_new(new), self.live_bytes)

    @property
    def live_bytes(self) -> int:
        return sum(t.nbytes for t in self._presents)

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        """The copied presents become the first past on this device."""
        assert isinstance(src, DynamicCache) and self._device is not None
        made: list[DeviceTensor] = []
        try:
            for t in src._presents:
                made.append(self._device.zeros(t.shape, t.dtype))
                copy_tensor(t, made[-1])
        except BaseException:
            for t in made:
                t.release()
            raise
        self._presents = made
        return CacheStep(len(made), sum(t.nbytes for t in made), self._count_new(made), self.live_bytes), \
            sum(t.nbytes for t in made)

    def _reset(self) -> None:
        self._release_all()
        super()._reset()

    def _release_all(self) -> None:
        for t in self._presents:
            t.release()
        self._presents = []


def check_max_cache_len(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"max_cache_len={value!r} ({type(value).__name__}) must be a positive int")
    if value <= 0:
        raise ConfigError(f"max_cache_len={value} must be a positive int (>= 1)")
    return int(value)


class StaticCache(Cache):
    """Every KV buffer allocated once, [1, kv_heads, max_cache_len, head_dim], and bound both as the
    ``past_key_values.*`` input and the ``present.*`` output: GroupQueryAttention writes the new tokens in
    place. Zero allocation per step and fixed shapes (what graph capture needs)."""

    kind = "static"

    def __init__(self, max_cache_len: int):
        super().__init__()
        self.max_cache_len = check_max_cache_len(max_cache_len)
        self._buffers: list[DeviceTensor] = []  # in past_names order; present i is the same buffer
        self._bindings: dict[int, Binding] = {}  # id(session) -> binding with the buffers bound once
        self._allocated_this_use: CacheStep | None = None

    @property
    def allocated(self) -> bool:
        return bool(self._buffers)

    def twin(self) -> "StaticCache":
        return StaticCache(self.max_cache_len)

    def memory_report(self, info: ModelInfo) -> MemoryReport:
        """Memory this cache will reserve for a model, known before allocating anything."""
        shape = (1, info.num_kv_heads, self.max_cache_len, info.head_dim)
        return MemoryReport(self.max_cache_len, info.bytes_per_token, info.bytes_per_token * self.max_cache_len,
                            2 * info.num_layers, shape)

    def _attach(self, info: ModelInfo, device: Device) -> None:
        if not info.shares_buffers:
            raise ModelError(f"StaticCache cannot use model {info.name}: {info.sharing_problem}")
        if self.max_cache_len > info.context_length:
            raise ConfigError(f"max_cache_len={self.max_cache_len} is larger than model {info.name}'s context "
                              f"length {info.context_length}; use at most {info.context_length}")
        super()._attach(info, device)

    def check_capacity(self, needed: int) -> None:
        if needed > self.max_cache_len:
            raise CapacityError(f"{needed} positions are needed but max_cache_len is {self.max_cache_len}; "
                                f"use StaticCache(max_cache_len>={needed}) or shorten the prompt or max_new_tokens")

    def _allocate(self) -> None:
        """All or nothing: on any failure every buffer made so far is released and the cache stays unallocated."""
        if self._buffers:
            self._allocated_this_use = None
            return
        assert self._info is not None and self._device is not None
        shape, made = self._step_shape(self.max_cache_len), []
        try:
            for _ in range(2 * self._info.num_layers):
                made.append(self._device.zeros(shape, self._info.dtype))
        except BaseException:
            for t in made:
                t.release()
            raise
        self._buffers = made
        self._allocated_this_use = CacheStep(len(made), sum(t.nbytes for t in made), self._count_new(made),
                                             self.live_bytes)

    def binding(self, session: Session, n_new: int) -> Binding:
        self._check_alive()
        if not self._buffers:
            raise CacheStateError("the static cache has no buffers: use it through generate() / cache.use()")
        self.check_capacity(self.seq_length + n_new)
        b = self._bindings.get(id(session))
        if b is None:  # bind the buffers once; later steps rebind only ids, mask and logits
            b = session.binding()
            past_names, present_names = self._names()
            for past, present, buf in zip(past_names, present_names, self._buffers):
                b.input(past, buf)
                b.output(present, buf)
            self._bindings[id(session)] = b
        return b

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        _, present_names = self._names()
        for name, buf in zip(present_names, self._buffers):
            got = result.returned_ptrs.get(name)
            if got != buf.data_ptr:
                raise InPlaceError(f"{name} was not written in place: the runtime returned buffer {got:#x}, "
                                   f"the cache bound {buf.data_ptr:#x}; the cache length stays {self.seq_length}")
        self.seq_length += n_new
        step, self._allocated_this_use = self._allocated_this_use, None
        return step or CacheStep(0, 0, 0, self.live_bytes)

    @property
    def live_bytes(self) -> int:
        return sum(t.nbytes for t in self._buffers)

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        """One whole-tensor copy per buffer: the source is a static cache of the same max_cache_len."""
        assert isinstance(src, StaticCache)
        if src.max_cache_len != self.max_cache_len:
            raise ConfigError(f"the source static cache has max_cache_len={src.max_cache_len}, this one "
                              f"{self.max_cache_len}: whole-buffer copies need equal sizes")
        for s_buf, d_buf in zip(src._buffers, self._buffers):
            copy_tensor(s_buf, d_buf)  # a failure leaves seq_length 0: stale bytes are never read
        step, self._allocated_this_use = self._allocated_this_use, None
        return step or CacheStep(0, 0, 0, self.live_bytes), sum(t.nbytes for t in self._buffers)

    def _release_all(self) -> None:
        self._bindings.clear()
        for t in self._buffers:
            t.release()
        self._buffers = []
        self.seq_length = 0


CACHE_TYPES = {"dynamic": DynamicCache, "static": StaticCache}


def make_cache(kind: str, max_cache_len: int | None = None) -> Cache:
    """A cache by name ("dynamic" or "static"; static needs max_cache_len)."""
    if kind not in CACHE_TYPES:
        raise ConfigError(f"cache type {kind!r} is not valid; choose one of {tuple(CACHE_TYPES)}")
    if kind == "static":
        if max_cache_len is None:
            raise ConfigError("a static cache needs max_cache_len (a positive int)")
        return StaticCache(max_cache_len)
    return DynamicCache()
