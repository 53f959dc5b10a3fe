"""The two KV caches on ONNX Runtime: ``DynamicCache`` (the runtime allocates new presents every step) and
``StaticCache`` (every buffer allocated once and written in place). Both follow ``kvlab.core.cache.Cache``."""

from __future__ import annotations

import numpy as np

from ..core.atomic import atomic
from ..core.cache import Cache
from ..core.layout import MemoryReport, check_max_cache_len
from ..core.errors import CacheStateError, CapacityError, ConfigError, InPlaceError, ModelError, check_choice
from ..core.labels import CacheSpec
from ..core.records import CacheStep
from .device import Device, copy_tensor
from .models import ModelInfo
from .session import Binding, RunResult, Session
from .tensors import DeviceTensor


def zeros_all(device: Device, specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[DeviceTensor]:
    """One zero-filled tensor per (shape, dtype), all or nothing: on any failure every tensor made so far is
    released (also on Ctrl-C: each tensor is owned by the list from the moment it exists)."""
    made: list[DeviceTensor] = []
    try:
        for shape, dtype in specs:
            with atomic():
                made.append(device.zeros(shape, dtype))
    except BaseException:
        release_all(made)
        raise
    return made


def release_all(tensors: list[DeviceTensor]) -> None:
    for t in tensors:
        t.release()


class DynamicCache(Cache):
    """The runtime allocates new ``present.*`` tensors every step (one token longer: a full copy of the past)
    and the previous ones are released, as transformers.js does by default. Past tensors stay on the device
    between steps (no host round trip), so the churn measured is the runtime's real one."""

    kind = "dynamic"

    def __init__(self) -> None:
        super().__init__()
        self._presents: list[DeviceTensor] = []  # past for the next step, in kv_inputs order
        self._previous: list[DeviceTensor] = []  # the presents the last commit replaced, until it settles

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        return tuple(self._presents)

    def twin(self) -> "DynamicCache":
        return DynamicCache()

    def binding(self, session: Session, n_new: int) -> Binding:
        self._check_alive()
        info: ModelInfo = self._info
        b = session.binding()
        empty = np.zeros(info.layout.tensor_shape(0), info.dtype) if not self._presents else None
        for i, name in enumerate(info.kv_inputs):
            b.input(name, self._presents[i] if self._presents else empty)
        for name in info.kv_outputs:
            b.output_new(name)
        return b

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        """Takes the presents out of ``result`` (what it leaves there is the caller's to release); the ones they
        replace are kept until the step settles."""
        self.settle()  # a step committed and never settled (its loop stopped between the two) is final
        names = self._info.kv_outputs
        want = self._info.layout.tensor_shape(self.seq_length + n_new)
        bad = [(n, result.new[n].shape) for n in names if result.new[n].shape != want]
        if bad:
            raise InPlaceError(f"present {bad[0][0]} came back with shape {bad[0][1]}, expected {want}")
        with atomic():
            self._previous, self._presents = self._presents, [result.new.pop(n) for n in names]
            self.seq_length += n_new
        new = self._presents
        return CacheStep(len(new), sum(t.nbytes for t in new), self._count_new(new), self.live_bytes)

    def settle(self) -> None:
        with atomic():
            release_all(self._previous)
            self._previous = []

    def rollback(self, n_new: int) -> None:
        with atomic():
            release_all(self._presents)
            self._presents, self._previous = self._previous, []
            self.seq_length -= n_new

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        """The copied presents become the first past on this device."""
        made = zeros_all(self._device, [(t.shape, t.dtype) for t in src.tensors])
        try:
            for s_buf, d_buf in zip(src.tensors, made):
                copy_tensor(s_buf, d_buf)
        except BaseException:
            release_all(made)
            raise
        self._presents = made
        copied = sum(t.nbytes for t in made)
        return CacheStep(len(made), copied, self._count_new(made), self.live_bytes), copied

    def _reset(self) -> None:
        self._release_all()
        super()._reset()

    def _release_all(self) -> None:
        release_all(self._presents + self._previous)
        self._presents, self._previous = [], []


class StaticCache(Cache):
    """Every KV buffer allocated once, [1, kv_heads, max_cache_len, head_dim], and bound both as the
    ``past_key_values.*`` input and the ``present.*`` output: GroupQueryAttention writes the new tokens in
    place. Zero allocation per step and fixed shapes (what graph capture needs)."""

    kind = "static"

    def __init__(self, max_cache_len: int, check_every: int = 1):
        super().__init__()
        self.max_cache_len = check_max_cache_len(max_cache_len)
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ConfigError(f"check_every={check_every!r} must be a positive int (1: check every step)")
        self.check_every = check_every  # read back the presents' buffers every this many steps (see commit)
        self._runs = 0
        self._buffers: list[DeviceTensor] = []  # in kv_inputs order; present i is the same buffer
        self._bindings: dict[int, Binding] = {}  # id(session) -> binding with the buffers bound once
        self._expected: dict[str, int] = {}  # present output -> the data_ptr of the buffer it must be written into
        self._allocated_this_use: CacheStep | None = None
        self._last_step: CacheStep | None = None  # what the last commit reported (a rollback reports it again)

    @property
    def spec(self) -> CacheSpec:
        variant = f"checked/{self.check_every}" if self.check_every > 1 else ""
        return CacheSpec(self.kind, self.max_cache_len, variant)

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        return tuple(self._buffers)

    @property
    def allocated(self) -> bool:
        return bool(self._buffers)

    def twin(self) -> "StaticCache":
        return StaticCache(self.max_cache_len, self.check_every)

    def memory_report(self, info: ModelInfo) -> MemoryReport:
        """Memory this cache will reserve for a model, known before allocating anything."""
        layout = info.layout
        return MemoryReport(self.max_cache_len, layout.bytes_per_token, layout.bytes_per_token * self.max_cache_len,
                            layout.tensors, layout.tensor_shape(self.max_cache_len))

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
        layout = self._info.layout
        made = zeros_all(self._device, [(layout.tensor_shape(self.max_cache_len), layout.dtype)] * layout.tensors)
        self._buffers = made
        self._expected = {name: t.data_ptr for name, t in zip(self._info.kv_outputs, made)}  # present -> its buffer
        self._steady = CacheStep(live_bytes=self.live_bytes)  # what every later step does to memory: nothing
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
            for past, present, buf in zip(self._info.kv_inputs, self._info.kv_outputs, self._buffers):
                b.input(past, buf)
                b.output(present, buf)
            self._bindings[id(session)] = b
        b.read_back = self._runs % self.check_every == 0
        return b

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        """Checks that the runtime returned every present in the buffer bound for it (ONNX Runtime writes a
        pre-bound output in place or fails the run; this verifies it), then advances. With ``check_every`` > 1 only
        every that many-th run is read back: reading 2 x layers buffer identities costs ~0.1-0.2 ms a step."""
        returned = result.returned_ptrs
        self._runs += 1
        if returned is not None and not self._expected.items() <= returned.items():  # one C comparison
            name = next(n for n, ptr in self._expected.items() if returned.get(n) != ptr)
            raise InPlaceError(f"{name} was not written in place: the runtime returned buffer "
                               f"{returned.get(name) or 0:#x}, the cache bound {self._expected[name]:#x}; the cache "
                               f"length stays {self.seq_length}")
        with atomic():
            self.seq_length += n_new
            step, self._allocated_this_use = self._allocated_this_use, None
            self._last_step = step
        return step or self._steady

    def rollback(self, n_new: int) -> None:
        with atomic():
            self.seq_length -= n_new
            self._allocated_this_use, self._last_step = self._last_step, None

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        """One whole-tensor copy per buffer: the source is a static cache of the same max_cache_len."""
        if src.max_cache_len != self.max_cache_len:
            raise ConfigError(f"the source static cache has max_cache_len={src.max_cache_len}, this one "
                              f"{self.max_cache_len}: whole-buffer copies need equal sizes")
        for s_buf, d_buf in zip(src.tensors, self._buffers):
            copy_tensor(s_buf, d_buf)  # a failure leaves seq_length 0: stale bytes are never read
        step, self._allocated_this_use = self._allocated_this_use, None
        return step or self._steady, sum(t.nbytes for t in self._buffers)

    def _release_all(self) -> None:
        self._bindings.clear()
        release_all(self._buffers)
        self._buffers = []
        self.seq_length = 0


CACHE_KINDS = {"dynamic": DynamicCache, "static": StaticCache}


def make_cache(spec: str | CacheSpec, max_cache_len: int | None = None) -> Cache:
    """A cache by kind ("dynamic" or "static"; static needs max_cache_len) or by its ``CacheSpec``."""
    if isinstance(spec, CacheSpec):
        spec, max_cache_len = spec.kind, spec.max_cache_len
    check_choice(spec, CACHE_KINDS, "cache type ")
    if spec == "static":
        if max_cache_len is None:
            raise ConfigError("a static cache needs max_cache_len (a positive int)")
        return StaticCache(max_cache_len)
    return DynamicCache()
