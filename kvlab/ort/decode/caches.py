"""The two KV caches on ONNX Runtime, each a choice of slot per entry of the model's layout (``kvlab.ort.decode.slots``)
over the lifecycle every cache shares (``kvlab.core.cache.Cache``): ``DynamicCache`` (the runtime allocates new
presents every step) and ``StaticCache`` (every buffer allocated once and written in place).

Both hold every past/present pair of the graph (``ModelInfo.entries``): keys and values that grow by one position
per token (full attention, and sliding windows, whose buffer holds every position: a ring buffer of the window is
``kvlab.ort.decode.window.RingStaticCache``, where the runtime allows it), and fixed-size states (conv,
recurrent) that are rewritten every step. A StaticCache writes a state into the second of two buffers and swaps
them at the commit (``states="swap"``, every EP; a failed step leaves the first untouched), or into the one buffer it
reads (``states="in-place"``: the CPU EP, and WebGPU where the backend allows it,
``Backend.webgpu_states_in_place``)."""

from __future__ import annotations

from typing import Any

from ...core.cache import Cache
from ...core.errors import CapacityError, ConfigError, ModelError, check_choice, check_int
from ...core.labels import CacheSpec
from ...core.layout import CacheEntry, MemoryReport, check_max_cache_len
from ...core.slots import Slot
from ..models.info import ModelInfo
from ..runtime.device import Device
from ..runtime.session import Session
from .greedy import AUTO, DeviceToken, greedy_graph, reduction_for
from .kvprecision import (
    check_kv_precision,
    check_runs_here,
    packed_entry,
    packed_layout,
    session_options,
)
from .shared import shared_window_on, shared_window_refusal
from .slots import FixedKV, GrowingKV, InPlaceState, RuntimeState, SwappedState


class OrtCache(Cache):
    """A cache whose steps run on ONNX Runtime. On WebGPU, a model whose KV-shared layers slide (Gemma 4) runs only
    sequences within their window (``kvlab.ort.decode.shared``): CapacityError beyond it."""

    _shared_window = 0  # the smallest window of a KV-shared sliding layer, on WebGPU (0: no limit)
    burst_reads = True  # greedy steps can keep their tokens on the device for a later read (kvlab.ort.decode.burst)
    # None: KV in the model's dtype; "int8" / "int4": packed (kvlab.ort.decode.kvprecision)
    kv_precision: str | None = None

    def _attach(self, info: ModelInfo, device: Device) -> None:
        if self.kv_precision is not None:
            check_runs_here(self.kv_precision, type(self).__name__, info, device)
        self._shared_window = shared_window_on(info, device)
        super()._attach(info, device)

    def _kv_variant(self, variant: str = "") -> str:
        """``variant`` with the KV precision added where it is not the model's ("kv-int8")."""
        return "+".join(filter(None, [variant, self.kv_precision and f"kv-{self.kv_precision}"]))

    def check_capacity(self, positions: int) -> None:
        if self._shared_window and positions > self._shared_window:
            raise CapacityError(shared_window_refusal(self._info, positions, self._shared_window))

    def session(self, device: Device, model: Any) -> Session:
        """The session this cache's steps run on: the device's session of the model, by default; a cache that
        needs a session of its own (graph capture opens one with other options) says so here."""
        return device.session(model.onnx_path, f"model {model.name}", session_options(self.kv_precision))

    @classmethod
    def runs_own_session(cls) -> bool:
        """Whether this kind of cache runs a session of its own (a captured graph, a ring graph) rather than the
        device's session of the model."""
        return cls.session is not OrtCache.session

    def token_session(self, device: Device, model: Any, reduction: str) -> Session:
        """The session for steps that keep the greedy token on the device (``kvlab.ort.decode.greedy``): the
        device's session of the model's greedy graph of ``reduction``. ConfigError for a cache that runs a session
        of its own and has no such graph."""
        if self.runs_own_session():
            raise ConfigError(
                f"token_on_device runs the model's greedy graph on the device's own session; a {type(self).__name__} "
                "runs a session of its own: use a DynamicCache, StaticCache or CapturedStaticCache"
            )
        label = f"model {model.name} (greedy token on the device, {reduction})"
        return device.session(greedy_graph(model, reduction), label)

    @classmethod
    def auto_reduction(cls, vocab_size: int, device: Device) -> str:
        """What ``token_on_device="auto"`` runs with this cache (``kvlab.ort.decode.greedy.auto_reduction``; the
        host path, "", for a cache that runs a session of its own)."""
        return "" if cls.runs_own_session() else reduction_for(AUTO, vocab_size, device)

    def device_token(self, device: Device, dtype: Any, size: int = 2) -> DeviceToken:
        """Where a stepper keeps the greedy token between steps: a ring of ``size`` device tensors of its own."""
        return DeviceToken(device, dtype, size)


class DynamicCache(OrtCache):
    """The runtime allocates new ``present.*`` tensors every step (one token longer: a full copy of the past)
    and the previous ones are released, as transformers.js does by default. Past tensors stay on the device
    between steps (no host round trip), so the churn measured is the runtime's real one."""

    kind = "dynamic"

    def __init__(self, kv_precision: str | None = None, *, max_cache_len: object = None):
        super().__init__()
        if max_cache_len is not None:
            raise ConfigError(
                f"DynamicCache(max_cache_len={max_cache_len!r}): a dynamic cache grows with the sequence and has no "
                "size; use StaticCache(max_cache_len) for a fixed one"
            )
        self.kv_precision = check_kv_precision(kv_precision, "DynamicCache")

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        if entry.grows:
            return GrowingKV(packed_entry(entry, self.kv_precision), device)
        return RuntimeState(entry, device)

    @property
    def spec(self) -> CacheSpec:
        return CacheSpec(self.kind, variant=self._kv_variant())

    def empty_like(self) -> DynamicCache:
        return DynamicCache(self.kv_precision)


STATE_MODES = ("swap", "in-place")
STATE_SLOTS = {"swap": SwappedState, "in-place": InPlaceState}
WEBGPU_IN_PLACE = (
    "onnxruntime-webgpu 1.27 rejects a state bound as both input and output of a run ('WebGPU "
    "validation failed. [Buffer (unlabeled)] usage (Storage(read-write)|Storage(read-only)) includes "
    "writable usage and another usage in the same synchronization scope', measured on "
    "CausalConvWithState and LinearAttention)"
)


def read_back(check_every: int | None) -> str:
    """A static cache's ``check_every`` in words, for labels."""
    if check_every is None:
        return "presents checked in place one a step"
    return (
        "every present checked every step" if check_every == 1 else f"every present checked every {check_every} steps"
    )


def check_every_of(value: int | None) -> int | None:
    """``check_every`` checked: None (a spot check a step) or a positive int; ConfigError otherwise."""
    note = " (1: check every step), or None (every present at a binding's first run, then one a step)"
    return None if value is None else check_int(value, "check_every", 1, note=note)


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

    ``check_every``: how the presents' buffer identities are read back to show the runtime wrote in place. None
    (default): all of them at the first run of each binding (one that runs again runs on the buffers its first run
    returned), then one present a step, in turn; N: all of them every N-th step (1: every step; reading back 2 x
    layers identities costs one Python wrapper each: 0.21 ms of an 8 ms step on an NVIDIA H200 machine,
    docs/benchmarks.md).

    Raises ConfigError for a bad argument, or when the model or device cannot serve it; ModelError for a model whose
    presents cannot share a buffer; CapacityError when a step does not fit ``max_cache_len``; InPlaceError when the
    runtime wrote a present elsewhere."""

    kind = "static"

    def __init__(
        self, max_cache_len: int, check_every: int | None = None, states: str = "swap", kv_precision: str | None = None
    ):
        super().__init__()
        self.kv_precision = check_kv_precision(kv_precision, "StaticCache")
        self.max_cache_len = check_max_cache_len(max_cache_len)
        self.check_every = check_every_of(check_every)
        self.states = check_choice(states, STATE_MODES, "states=")

    @property
    def spec(self) -> CacheSpec:
        variant = f"checked/{self.check_every}" if self.check_every is not None else ""
        if self.states != "swap":
            variant = "+".join(filter(None, [variant, f"states-{self.states}"]))
        return CacheSpec(self.kind, self.max_cache_len, self._kv_variant(variant))

    @property
    def capacity(self) -> int:
        return self.max_cache_len

    @property
    def allocated(self) -> bool:
        return bool(self.tensors)

    @property
    def state_copies(self) -> int:
        return STATE_SLOTS[self.states].copies

    def memory_report(self, info: ModelInfo) -> MemoryReport:
        """Memory this cache will reserve for a model, per layer, known before allocating anything."""
        return packed_layout(info.layout, self.kv_precision).report(self.max_cache_len, self.state_copies)

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        if entry.grows:
            return FixedKV(packed_entry(entry, self.kv_precision), device, self.max_cache_len)
        return STATE_SLOTS[self.states](entry, device)

    def empty_like(self) -> StaticCache:
        return StaticCache(self.max_cache_len, self.check_every, self.states, self.kv_precision)

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

    def check_capacity(self, positions: int) -> None:
        super().check_capacity(positions)
        if positions > self.max_cache_len:
            raise CapacityError(
                f"{positions} positions are needed but max_cache_len is {self.max_cache_len}; "
                f"use StaticCache(max_cache_len>={positions}) or shorten the prompt or max_new_tokens"
            )

    def _check_source(self, src: Any) -> None:
        super()._check_source(src)
        if src.max_cache_len != self.max_cache_len:
            raise ConfigError(
                f"the source static cache has max_cache_len={src.max_cache_len}, this one "
                f"{self.max_cache_len}: whole-buffer copies need equal sizes"
            )
