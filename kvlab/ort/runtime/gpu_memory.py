"""The GPU memory this process holds, as the driver accounts it through NVML (``nvidia-ml-py``): everything the
process holds on the GPU (weights, Dawn's pools, kernels), in the driver's allocation granularity; None without NVML
or its GPU."""

from __future__ import annotations

import os
from typing import Any

from ...core.records import StepRecord


class GpuMemory:
    """Reads this process's GPU memory; as a step hook, keeps one reading per step (``.bytes``, ``.steps``)."""

    def __init__(self, index: int = 0) -> None:
        self.available = False
        self.steps: list[int] = []
        self.bytes: list[int] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
            self.device = pynvml.nvmlDeviceGetName(self._handle)
            self.driver = pynvml.nvmlSystemGetDriverVersion()
            self.available = True
        except Exception:  # noqa: BLE001 - no NVML driver, no pynvml: nothing to read
            self.device, self.driver = "", ""

    def read(self) -> int | None:
        """Bytes of GPU memory the driver accounts to this process now (None: not available)."""
        if not self.available:
            return None
        nvml, pid, used = self._nvml, os.getpid(), 0
        for query in (nvml.nvmlDeviceGetGraphicsRunningProcesses, nvml.nvmlDeviceGetComputeRunningProcesses):
            for p in query(self._handle):
                if p.pid == pid and p.usedGpuMemory is not None:
                    used = max(used, int(p.usedGpuMemory))
        return used

    def __call__(self, record: StepRecord) -> None:
        """As a step hook: one reading for the record's step."""
        self.sample(record.step)

    def sample(self, step: int | None = None) -> None:
        """Keep one reading, for ``step`` (default: the next index)."""
        value = self.read()
        if value is not None:
            self.steps.append(len(self.steps) if step is None else step)
            self.bytes.append(value)

    def describe(self) -> dict[str, Any]:
        """Where the readings come from, for a record: available, the GPU's name, the driver's version, the source."""
        return {
            "available": self.available,
            "device": self.device,
            "driver": self.driver,
            "source": "NVML per-process used GPU memory (driver accounting)",
        }
