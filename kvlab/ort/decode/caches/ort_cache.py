"""What every cache does on ONNX Runtime, over the cache of ``kvlab.core.cache``: the session its steps run on (the
model's graph, or its greedy-token graph), its KV precision, and where the greedy token waits between steps."""

from __future__ import annotations

from typing import Any

from ....core.cache import Cache
from ....core.errors import CapacityError
from ...runtime.device import Device
from ...runtime.session import Session
from ..greedy import AUTO, REDUCTIONS, DeviceToken, greedy_graph, reduction_for
from .kv_precision import check_kv_precision, check_runs_here, session_options
from .shared_kv import shared_window_on, shared_window_refusal


class OrtCache(Cache):
    """A cache whose steps run on ONNX Runtime, its KV at ``kv_precision`` (None: the model's dtype; "int8", "int4"). On
    WebGPU, sequences longer than a KV-shared sliding layer's window are a CapacityError. ConfigError for a bad
    argument."""

    reductions: tuple[str, ...] = REDUCTIONS  # the greedy graphs its session can run (``token_on_device``)
    burst_reads = True  # greedy steps can keep their tokens on the device for a later read (``Stepper.decode``)

    def __init__(self, kv_precision: str | None = None, check_every: int | None = None):
        super().__init__(check_every)
        self.kv_precision = check_kv_precision(kv_precision, type(self).__name__)
        self._shared_window = 0  # the smallest window of a KV-shared sliding layer, on WebGPU (0: no limit)

    def session(self, device: Device, model: Any, reduction: str = "") -> Session:
        """The device's session of the model's graph (with the greedy token on the device: its greedy graph of
        ``reduction``), at the cache's KV precision. Raises what opening the session raises."""
        path, label = model.onnx_path, f"model {model.name}"
        if reduction:
            path, label = greedy_graph(model, reduction), f"{label} (greedy token on the device, {reduction})"
        return device.session(path, label, session_options(self.kv_precision))

    @classmethod
    def auto_reduction(cls, vocab_size: int, device: Device) -> str:
        """What ``token_on_device="auto"`` runs with this kind of cache: ``kvlab.ort.decode.greedy.auto_reduction``
        where the cache's session runs that graph, else the host path ("")."""
        chosen = reduction_for(AUTO, vocab_size, device)
        return chosen if chosen in cls.reductions else ""

    def device_token(self, device: Device, dtype: Any, size: int = 2) -> DeviceToken:
        """Where a stepper keeps the greedy token between steps: a ring of ``size`` device tensors of its own."""
        return DeviceToken(device, dtype, size)

    def check_capacity(self, positions: int) -> None:
        """CapacityError when ``positions`` exceed the window of a KV-shared sliding layer on WebGPU."""
        if self._shared_window and positions > self._shared_window:
            raise CapacityError(shared_window_refusal(self._info, positions, self._shared_window))

    def _attach(self, info: Any, device: Device) -> None:
        if self.kv_precision is not None:
            check_runs_here(self.kv_precision, type(self).__name__, info, device)
        self._shared_window = shared_window_on(info, device)
        super()._attach(info, device)

    def _kv_variant(self, *parts: str) -> str:
        """A spec's variant: the non-empty ``parts``, then "kv-<precision>" where not the model's, "+"-joined."""
        return "+".join(filter(None, [*parts, self.kv_precision and f"kv-{self.kv_precision}"]))
