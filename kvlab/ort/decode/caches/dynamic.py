"""``DynamicCache``: the runtime allocates every present anew each step, one position longer, and the cache takes it
as the next step's past:

1. Nothing is allocated up front; the first step reads empty pasts (zeros for a state).
2. Each step binds the last step's present as its past and asks the runtime for a new output (``RuntimeState``).
3. ``commit`` checks the present's shape and takes it; ``settle`` then releases the past it replaced, ``rollback``
   the new one instead.

Pasts stay on the device between steps, so the churn a record counts is the runtime's own: 2 x layers tensors a
step, growing with the context."""

from __future__ import annotations

import numpy as np

from ....core.cache_layout import CacheEntry
from ....core.errors import ConfigError
from ....core.labels import CacheSpec
from ....core.slots import Crop, Slot
from ...runtime.device import Device, copy_tensor
from ...runtime.session import Binding, DeviceTensor, RunResult, release_all, zeros_all
from .kv_precision import packed_entry
from .ort_cache import OrtCache


class RuntimeState(Slot):
    """An entry whose present the runtime allocates every step; it becomes the next step's past (the first step
    reads zeros). Used as is for a fixed-size state (conv, recurrent), whose present keeps its past's shape."""

    fresh_bindings = True

    def __init__(self, entry: CacheEntry, device: Device):
        super().__init__(entry)
        self.device = device
        self.present: DeviceTensor | None = None  # the past of the next step
        self.previous: DeviceTensor | None = None  # what the last commit replaced, until the step settles

    @property
    def tensors(self) -> tuple[DeviceTensor, ...]:
        """The present the last step returned (none before the first step)."""
        return (self.present,) if self.present is not None else ()

    def bind(self, binding: Binding, length: int) -> dict[str, int]:
        """The last present as the past (zeros at first), and a new output the runtime allocates."""
        e = self.entry
        binding.input(e.past, self.present if self.present is not None else np.zeros(e.dims, e.dtype))
        binding.output_new(e.present)
        return {}

    def check(self, result: RunResult, length: int) -> str:
        """The new present's shape against ``expected(length)``."""
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
        """Release the past the commit replaced."""
        if self.previous is not None:
            self.previous.release()
            self.previous = None

    def rollback(self) -> None:
        """Release the new present; the past it replaced is held again."""
        if self.present is not None:
            self.present.release()
        self.present, self.previous = self.previous, None

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
        """Release the present: the next step reads zeros (a new sequence)."""
        self.release()

    def release(self) -> None:
        """Release the present and any past not settled yet."""
        release_all([t for t in (self.present, self.previous) if t is not None])
        self.present = self.previous = None


class GrowingKV(RuntimeState):
    """Keys or values the runtime allocates anew every step, one position longer (a full copy of the past)."""

    def expected(self, length: int) -> tuple[int, ...]:
        """The past's shape, ``length`` positions long: [batch, kv heads, positions, head size]."""
        past = super().expected(length)
        return past[:2] + (length,) + past[3:]

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


class DynamicCache(OrtCache):
    """The runtime allocates new ``present.*`` tensors every step, one token longer, and the previous ones are
    released (see the module docstring). ``kv_precision``: None, "int8" or "int4" (``OrtCache``). ConfigError for a bad
    argument, and for a ``max_cache_len``."""

    kind = "dynamic"

    def __init__(self, kv_precision: str | None = None, *, max_cache_len: object = None):
        if max_cache_len is not None:
            raise ConfigError(
                f"DynamicCache(max_cache_len={max_cache_len!r}): a dynamic cache grows with the sequence and has no "
                "size; use StaticCache(max_cache_len) for a fixed one"
            )
        super().__init__(kv_precision)

    def _slot(self, entry: CacheEntry, device: Device) -> Slot:
        """A ``GrowingKV`` for keys and values, a ``RuntimeState`` for a state."""
        if entry.grows:
            return GrowingKV(packed_entry(entry, self.kv_precision), device)
        return RuntimeState(entry, device)

    @property
    def spec(self) -> CacheSpec:
        """ "dynamic" (with "kv-int8" / "kv-int4" for packed KV)."""
        return CacheSpec(self.kind, variant=self._kv_variant())

    def empty_like(self) -> DynamicCache:
        """A new DynamicCache at the same KV precision."""
        return DynamicCache(self.kv_precision)
