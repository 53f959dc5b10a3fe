"""The two KV caches on ONNX Runtime: ``DynamicCache`` (the runtime allocates new presents every step) and
``StaticCache`` (every buffer allocated once and written in place). Both follow ``kvlab.core.cache.Cache``.

Both hold every past/present pair of the graph (``ModelInfo.entries``): keys and values that grow by one position
per token (full attention, and sliding windows, whose buffer holds every position: GroupQueryAttention has no ring
buffer), and fixed-size states (conv, recurrent) that are rewritten every step. A StaticCache writes a state into
the second of two buffers and swaps them at the commit (``states="swap"``, every EP; a failed step leaves the first
untouched), or into the one buffer it reads (``states="in-place"``: the CPU EP, and WebGPU where the backend allows
it, ``Backend.webgpu_states_in_place``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.atomic import atomic
from ..core.cache import Cache
from ..core.errors import CacheStateError, CapacityError, ConfigError, InPlaceError, ModelError, check_choice
from ..core.labels import CacheSpec
from ..core.layout import CacheEntry, MemoryReport, check_max_cache_len
from ..core.records import CacheStep
from .device import Device, copy_tensor
from .models import ModelInfo
from .session import Binding, RunResult, Session
from .tensors import DeviceTensor


def zeros_all(device: Device, specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[DeviceTensor]:
    """One zero-filled tensor per (shape, dtype) on ``device``, all or nothing: on any failure (re-raised) every
    tensor made so far is released (also on Ctrl-C: each tensor is owned by the list from the moment it exists)."""
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
    """Release every tensor of the list (each at most once)."""
    for t in tensors:
        t.release()


class OrtCache(Cache):
    """A cache whose steps run on ONNX Runtime."""

    def session(self, device: Device, model: Any) -> Session:
        """The session this cache's steps run on: the device's session of the model, by default; a cache that
        needs a session of its own (graph capture opens one with other options) says so here."""
        return device.session(model.onnx_path, f"model {model.name}")


class DynamicCache(OrtCache):
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

    def twin(self) -> DynamicCache:
        return DynamicCache()

    def held(self) -> list[tuple[CacheEntry, tuple[DeviceTensor, ...]]]:
        """Each entry of the model and the tensor holding it now (the last step's present)."""
        return [(e, (t,)) for e, t in zip(self._info.entries, self._presents)] if self._info else []

    def binding(self, session: Session, n_new: int) -> Binding:
        self._check_alive()
        info: ModelInfo = self._info
        b = session.binding()
        if self._presents:
            for name, present in zip(info.kv_inputs, self._presents):
                b.input(name, present)
        else:  # the first step: empty keys and values, zero states
            for name, empty in zip(info.kv_inputs, _first_pasts(info)):
                b.input(name, empty)
        for name in info.kv_outputs:
            b.output_new(name)
        return b

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        """Takes the presents out of ``result`` (what it leaves there is the caller's to release); the ones they
        replace are kept until the step settles."""
        self.settle()  # a step committed and never settled (its loop stopped between the two) is final
        info: ModelInfo = self._info
        names, length = info.kv_outputs, self.seq_length + n_new
        if info.layout.uniform:
            want = info.layout.tensor_shape(length)
            bad = [(n, result.new[n].shape, want) for n in names if result.new[n].shape != want]
        else:  # keys and values one step longer, states as they were
            bad = [
                (n, result.new[n].shape, e.shape(length))
                for n, e in zip(names, info.entries)
                if result.new[n].shape != e.shape(length)
            ]
        if bad:
            raise InPlaceError(f"present {bad[0][0]} came back with shape {bad[0][1]}, expected {bad[0][2]}")
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


def _first_pasts(info: ModelInfo) -> list[np.ndarray]:
    """What the first step reads as its past: keys and values of length 0, states of zeros (one host array per
    distinct shape)."""
    made: dict[tuple, np.ndarray] = {}
    return [made.setdefault((e.shape(0), e.dtype), np.zeros(e.shape(0), e.dtype)) for e in info.entries]


STATE_MODES = ("swap", "in-place")
WEBGPU_IN_PLACE = (
    "onnxruntime-webgpu 1.27 rejects a state bound as both input and output of a run ('WebGPU "
    "validation failed. [Buffer (unlabeled)] usage (Storage(read-write)|Storage(read-only)) includes "
    "writable usage and another usage in the same synchronization scope', measured on "
    "CausalConvWithState and LinearAttention)"
)


class StaticCache(OrtCache):
    """Every KV buffer allocated once, [1, kv_heads, max_cache_len, head_dim], and bound both as the
    ``past_key_values.*`` input and the ``present.*`` output: GroupQueryAttention writes the new tokens in
    place. Zero allocation per step and fixed shapes (what graph capture needs).

    Fixed-size states (conv, recurrent) are allocated once too. ``states="swap"`` (default): two buffers per
    state, one read and the other written, their roles swapped at each commit; a step that fails leaves the state
    it read untouched, so it can be retried or rolled back, on every EP. ``states="in-place"`` (the CPU EP, and
    WebGPU where ``Backend.webgpu_states_in_place``): one buffer, read and written by the same run (half the state
    memory); a step that fails after its run has overwritten the state, which cannot be undone: the cache then
    refuses to go on (CacheStateError) until it is reset.

    ``check_every``: read back the presents' buffer identities every this many steps (1: every step). Raises
    ConfigError for a bad argument, or when the model or device cannot serve it; ModelError for a model whose
    presents cannot share a buffer; CapacityError when a step does not fit ``max_cache_len``; InPlaceError when the
    runtime wrote a present elsewhere."""

    kind = "static"

    def __init__(self, max_cache_len: int, check_every: int = 1, states: str = "swap"):
        super().__init__()
        self.max_cache_len = check_max_cache_len(max_cache_len)
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ConfigError(f"check_every={check_every!r} must be a positive int (1: check every step)")
        check_choice(states, STATE_MODES, "states=")
        self.check_every = check_every  # read back the presents' buffers every this many steps (see commit)
        self.states = states
        self._runs = 0
        self._buffers: list[DeviceTensor] = []  # in kv_inputs order; present i is the same buffer (states: below)
        self._bindings: dict[Any, Binding] = {}  # id(session) (states: + the phase) -> binding, buffers bound once
        self._expected: dict[str, int] = {}  # present output -> the data_ptr of the buffer it must be written into
        self._allocated_this_use: CacheStep | None = None
        self._last_step: CacheStep | None = None  # what the last commit reported (a rollback reports it again)
        # fixed-size states: entry index -> its buffers ((read, written) alternate: swap; one buffer: in-place)
        self._state_buffers: dict[int, list[DeviceTensor]] = {}
        self._current = 0  # swap: which buffer of each pair holds the state the next step reads
        self._expected_by: dict[Any, dict[str, int]] = {}  # binding key -> its _expected
        self._unsettled = False  # in-place: a binding was handed out and its step has not committed (yet)
        self._lost = ""  # in-place: why the states no longer match seq_length (until reset)

    @property
    def spec(self) -> CacheSpec:
        variant = f"checked/{self.check_every}" if self.check_every > 1 else ""
        if self.states != "swap":
            variant = "+".join(filter(None, [variant, f"states-{self.states}"]))
        return CacheSpec(self.kind, self.max_cache_len, variant)

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        """Every buffer held: keys and values in kv_inputs order, then each state's buffer(s)."""
        return tuple(self._buffers) + tuple(t for pair in self._state_buffers.values() for t in pair)

    @property
    def allocated(self) -> bool:
        return bool(self._buffers or self._state_buffers)

    def twin(self) -> StaticCache:
        return StaticCache(self.max_cache_len, self.check_every, self.states)

    def held(self) -> list[tuple[CacheEntry, tuple[DeviceTensor, ...]]]:
        """Each entry of the model and the buffer(s) holding it (a swapped state: both)."""
        if self._info is None or not self.allocated:
            return []
        kv = iter(self._buffers)
        return [
            (e, (next(kv),) if e.grows or not self._state_buffers else tuple(self._state_buffers[i]))
            for i, e in enumerate(self._info.entries)
        ]

    @property
    def state_copies(self) -> int:
        return 2 if self.states == "swap" else 1

    def memory_report(self, info: ModelInfo) -> MemoryReport:
        """Memory this cache will reserve for a model, per layer, known before allocating anything."""
        return info.layout.report(self.max_cache_len, self.state_copies)

    def _attach(self, info: ModelInfo, device: Device) -> None:
        if not info.shares_buffers:
            raise ModelError(f"StaticCache cannot use model {info.name}: {info.sharing_problem}")
        if self.max_cache_len > info.context_length:
            raise ConfigError(
                f"max_cache_len={self.max_cache_len} is larger than model {info.name}'s context "
                f"length {info.context_length}; use at most {info.context_length}"
            )
        if (
            self.states == "in-place"
            and device.name == "webgpu"
            and info.layout.states
            and not device.backend.webgpu_states_in_place
        ):
            raise ConfigError(
                f"StaticCache(states='in-place') cannot run model {info.name}'s states on WebGPU: "
                f"{WEBGPU_IN_PLACE}; use states='swap' (the default)"
            )
        super()._attach(info, device)

    def check_capacity(self, needed: int) -> None:
        if needed > self.max_cache_len:
            raise CapacityError(
                f"{needed} positions are needed but max_cache_len is {self.max_cache_len}; "
                f"use StaticCache(max_cache_len>={needed}) or shorten the prompt or max_new_tokens"
            )

    def _allocate(self) -> None:
        """All or nothing: on any failure every buffer made so far is released and the cache stays unallocated."""
        if self.allocated:
            self._allocated_this_use = None
            return
        info: ModelInfo = self._info
        layout = info.layout
        if layout.uniform:
            specs = [(layout.tensor_shape(self.max_cache_len), layout.dtype)] * layout.tensors
        else:  # growing entries at max_cache_len, then each state's buffer(s)
            states = [i for i, e in enumerate(layout.entries) if not e.grows]
            specs = [(e.shape(self.max_cache_len), e.dtype) for e in layout.entries if e.grows]
            specs += [
                (layout.entries[i].dims, layout.entries[i].dtype) for i in states for _ in range(self.state_copies)
            ]
        made = zeros_all(self._device, specs)
        if layout.uniform:
            self._buffers = made
            self._expected = {name: t.data_ptr for name, t in zip(info.kv_outputs, made)}  # present -> its buffer
        else:
            kv = sum(1 for e in layout.entries if e.grows)
            self._buffers = made[:kv]
            copies = self.state_copies
            self._state_buffers = {i: made[kv + k * copies : kv + (k + 1) * copies] for k, i in enumerate(states)}
            self._expected = {}
        self._steady = CacheStep(live_bytes=self.live_bytes)  # what every later step does to memory: nothing
        self._allocated_this_use = CacheStep(
            len(made), sum(t.nbytes for t in made), self._count_new(made), self.live_bytes
        )

    def binding(self, session: Session, n_new: int) -> Binding:
        self._check_alive()
        if not self.allocated:
            raise CacheStateError("the static cache has no buffers: use it through generate() / cache.use()")
        self.check_capacity(self.seq_length + n_new)
        if self._state_buffers:
            return self._state_binding(session)
        b = self._bindings.get(id(session))
        if b is None:  # bind the buffers once; later steps rebind only ids, mask and logits
            b = session.binding()
            for past, present, buf in zip(self._info.kv_inputs, self._info.kv_outputs, self._buffers):
                b.input(past, buf)
                b.output(present, buf)
            self._bindings[id(session)] = b
        b.read_back = self._runs % self.check_every == 0
        return b

    def _state_binding(self, session: Session) -> Binding:
        """A model with states: one binding per phase (the first step reads zero states; later ones read buffer
        ``_current`` and write the other, or the same one in place), each bound once."""
        if self._lost:
            raise CacheStateError(self._lost)
        if self._unsettled:  # in-place: the last binding ran (or may have) without a commit
            self._lost = self._lost_because(
                "a step failed after binding its states in place (its run may have overwritten them)"
            )
            raise CacheStateError(self._lost)
        key = (id(session), self.seq_length == 0, self._current)
        b = self._bindings.get(key)
        if b is None:
            b, self._expected_by[key] = self._bind_states(session, first=key[1])
            self._bindings[key] = b
        self._expected = self._expected_by[key]
        self._unsettled = self.states == "in-place"
        b.read_back = self._runs % self.check_every == 0
        return b

    def _bind_states(self, session: Session, first: bool) -> tuple[Binding, dict[str, int]]:
        info: ModelInfo = self._info
        b, expected = session.binding(), {}
        kv = iter(self._buffers)
        zeros = _first_pasts(info)
        for i, e in enumerate(info.entries):
            if e.grows:
                buf = next(kv)
                b.input(e.past, buf)
                b.output(e.present, buf)
                expected[e.present] = buf.data_ptr
                continue
            pair = self._state_buffers[i]
            read, written = (pair[self._current], pair[1 - self._current]) if len(pair) == 2 else (pair[0], pair[0])
            b.input(e.past, zeros[i] if first else read)
            b.output(e.present, written)
            expected[e.present] = written.data_ptr
        return b, expected

    def _lost_because(self, why: str) -> str:
        return (
            f"this static cache's states were updated in place and no longer match its {self.seq_length} "
            f"tokens: {why}; that cannot be undone. Reset the cache (generate() does) or use "
            "StaticCache(states='swap'), whose failed steps leave the states as they were"
        )

    def commit(self, result: RunResult, n_new: int) -> CacheStep:
        """Checks that the runtime returned every present in the buffer bound for it (ONNX Runtime writes a
        pre-bound output in place or fails the run; this verifies it; InPlaceError otherwise), then advances. With
        ``check_every`` > 1 only every that many-th run is read back: reading 2 x layers buffer identities is a
        measurable part of a step's Python time (data/gpu/README.md)."""
        returned = result.returned_ptrs
        self._runs += 1
        if returned is not None and not self._expected.items() <= returned.items():  # one C comparison
            name = next(n for n, ptr in self._expected.items() if returned.get(n) != ptr)
            raise InPlaceError(
                f"{name} was not written in place: the runtime returned buffer "
                f"{returned.get(name) or 0:#x}, the cache bound {self._expected[name]:#x}; the cache "
                f"length stays {self.seq_length}"
            )
        with atomic():
            self.seq_length += n_new
            step, self._allocated_this_use = self._allocated_this_use, None
            self._last_step = step
            if self._state_buffers:
                self._unsettled = False
                if self.states == "swap":
                    self._current = 1 - self._current  # the buffers just written hold the state now
        return step or self._steady

    def rollback(self, n_new: int) -> None:
        with atomic():
            self.seq_length -= n_new
            self._allocated_this_use, self._last_step = self._last_step, None
            if self._state_buffers and self.states == "swap":
                self._current = 1 - self._current  # the buffers read by the undone step were left untouched
        if self._state_buffers and self.states == "in-place":  # the step's own error propagates; the next one fails
            self._lost = self._lost_because("a step was rolled back after its run had overwritten them")

    def _current_states(self) -> list[DeviceTensor]:
        return [pair[self._current] if len(pair) == 2 else pair[0] for pair in self._state_buffers.values()]

    def _receive(self, src: Cache) -> tuple[CacheStep, int]:
        """One whole-tensor copy per buffer: the source is a static cache of the same max_cache_len (its states:
        the buffers holding them now)."""
        if src.max_cache_len != self.max_cache_len:
            raise ConfigError(
                f"the source static cache has max_cache_len={src.max_cache_len}, this one "
                f"{self.max_cache_len}: whole-buffer copies need equal sizes"
            )
        if src._lost:
            raise CacheStateError(src._lost)
        pairs = list(zip(src._buffers, self._buffers))
        if self._state_buffers:
            self._current = 0  # before any copy: a failure leaves seq_length 0, and the first step reads zeros
            pairs += list(zip(src._current_states(), self._current_states()))
        for s_buf, d_buf in pairs:
            copy_tensor(s_buf, d_buf)  # a failure leaves seq_length 0: stale bytes are never read
        step, self._allocated_this_use = self._allocated_this_use, None
        return step or self._steady, sum(d.nbytes for _, d in pairs)

    def _reset(self) -> None:
        super()._reset()
        self._current, self._unsettled, self._lost = 0, False, ""  # the first step reads zero states

    def _release_all(self) -> None:
        self._bindings.clear()
        self._expected_by.clear()
        release_all(list(self.tensors))
        self._buffers, self._state_buffers = [], {}
        self.seq_length = 0


CACHE_KINDS = {"dynamic": DynamicCache, "static": StaticCache}


def make_cache(spec: str | CacheSpec, max_cache_len: int | None = None) -> Cache:
    """A cache by kind ("dynamic" or "static"; static needs max_cache_len) or by its ``CacheSpec``; ConfigError
    for another kind or a static cache without a size."""
    if isinstance(spec, CacheSpec):
        if spec.kind == "static" and "states-in-place" in spec.variant:
            return StaticCache(spec.max_cache_len, states="in-place")
        spec, max_cache_len = spec.kind, spec.max_cache_len
    check_choice(spec, CACHE_KINDS, "cache type ")
    if spec == "static":
        if max_cache_len is None:
            raise ConfigError("a static cache needs max_cache_len (a positive int)")
        return StaticCache(max_cache_len)
    return DynamicCache()
