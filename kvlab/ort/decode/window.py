"""Ring buffers for sliding layers: ``RingStaticCache(max_cache_len)``, a StaticCache whose sliding-window layers
hold their window and no more, where the runtime evicts inside GroupQueryAttention (``sliding_window_cache=1``: the
CPU EP of onnxruntime 1.31.1; how the op does it: ``kvlab.ort.models.rewrites``). Opt-in: a plain
``StaticCache`` never changes its graph, and a run's label says which ran ("static@128 ring").

- ``RingKV``: one buffer of ``window`` positions (the layer's ``local_window_size``), allocated once and bound as
  both the past input and the present output of the ring graph. Rows ``[0, min(length, window))`` hold the newest
  positions, in order; once the buffer is full the op shifts the newest ``window - 1`` rows to the front every step.
  Why the window and not more: it is the smallest capacity the op accepts (``C >= local_window_size``) and exactly
  what the layer reads; a capacity ``C`` above it would shift once every ``C - window + 1`` steps instead, for
  ``C - window`` more positions of bytes (not measured worth it on the toys: a shift moves ``window - 1`` rows).
- Full-attention layers keep ``max_cache_len`` positions (``FixedKV``), fixed-size states what a StaticCache keeps.
  A window larger than ``max_cache_len`` still gets a buffer of its window (the op's minimum).

What a ring cannot do: go back past what it holds. ``crop(n)`` works while nothing was evicted (a sequence of at
most ``window`` positions: rows ``[0, n)`` hold positions ``[0, n)``) and for ``n == 0``; past that, the positions
before ``seq_length - window`` are gone, and a crop to any ``n < seq_length`` is a CacheStateError that names them.
A step writes in place with no copy to fall back on, so a step that fails after its run cannot be undone: the cache
refuses to go on until it is reset (as ``states="in-place"`` does). A handoff (``receive``) is refused: a ring runs
on one runtime's CPU EP, where no other device's cache comes from.

Where the runtime cannot (onnxruntime-webgpu 1.27: the attribute is unknown; the WebGPU plugin EP 0.4.0: refused at
kernel creation), the session is refused with the runtime's own error, what was measured and what would work
(``RING_SUPPORT``), before anything is allocated; a plain ``StaticCache`` there holds every position.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import CacheStateError, ConfigError, DeviceError, ModelError
from ...core.labels import CacheSpec
from ...core.layout import CacheEntry, LayerMemory, MemoryReport, SlidingWindow
from ...core.slots import Crop, Slot
from ..models.rewrites import ring_graph
from ..runtime.device import Device
from ..runtime.session import Session
from .caches import StaticCache
from .slots import FixedKV

VARIANT = "ring"  # CacheSpec.variant: "static@N ring"
# what each runtime does with sliding_window_cache=1 (measured on one node and on sliding-toy: docs/kv-memory.md)
RING_SUPPORT: dict[str, str] = {
    "onnxruntime 1.31.1, CPU EP (.venv-plugin)": "evicts inside GroupQueryAttention: a window-sized buffer, bound "
    "in place, tokens identical to transformers (kvlab runs RingStaticCache here)",
    "onnxruntime-webgpu 1.27 (CPU and WebGPU EPs)": "the attribute is unknown ('Unrecognized attribute: "
    "sliding_window_cache for operator GroupQueryAttention'): every position is held",
    "onnxruntime-ep-webgpu 0.4.0 (WebGPU)": "refused at kernel creation ('GroupQueryAttention (WebGPU): "
    "sliding_window_cache=1 is not implemented'): every position is held",
}


def sliding_windows(info: Any) -> dict[int, int]:
    """{layer: window} of the model's sliding-window layers whose KV a GroupQueryAttention reads."""
    return {
        layer.index: layer.kind.window
        for layer in info.layout.layers
        if isinstance(layer.kind, SlidingWindow) and any(e.op == "GroupQueryAttention" for e in layer.entries)
    }


class RingKV(FixedKV):
    """Keys or values of a sliding layer in one buffer of ``capacity`` (= its window) positions, bound in place;
    GroupQueryAttention evicts the oldest. Not undoable: a run that compacted the buffer cannot be rolled back."""

    undoable = False

    def held(self, length: int) -> int:
        """Positions the buffer holds at a sequence of ``length``: the newest ``min(length, capacity)``."""
        return min(length, self.capacity)

    def bytes(self, length: int) -> tuple[int, int]:
        return self.entry.nbytes(self.capacity), 0  # fixed: the window, whatever the length

    def can_crop(self, length: int, n: int) -> bool:
        return n == 0 or length <= self.capacity

    def crop(self, length: int, n: int) -> Crop:
        if self.can_crop(length, n):
            return Crop()  # nothing evicted yet (rows [0, n) hold positions [0, n)), or a fresh start
        e = self.entry
        first = length - self.capacity  # the oldest position held
        raise CacheStateError(
            f"cannot crop to {n} of {length} positions: layer {e.layer}'s {e.role} ring buffer ({e.past!r}) holds "
            f"only the newest {self.capacity} positions ({first} to {length - 1}); positions 0 to {first - 1} were "
            f"evicted, and the next step at {n} would read from {max(0, n - self.capacity)}. A ring cache rewinds "
            f"only while its sequence fits its window ({self.capacity} positions), or to 0 (crop(0), reset()); "
            "use StaticCache (every position held) to rewind further"
        )

    def receive(self, src: Slot) -> tuple[list[Any], int]:
        raise CacheStateError("a ring buffer takes no handoff")  # RingStaticCache refuses first, naming why


class RingStaticCache(StaticCache):
    """A StaticCache whose sliding-window layers are ring buffers of their window (see the module docstring): their
    bytes stop growing at the window, full-attention layers keep ``max_cache_len`` positions. Greedy tokens equal a
    plain StaticCache's and transformers' own. ``used_bytes`` counts what the buffers hold (a sliding layer at most
    its window); ``memory_report`` the ring buffers as fixed bytes. Raises ConfigError where the runtime or device
    cannot evict inside GroupQueryAttention (naming the package, its version, its error and what would work) or the
    model has no sliding layer; what a StaticCache raises otherwise."""

    def __init__(self, max_cache_len: int, check_every: int | None = None, states: str = "swap"):
        super().__init__(max_cache_len, check_every, states)
        self._windows: dict[int, int] = {}  # {layer: window} of the model served, set when the cache meets it

    @property
    def spec(self) -> CacheSpec:
        base = super().spec
        return CacheSpec(self.kind, self.max_cache_len, "+".join(filter(None, [VARIANT, base.variant])))

    def empty_like(self) -> RingStaticCache:
        return RingStaticCache(self.max_cache_len, self.check_every, self.states)

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        window = self._windows.get(entry.layer)
        if window and entry.grows:
            return RingKV(entry, device, window)
        return super()._slot(entry, device)

    def _attach(self, info: Any, device: Device) -> None:
        self._windows = self._check_model(info)
        super()._attach(info, device)

    @staticmethod
    def _check_model(info: Any) -> dict[int, int]:
        windows = sliding_windows(info)
        if not windows:
            raise ConfigError(
                f"RingStaticCache holds sliding-window layers in ring buffers; model {info.name} has none "
                f"({info.layout}): use StaticCache({info.context_length}) or smaller"
            )
        return windows

    def _refusal(self, device: Device, why: str, info: Any) -> str:
        package, version = device.backend.label_for(device.name)
        facts = "; ".join(f"{k}: {v}" for k, v in RING_SUPPORT.items())
        plain, ring = StaticCache(self.max_cache_len).memory_report(info), self.memory_report(info)
        sliding = sum(e.bytes_per_token for e in info.layout.entries if e.layer in sliding_windows(info))
        return (
            f"RingStaticCache cannot run on {device.name} with {package} {version}: {why}. Measured: {facts}. "
            f"What it costs: a StaticCache({self.max_cache_len}) of model {info.name} reserves {plain.total_bytes:,} "
            f"bytes, its sliding layers holding every position ({sliding:,} bytes a position), where the ring "
            f"would reserve {ring.total_bytes:,}. What works: RingStaticCache on device 'cpu' in the plugin "
            "environment (.venv-plugin: onnxruntime 1.31.1), or StaticCache here (a sliding layer then holds every "
            "position); on PyTorch, kvlab.pytorch.generate(...) keeps a sliding layer's last window - 1 positions"
        )

    def session(self, device: Device, model: Any) -> Session:
        """The device's session of the model's ring graph (``kvlab.ort.models.rewrites.ring_graph``).
        ConfigError where the device's runtime cannot open it (the runtime's own error quoted, and the bytes a
        StaticCache costs there): every package and EP kvlab runs but onnxruntime 1.31.1's CPU EP
        (``RING_SUPPORT``)."""
        self._check_model(model.info)
        path = ring_graph(model)
        try:
            return device.session(path, f"model {model.name} (ring buffers on its sliding layers)")
        except (DeviceError, ModelError) as exc:
            why = f"its session of the ring graph failed ({exc})"
            raise ConfigError(self._refusal(device, why, model.info)) from exc

    @property
    def used_bytes(self) -> int:
        """Bytes of what the buffers hold: a sliding layer its newest ``min(seq_length, window)`` positions, a
        full-attention layer ``seq_length``, a state one copy (as ``CacheState.used_bytes``)."""
        if self._info is None or not self.seq_length:
            return 0
        n = self.seq_length
        return sum(
            s.entry.nbytes(s.held(n)) if isinstance(s, RingKV) else s.entry.nbytes(n if s.entry.grows else 0)
            for s in self.slots
        )

    def memory_report(self, info: Any) -> MemoryReport:
        """Memory this cache will reserve for a model, per layer, before allocating anything: a sliding layer's ring
        buffers as fixed bytes (its window), the rest as a StaticCache reserves them."""
        windows = self._check_model(info)
        plain = super().memory_report(info)
        layers = {layer.index: layer for layer in info.layout.layers}
        rows = tuple(
            LayerMemory(
                r.layer,
                f"{r.kind}, ring buffer",
                sum(e.nbytes(windows[r.layer]) for e in layers[r.layer].entries),
                0,
                r.tensors,
            )
            if r.layer in windows
            else r
            for r in plain.layers
        )
        growing = sum(layers[r.layer].bytes_per_token for r in rows if r.growing_bytes)
        fixed = sum(r.fixed_bytes for r in rows)
        return MemoryReport(
            self.max_cache_len,
            growing,
            fixed + sum(r.growing_bytes for r in rows),
            plain.tensors,
            plain.tensor_shape,
            fixed_bytes=fixed,
            layers=rows,
            kind="RingStaticCache",
            uniform=False,
        )

    def _check_source(self, src: Any) -> None:
        raise ConfigError(
            "RingStaticCache takes no handoff (receive): its ring graph runs on the CPU EP of onnxruntime 1.31.1 "
            "only, and a prefill on another device holds every position in another layout; prefill on the same "
            "device (generate(..., device='cpu') without prefill_device)"
        )

    def _lost_because(self, why: str) -> str:
        return (
            f"this ring cache's sliding-layer buffers were rewritten in place (positions evicted) and no longer "
            f"match its {self.seq_length} tokens: {why}; that cannot be undone. Reset the cache (generate() does) "
            "or use StaticCache, whose KV positions a failed step leaves as they were"
        )
