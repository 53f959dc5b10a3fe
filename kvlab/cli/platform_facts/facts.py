"""What doctor's verdict depends on, as data: the machine's facts (``PlatformFacts``) and each adapter an OS's query
reports (``AdapterFacts``), in WebGPU's terms. Built by ``collect`` on a real machine, by hand in tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
# Khronos and PCI vendor ids, as Vulkan and Windows report them
VENDORS = {
    0x10DE: "nvidia",
    0x1002: "amd",
    0x1022: "amd",
    0x8086: "intel",
    0x106B: "apple",
    0x13B5: "arm",
    0x5143: "qualcomm",
    0x1AE0: "google",
    0x10005: "mesa",
    0x1414: "microsoft",
    0x14E4: "broadcom",
    0x1010: "imagination",
}
BACKENDS = {"vulkan": "Vulkan", "d3d12": "D3D12", "metal": "Metal"}


@dataclass(frozen=True)
class AdapterFacts:
    """One adapter as the OS's query reports it, in WebGPU's terms (GPUAdapterInfo and its limits)."""

    description: str  # the adapter's name as the OS's query gives it, e.g. "SwiftShader Device (Subzero)"
    backend_type: str  # "vulkan", "d3d12" or "metal"
    adapter_type: str  # "discrete", "integrated", "virtual", "cpu" or "other"
    vendor: str = ""  # "nvidia", "amd", "intel", "apple", "google", "microsoft", "mesa", ...
    architecture: str = ""  # where the query says it ("swiftshader", "metal-3"); else ""
    is_fallback: bool = False  # a CPU implementation of the GPU API (SwiftShader, lavapipe, WARP)
    shader_f16: bool | None = None  # None: this query cannot tell
    memory_bytes: int | None = None  # device-local memory (unified memory on Apple silicon)
    max_binding_bytes: int | None = None  # largest storage buffer binding (Vulkan maxStorageBufferRange)
    source: str = ""  # which query said so


@dataclass(frozen=True)
class PlatformFacts:
    """Everything doctor's verdict depends on. Built by ``collect`` on a real machine, by hand in tests."""

    system: str  # platform.system(): "Linux", "Windows", "Darwin"
    machine: str  # platform.machine(): "x86_64", "AMD64", "arm64"
    python: str  # the interpreter: every pip command doctor prints starts with it
    versions: dict[str, str] = field(default_factory=dict)  # kvlab.ort.runtime.backend.versions()
    plugin: bool = False  # the plugin route (onnxruntime-ep-webgpu) is installed
    adapters: tuple[AdapterFacts, ...] = ()  # what the adapter query returned
    query_error: str = ""  # why the adapter query returned nothing, when it failed
    vulkan_loader: bool | None = None  # Linux: libvulkan.so.1 loads (None elsewhere)
    vulkan_note: str = ""  # what kvlab told the Vulkan loader (kvlab.ort.runtime.adapters.configure_vulkan)
    hardware_icds: tuple[str, ...] = ()  # Linux: GPU Vulkan driver manifests found
    swiftshader: bool = False  # Linux: SwiftShader's manifest is installed (Debian's chromium-common)
    drivers: tuple[
        dict[str, Any], ...
    ] = ()  # Linux: GPU drivers that cannot start (kvlab.ort.runtime.adapters.DriverProblem)
    ram_bytes: int | None = None
    apt: bool = False  # apt-get is there (Debian/Ubuntu): system fixes name its packages
