"""``RingStaticCache(max_cache_len)``: a StaticCache whose sliding-window layers hold their window and no more, the
runtime evicting inside GroupQueryAttention (``sliding_window_cache=1``; the graph: ``kvlab.ort.models.rewrites``).
Opt-in: a plain ``StaticCache`` never changes its graph, and a run's label says which ran ("static@128 ring").

- ``RingKV``: one buffer of ``window`` positions, bound as both past and present of the ring graph. Rows
  ``[0, min(length, window))`` hold the newest positions, in order; once full, the op shifts the newest
  ``window - 1`` rows to the front every step.
- Full-attention layers keep ``max_cache_len`` positions (``FixedKV``), states what a StaticCache keeps.

A ring cannot go back past what it holds: ``crop(n)`` works while nothing was evicted and for ``n == 0``; a step
that fails after its run cannot be undone (the cache refuses to go on until reset); ``receive`` is refused. Where
the runtime cannot evict, the session is refused with the runtime's own error, before anything is allocated."""

from __future__ import annotations

from typing import Any

from ....core.cache_layout import CacheEntry, MemoryReport, SlidingWindow
from ....core.errors import CacheStateError, ConfigError, DeviceError, ModelError
from ....core.slots import Crop, Slot
from ...models.rewrites import ring_graph
from ...runtime.device import Device
from ...runtime.session import Session
from .static import FixedKV, StaticCache

VARIANT = "ring"  # CacheSpec.variant: "static@N ring"


def sliding_windows(info: Any) -> dict[int, int]:
    """{layer: window} of the model's sliding-window layers whose KV a GroupQueryAttention reads."""
    return {
        layer.index: layer.kind.window
        for layer in info.layout.layers
        if isinstance(layer.kind, SlidingWindow) and any(e.op == "GroupQueryAttention" for e in layer.entries)
    }


class RingKV(FixedKV):
    """Keys or values of a sliding layer in one buffer of ``capacity`` (its window) positions, bound in place;
    GroupQueryAttention evicts the oldest. Not undoable: a run that shifted the buffer cannot be rolled back."""

    undoable = False

    def held(self, length: int) -> int:
        """Positions the buffer holds at a sequence of ``length``: the newest ``min(length, capacity)``."""
        return min(length, self.capacity)

    def can_crop(self, length: int, n: int) -> bool:
        """To 0, or anywhere while nothing was evicted (``length`` within the window)."""
        return n == 0 or length <= self.capacity

    def crop(self, length: int, n: int) -> Crop:
        """Nothing to move where it can crop; else a CacheStateError naming the positions evicted."""
        if self.can_crop(length, n):
            return Crop()  # nothing evicted yet (rows [0, n) hold positions [0, n)), or a fresh start
        e, first = self.entry, length - self.capacity  # the oldest position held
        raise CacheStateError(
            f"cannot crop to {n} of {length} positions: layer {e.layer}'s {e.role} ring buffer ({e.past!r}) holds "
            f"only the newest {self.capacity} positions ({first} to {length - 1}); positions 0 to {first - 1} were "
            f"evicted, and the next step at {n} would read from {max(0, n - self.capacity)}. A ring cache rewinds "
            f"only while its sequence fits its window ({self.capacity} positions), or to 0 (crop(0), reset()); "
            "use StaticCache (every position held) to rewind further"
        )

    def receive(self, src: Slot) -> tuple[list[Any], int]:
        """Refused: CacheStateError."""
        raise CacheStateError("a ring buffer takes no handoff")  # RingStaticCache refuses first, naming why


class RingStaticCache(StaticCache):
    """A StaticCache whose sliding-window layers are ring buffers of their window (see the module docstring).
    Greedy tokens equal a plain StaticCache's. Raises ConfigError where the runtime or device cannot evict inside
    GroupQueryAttention (naming the package, its error and what would work), for a model without a sliding layer,
    and for the greedy token on the device; what a StaticCache raises otherwise."""

    reductions = ()  # its ring graph has no greedy-token variant
    variant = VARIANT

    def __init__(
        self, max_cache_len: int, check_every: int | None = None, states: str = "swap", kv_precision: str | None = None
    ):
        if kv_precision is not None:  # refused by name: its ring graph keeps the model's KV precision
            raise ConfigError(
                f"RingStaticCache(kv_precision={kv_precision!r}): ring buffers hold the model's own KV precision; "
                "use kv_precision=None, or StaticCache(max_cache_len, kv_precision=...) without rings"
            )
        super().__init__(max_cache_len, check_every, states)
        self._windows: dict[int, int] = {}  # {layer: window} of the model served, set when the cache meets it

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        """A ``RingKV`` of its window for a sliding layer's keys and values; a StaticCache's slot otherwise."""
        window = self._windows.get(entry.layer)
        if window and entry.grows:
            return RingKV(entry, device, window)
        return super()._slot(entry, device)

    def used_bytes_at(self, length: int) -> int:
        """Bytes of what the buffers hold at ``length``: a sliding layer its newest ``min(length, window)``
        positions, a full-attention layer ``length``, a state one copy."""
        if self._info is None or not length:
            return 0
        n = length
        return sum(
            s.entry.nbytes(s.held(n)) if isinstance(s, RingKV) else s.entry.nbytes(n if s.entry.grows else 0)
            for s in self.slots
        )

    def memory_report(self, info: Any) -> MemoryReport:
        """What this cache will reserve for the model ``info`` describes, per layer, before anything is
        allocated: a sliding layer's ring buffers as fixed bytes (its window), the rest as a StaticCache's."""
        windows = self._check_model(info)
        return info.layout.report(self.max_cache_len, self.state_copies, "RingStaticCache", windows)

    def empty_like(self) -> RingStaticCache:
        """A new RingStaticCache of the same size (a ring takes no handoff: ``receive`` refuses)."""
        return RingStaticCache(self.max_cache_len, self.check_every, self.states)

    def session(self, device: Device, model: Any, reduction: str = "") -> Session:
        """The device's session of the model's ring graph. ConfigError for the greedy token on the device, and where the
        runtime cannot open the graph (its own error quoted)."""
        if reduction:
            raise ConfigError(
                "token_on_device runs the model's greedy graph on the device's own session; a RingStaticCache runs a "
                "session of its own (its ring graph): use token_on_device=False, or a DynamicCache, StaticCache or "
                "CapturedStaticCache"
            )
        self._check_model(model.info)
        try:
            return device.session(ring_graph(model), f"model {model.name} (ring buffers on its sliding layers)")
        except (DeviceError, ModelError) as exc:
            raise ConfigError(
                self._refusal(device, f"its session of the ring graph failed ({exc})", model.info)
            ) from exc

    def _attach(self, info: Any, device: Device) -> None:
        self._windows = self._check_model(info)
        super()._attach(info, device)

    @staticmethod
    def _check_model(info: Any) -> dict[int, int]:
        """{layer: window} of the model's sliding layers; ConfigError when it has none."""
        windows = sliding_windows(info)
        if not windows:
            raise ConfigError(
                f"RingStaticCache holds sliding-window layers in ring buffers; model {info.name} has none "
                f"({info.layout}): use StaticCache({info.context_length}) or smaller"
            )
        return windows

    def _refusal(self, device: Device, why: str, info: Any) -> str:
        """Why the ring cannot run here, what a StaticCache costs instead, and what works."""
        package, version = device.backend.label_for(device.name)
        plain, ring = StaticCache(self.max_cache_len).memory_report(info), self.memory_report(info)
        sliding = sum(e.bytes_per_token for e in info.layout.entries if e.layer in sliding_windows(info))
        return (
            f"RingStaticCache cannot run on {device.name} with {package} {version}: {why}. What it costs: a "
            f"StaticCache({self.max_cache_len}) of model {info.name} reserves {plain.total_bytes:,} bytes, its sliding "
            f"layers holding every position ({sliding:,} bytes a position), where the ring would reserve "
            f"{ring.total_bytes:,}. What works: RingStaticCache on device 'cpu' in the plugin environment "
            "(.venv-plugin: onnxruntime 1.31.1), or StaticCache here (a sliding layer then holds every position); on "
            "PyTorch, kvlab.pytorch.generate(...) keeps a sliding layer's last window - 1 positions"
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
