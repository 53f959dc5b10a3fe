"""The slot kinds on ONNX Runtime (the protocol: ``kvlab.core.slots``), one small class each:

- ``GrowingKV``: keys or values the runtime allocates anew every step, one position longer (DynamicCache);
- ``RuntimeState``: a fixed-size state (conv, recurrent) the runtime allocates anew every step (DynamicCache);
- ``FixedKV``: one buffer of ``max_cache_len`` positions, bound as both the past input and the present output:
  GroupQueryAttention writes the new positions in place (StaticCache);
- ``SwappedState``: two buffers, one read and the other written, swapped at each commit: a failed step leaves the
  state it read (StaticCache, ``states="swap"``);
- ``InPlaceState``: one buffer, read and written by the same run: half the memory, and a failed step cannot be
  undone (StaticCache, ``states="in-place"``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from ...core.layout import CacheEntry
from ...core.slots import Crop, Slot
from ..runtime.device import Device, copy_tensor
from ..runtime.session import Binding, DeviceTensor, RunResult, release_all, zeros_all


class RuntimeState(Slot):
    """The runtime allocates this entry's present every step; it becomes the next step's past (the first step
    reads zeros). The present it replaces is released when the step settles."""

    fresh_bindings = True

    def __init__(self, entry: CacheEntry, device: Device):
        super().__init__(entry)
        self.device = device
        self.present: DeviceTensor | None = None  # the past of the next step
        self.previous: DeviceTensor | None = None  # what the last commit replaced, until the step settles

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        return (self.present,) if self.present is not None else ()

    def bytes(self, length: int) -> tuple[int, int]:
        e = self.entry
        return (0, e.nbytes(length)) if e.grows else (e.nbytes(0), 0)

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        e = self.entry
        binding.input(e.past, self.present if self.present is not None else np.zeros(e.dims, e.dtype))
        binding.output_new(e.present)
        return {}

    def check(self, result: RunResult, length: int) -> str:
        got, want = result.new[self.entry.present].shape, self.expected(length)
        return "" if got == want else f"present {self.entry.present} came back with shape {got}, expected {want}"

    def expected(self, length: int) -> tuple[int, ...]:
        """The present's shape after a step to ``length`` positions: a state keeps the shape of its past."""
        return self.present.shape if self.present is not None else self.entry.dims

    def commit(self, result: RunResult) -> list[DeviceTensor]:
        """Takes the present out of ``result`` (what it leaves there is the caller's to release)."""
        self.previous, self.present = self.present, result.new.pop(self.entry.present)
        return [self.present]

    def settle(self) -> None:
        if self.previous is not None:
            self.previous.release()
            self.previous = None

    def rollback(self) -> None:
        if self.present is not None:
            self.present.release()
        self.present, self.previous = self.previous, None

    def crop(self, length: int, n: int) -> Crop:
        if not self.can_crop(length, n):
            raise self.refuse_crop(length, n)
        return Crop(self.release)

    def can_crop(self, length: int, n: int) -> bool:
        return not n

    def receive(self, src: Slot) -> tuple[list[DeviceTensor], int]:
        """The copied present becomes the first past on this device."""
        held = src.tensors[0]
        made = zeros_all(self.device, [(held.shape, held.dtype)])
        try:
            copy_tensor(held, made[0])
        except BaseException:
            release_all(made)
            raise
        self.present = made[0]
        return made, held.nbytes

    def reset(self) -> None:
        self.release()

    def release(self) -> None:
        release_all([t for t in (self.present, self.previous) if t is not None])
        self.present = self.previous = None


class GrowingKV(RuntimeState):
    """Keys or values the runtime allocates anew every step, one position longer (a full copy of the past)."""

    def expected(self, length: int) -> tuple[int, ...]:
        """The past's shape, ``length`` positions long: [batch, kv heads, positions, head size]."""
        past = super().expected(length)
        return past[:2] + (length,) + past[3:]

    def can_crop(self, length: int, n: int) -> bool:
        return True

    def crop(self, length: int, n: int) -> Crop:
        """Keeps a copy of the first ``n`` positions (through the host), released with the present it replaces."""
        if not n or self.present is None:
            return Crop(self.release)
        host = np.ascontiguousarray(self.present.numpy()[:, :, :n])
        made = zeros_all(self.device, [(host.shape, host.dtype)])
        try:
            self.device.backend.write(made[0].ortvalue(), host)
        except BaseException:
            release_all(made)
            raise

        def apply() -> None:
            self.release()
            self.present = made[0]

        return Crop(apply, made)


class FixedKV(Slot):
    """One buffer of ``capacity`` positions, bound as both the past input and the present output (the runtime
    writes the new positions in place); its binding never changes, so a step has nothing to do here."""

    steps = False

    def __init__(self, entry: CacheEntry, device: Device, capacity: int):
        super().__init__(entry)
        self.device, self.capacity = device, capacity
        self.buffer: DeviceTensor | None = None

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        return (self.buffer,) if self.buffer is not None else ()

    def bytes(self, length: int) -> tuple[int, int]:
        return 0, self.entry.nbytes(self.capacity)

    def allocate(self) -> list[DeviceTensor]:
        self.buffer = zeros_all(self.device, [(self.entry.shape(self.capacity), self.entry.dtype)])[0]
        return [self.buffer]

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        binding.input(self.entry.past, self.buffer)
        binding.output(self.entry.present, self.buffer)
        return {self.entry.present: self.buffer.data_ptr}

    def crop(self, length: int, n: int) -> Crop:
        return Crop()  # the buffer stays: the positions from n on are written again before they are read

    def receive(self, src: Slot) -> tuple[list[DeviceTensor], int]:
        copy_tensor(src.tensors[0], self.buffer)  # one whole-buffer copy: the source is as long (StaticCache checks)
        return [], self.buffer.nbytes

    def release(self) -> None:
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None


class SwappedState(Slot):
    """A fixed-size state in ``copies`` buffers (two: the step reads one and writes the other, and the commit swaps
    them); the first step of a sequence reads zeros."""

    copies = 2

    def __init__(self, entry: CacheEntry, device: Device):
        super().__init__(entry)
        self.device = device
        self.buffers: list[DeviceTensor] = []
        self.current = 0  # the buffer the next step reads

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        return tuple(self.buffers)

    @property
    def holding(self) -> DeviceTensor:
        """The buffer holding the state now."""
        return self.buffers[self.current]

    def bytes(self, length: int) -> tuple[int, int]:
        return self.copies * self.entry.nbytes(0), 0

    def allocate(self) -> list[DeviceTensor]:
        self.buffers = zeros_all(self.device, [(self.entry.dims, self.entry.dtype)] * self.copies)
        return list(self.buffers)

    def binding_key(self, length: int) -> Hashable:
        return length == 0, self.current

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        e, written = self.entry, self.buffers[(self.current + 1) % self.copies]
        binding.input(e.past, np.zeros(e.dims, e.dtype) if length == 0 else self.holding)
        binding.output(e.present, written)
        return {e.present: written.data_ptr}

    def commit(self, result: RunResult) -> list[DeviceTensor]:
        self.current = (self.current + 1) % self.copies  # the buffer just written holds the state now
        return []

    def rollback(self) -> None:
        self.current = (self.current - 1) % self.copies  # the buffer the undone step read was left untouched

    def crop(self, length: int, n: int) -> Crop:
        if not self.can_crop(length, n):
            raise self.refuse_crop(length, n)
        return Crop(self.reset)

    def can_crop(self, length: int, n: int) -> bool:
        return not n

    def receive(self, src: Any) -> tuple[list[DeviceTensor], int]:
        self.current = 0  # before the copy: a failure leaves seq_length 0, and the first step reads zeros
        copy_tensor(src.holding, self.buffers[0])
        return [], self.buffers[0].nbytes

    def reset(self) -> None:
        self.current = 0

    def release(self) -> None:
        release_all(self.buffers)
        self.buffers, self.current = [], 0


class InPlaceState(SwappedState):
    """A fixed-size state in one buffer, read and written by the same run: a step that fails after its run has
    overwritten the state, which cannot be undone (the cache then refuses to go on until it is reset)."""

    copies = 1
    undoable = False
