"""What produced a number, kept as data: the device (adapter, backend and version, buffer cache mode) and the cache
(kind and size). Plots, tables and widgets format these fields; nothing builds a label as a string to read it back.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from .devices import DEFAULT_VALIDATION


@dataclass(frozen=True)
class Adapter:
    """What executes a device's kernels."""

    name: str  # the adapter's own name (e.g. "SwiftShader Device (Subzero)"), or the CPU model
    kind: str  # "hardware" or "software" (a CPU-emulated GPU counts as software)
    api: str  # "vulkan", "metal", "d3d12", "cpu" or "cuda"
    source: str = ""  # how it was found (the Vulkan driver manifest, ...)
    shader_f16: bool | None = None  # WebGPU: can its shaders compute in float16 (None: not known)

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


@dataclass(frozen=True)
class DeviceLabel:
    """The device a run used, as fields."""

    name: str  # "cpu", "webgpu" or "cuda"
    adapter: Adapter
    backend: str = ""  # the runtime package, e.g. "onnxruntime-webgpu", "torch"
    version: str = ""  # its version
    buffer_cache_mode: str = ""  # WebGPU storage buffer cache mode in force ("" elsewhere)
    validation_mode: str = ""  # WebGPU EP validation mode in force ("" elsewhere; kvlab's default "disabled")
    settings: str = ""  # CPU EP: its threads and spinning, and why ("2 threads, spinning: 1.9 of 2 cores idle ...")

    @property
    def runtime(self) -> str:
        """Backend and version, e.g. 'onnxruntime-webgpu 1.27.0'."""
        return f"{self.backend} {self.version}".strip()

    def __str__(self) -> str:
        mode = f", buffer cache {self.buffer_cache_mode}" if self.buffer_cache_mode else ""
        checks = self.validation_mode not in ("", DEFAULT_VALIDATION)  # named where not kvlab's default
        cpu = f", {self.settings.partition(':')[0]}" if self.settings else ""  # "2 threads, spinning"
        return f"{self.name} [{self.adapter}]{mode}{cpu}" + (f", validation {self.validation_mode}" if checks else "")


@dataclass(frozen=True)
class CacheSpec:
    """A cache's kind and size: the one naming scheme of kvlab ("dynamic", "static@512", "static@512 graph")."""

    kind: str  # "dynamic" or "static"
    max_cache_len: int | None = None  # static caches only
    variant: str = ""  # how it runs, where that differs (e.g. "graph-capture", "4KiB-pages")

    @property
    def name(self) -> str:
        """ "kind@size variant", e.g. "static@512 graph"."""
        size = f"@{self.max_cache_len}" if self.max_cache_len is not None else ""
        return f"{self.kind}{size}" + (f" {self.variant}" if self.variant else "")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class RunLabel:
    """What produced a run's numbers: every figure and table of a run is labelled from these fields."""

    model: str
    dtype: str  # of the KV cache, e.g. "float32"
    device: DeviceLabel
    cache: CacheSpec
    prefill_device: DeviceLabel | None = None  # set when the prefill ran on another device (a handoff)
    token_on_device: bool = False  # the greedy token chosen on the device (kvlab.ort.decode.greedy), not on the host
    greedy_reduction: str = ""  # how the device chose it: one of kvlab.ort.decode.greedy.REDUCTIONS
    tokens_per_read: int = 0  # greedy steps whose tokens came back to the host together (0: the token on the host)


def read_back_text(tokens_per_read: int) -> str:
    """ ", read back every N steps" for greedy tokens read back in bursts (``RunLabel.tokens_per_read`` above 1),
    else "" (each token read back as its step ends, or chosen on the host)."""
    return f", read back every {tokens_per_read} steps" if tokens_per_read > 1 else ""


def cpu_adapter() -> Adapter:
    """This machine's CPU as an adapter: its model name (from /proc/cpuinfo where there is one) and cores."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return Adapter(f"{name}, {os.cpu_count()} cores", "hardware", "cpu")
