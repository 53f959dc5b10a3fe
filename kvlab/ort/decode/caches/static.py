"""``StaticCache``: every KV buffer allocated once and written in place. The mechanism, top to bottom:

1. Allocate once. At the cache's first use every KV entry gets one zeroed buffer of ``max_cache_len`` positions,
   [1, kv_heads, max_cache_len, head_dim] (``FixedKV.allocate``); no step allocates anything after that.
2. Bind past and present to the same buffer (``FixedKV.bind``): a step's ``past_key_values.*`` input and its
   ``present.*`` output are that one buffer; the attention mask says how many of its positions hold tokens.
3. The runtime writes in place: GroupQueryAttention writes the new positions' keys and values into the buffer it
   reads the past from, at ``seq_length``. The slot has nothing to do in a step (``FixedKV.steps`` is False).
4. Advance only after the run succeeds: ``seq_length`` grows in ``Cache.commit`` (``kvlab.core.cache``), once the
   run returned and every present came back in the buffer bound for it (the in-place proof, ``check_every``). A
   failed run leaves the length as it was; what it wrote past the length is never read, and later steps write
   those positions again (which is also why ``crop`` costs nothing here).

Fixed-size states (conv, recurrent) are allocated once too, at the end of this file: ``SwappedState`` (two buffers,
one read and the other written, swapped at the commit: a failed step leaves the state it read) or ``InPlaceState``
(one buffer read and written by the same run: half the memory, and a failed step cannot be undone).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from ....core.cache_layout import CacheEntry, MemoryReport, check_max_cache_len
from ....core.errors import CapacityError, ConfigError, ModelError, check_choice
from ....core.labels import CacheSpec
from ....core.slots import Slot
from ...runtime.device import Device, copy_tensor
from ...runtime.session import Binding, DeviceTensor, RunResult, release_all, zeros_all
from .kv_precision import packed_entry, packed_layout
from .ort_cache import OrtCache


class FixedKV(Slot):
    """Keys or values in one buffer of ``capacity`` positions, bound as both the past input and the present output:
    the runtime writes the new positions in place, so the binding never changes and a step has nothing to do
    here. A crop keeps the buffer (``Slot.crop``): the positions from ``n`` on are written again before they are
    read."""

    steps = False

    def __init__(self, entry: CacheEntry, device: Device, capacity: int):
        super().__init__(entry)
        self.device, self.capacity = device, capacity
        self.buffer: DeviceTensor | None = None

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        """The buffer, once allocated."""
        return (self.buffer,) if self.buffer is not None else ()

    def allocate(self) -> list[DeviceTensor]:
        """One zeroed buffer of ``capacity`` positions: [1, kv_heads, capacity, head_dim]."""
        self.buffer = zeros_all(self.device, [(self.entry.shape(self.capacity), self.entry.dtype)])[0]
        return [self.buffer]

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        """The buffer as the past input and as the present output: it must come back in the same buffer."""
        binding.input(self.entry.past, self.buffer)
        binding.output(self.entry.present, self.buffer)
        return {self.entry.present: self.buffer.data_ptr}

    def receive(self, src: Slot) -> tuple[list[DeviceTensor], int]:
        """One whole-buffer copy (the source cache has the same ``max_cache_len``: ``StaticCache`` checks)."""
        copy_tensor(src.tensors[0], self.buffer)
        return [], self.buffer.nbytes

    def release(self) -> None:
        """Release the buffer."""
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None


STATE_MODES = ("swap", "in-place")
# why StaticCache(states="in-place") is refused on WebGPU where the backend does not allow it
WEBGPU_IN_PLACE = (
    "onnxruntime-webgpu 1.27 rejects a state bound as both input and output of a run ('WebGPU validation failed. "
    "[Buffer (unlabeled)] usage (Storage(read-write)|Storage(read-only)) includes writable usage and another usage "
    "in the same synchronization scope', on CausalConvWithState and LinearAttention)"
)


class StaticCache(OrtCache):
    """Every KV buffer allocated once at ``max_cache_len`` and written in place (see the module docstring): no
    allocation per step and fixed shapes, what graph capture needs.

    ``states``: how fixed-size states are held: "swap" (default, every EP: two buffers, a failed step can be
    retried or rolled back) or "in-place" (one buffer, the CPU EP and WebGPU where ``Backend.webgpu_states_in_place``;
    after a step that fails past its run the cache refuses to go on, CacheStateError, until it is reset).
    ``check_every``: how the in-place proof reads the presents' buffers back (``kvlab.core.cache.InPlaceProof``).
    ``kv_precision``: None, "int8" or "int4" (``OrtCache``).

    Raises ConfigError for a bad argument, or when the model or device cannot serve it; ModelError for a model whose
    presents cannot share a buffer; CapacityError when a step does not fit ``max_cache_len``; InPlaceError when the
    runtime wrote a present elsewhere."""

    kind = "static"
    variant = ""  # the kind's own part of its spec's variant (a captured cache's "graph", a ring's "ring")

    def __init__(
        self, max_cache_len: int, check_every: int | None = None, states: str = "swap", kv_precision: str | None = None
    ):
        super().__init__(kv_precision, check_every)
        self.max_cache_len = check_max_cache_len(max_cache_len)
        self.states = check_choice(states, STATE_MODES, "states=")

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        """A ``FixedKV`` of ``max_cache_len`` positions for keys and values; the ``states`` slot for a state."""
        if entry.grows:
            return FixedKV(packed_entry(entry, self.kv_precision), device, self.max_cache_len)
        return STATE_SLOTS[self.states](entry, device)

    @property
    def check_every(self) -> int | None:
        """How the presents' buffers are read back after a run (``kvlab.core.cache.InPlaceProof``)."""
        return self.proof.check_every

    @property
    def spec(self) -> CacheSpec:
        """ "static@N", with its variants "+"-joined: the kind's own (``variant``), "checked/N", "states-in-place",
        "kv-int8" / "kv-int4"."""
        checked = f"checked/{self.check_every}" if self.check_every is not None else ""
        states = f"states-{self.states}" if self.states != "swap" else ""
        return CacheSpec(self.kind, self.max_cache_len, self._kv_variant(self.variant, checked, states))

    @property
    def capacity(self) -> int:
        """``max_cache_len``."""
        return self.max_cache_len

    @property
    def allocated(self) -> bool:
        """Whether the buffers are allocated (from the first use until ``dispose``)."""
        return bool(self.tensors)

    @property
    def state_copies(self) -> int:
        """Buffers per fixed-size state: 2 (``states="swap"``) or 1."""
        return STATE_SLOTS[self.states].copies

    def memory_report(self, info: Any) -> MemoryReport:
        """What this cache will reserve for the model ``info`` describes, per layer, before anything is
        allocated."""
        return packed_layout(info.layout, self.kv_precision).report(self.max_cache_len, self.state_copies)

    def check_capacity(self, positions: int) -> None:
        """CapacityError when ``positions`` exceed ``max_cache_len`` (or a KV-shared window, ``OrtCache``)."""
        super().check_capacity(positions)
        if positions > self.max_cache_len:
            raise CapacityError(
                f"{positions} positions are needed but max_cache_len is {self.max_cache_len}; "
                f"use StaticCache(max_cache_len>={positions}) or shorten the prompt or max_new_tokens"
            )

    def empty_like(self) -> StaticCache:
        """A new StaticCache of the same size, states mode and KV precision (a handoff copies whole buffers)."""
        return StaticCache(self.max_cache_len, self.check_every, self.states, self.kv_precision)

    def _attach(self, info: Any, device: Device) -> None:
        if not info.shares_buffers:
            raise ModelError(f"StaticCache cannot use model {info.name}: {info.sharing_problem}")
        if self.max_cache_len > info.context_length:
            raise ConfigError(
                f"max_cache_len={self.max_cache_len} is larger than model {info.name}'s context "
                f"length {info.context_length}; use at most {info.context_length}"
            )
        in_place_on_webgpu = self.states == "in-place" and device.name == "webgpu" and info.layout.states
        if in_place_on_webgpu and not device.backend.webgpu_states_in_place:
            raise ConfigError(
                f"StaticCache(states='in-place') cannot run model {info.name}'s states on WebGPU: "
                f"{WEBGPU_IN_PLACE}; use states='swap' (the default)"
            )
        super()._attach(info, device)

    def _check_source(self, src: Any) -> None:
        super()._check_source(src)
        if src.max_cache_len != self.max_cache_len:
            raise ConfigError(
                f"the source static cache has max_cache_len={src.max_cache_len}, this one "
                f"{self.max_cache_len}: whole-buffer copies need equal sizes"
            )


class SwappedState(Slot):
    """A fixed-size state in ``copies`` buffers (two: the step reads one and writes the other, and the commit swaps
    them; a failed step leaves the one it read); the first step of a sequence reads zeros."""

    copies = 2

    def __init__(self, entry: CacheEntry, device: Device):
        super().__init__(entry)
        self.device = device
        self.buffers: list[DeviceTensor] = []
        self.current = 0  # the buffer the next step reads

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        """Every buffer of the state."""
        return tuple(self.buffers)

    @property
    def holding(self) -> DeviceTensor:
        """The buffer holding the state now."""
        return self.buffers[self.current]

    def allocate(self) -> list[DeviceTensor]:
        """``copies`` zeroed buffers of the state's shape."""
        self.buffers = zeros_all(self.device, [(self.entry.dims, self.entry.dtype)] * self.copies)
        return list(self.buffers)

    def binding_key(self, length: int) -> Hashable:
        """Which buffer is read, and whether zeros are (a sequence's first step)."""
        return length == 0, self.current

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        """The held buffer (zeros at a sequence's start) as the past; the next buffer as the present, in place."""
        e, written = self.entry, self.buffers[(self.current + 1) % self.copies]
        binding.input(e.past, np.zeros(e.dims, e.dtype) if length == 0 else self.holding)
        binding.output(e.present, written)
        return {e.present: written.data_ptr}

    def commit(self, result: RunResult) -> list[DeviceTensor]:
        """The buffer just written holds the state now."""
        self.current = (self.current + 1) % self.copies
        return []

    def rollback(self) -> None:
        """Back to the buffer the undone step read (with two copies, left untouched)."""
        self.current = (self.current - 1) % self.copies

    def receive(self, src: Any) -> tuple[list[DeviceTensor], int]:
        """A copy of the state ``src`` holds, into the first buffer."""
        self.current = 0  # before the copy: a failure leaves seq_length 0, and the first step reads zeros
        copy_tensor(src.holding, self.buffers[0])
        return [], self.buffers[0].nbytes

    def reset(self) -> None:
        """The next step reads zeros (the buffers stay)."""
        self.current = 0

    def release(self) -> None:
        """Release every buffer."""
        release_all(self.buffers)
        self.buffers, self.current = [], 0


class InPlaceState(SwappedState):
    """A fixed-size state in one buffer, read and written by the same run: a step that fails after its run has
    overwritten the state, which cannot be undone (the cache then refuses to go on until it is reset)."""

    copies = 1
    undoable = False


STATE_SLOTS = {"swap": SwappedState, "in-place": InPlaceState}
