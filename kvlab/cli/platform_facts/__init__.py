"""``kvlab doctor``'s platform logic: this machine's facts, gathered at one boundary (``collect``), and what they mean
(``assess``: which adapter WebGPU gets and why, the problems with one fix each, and ``advice``: which notebook
settings show the dynamic-vs-static difference live here), as pure functions of those facts.

The facts come from each OS's own adapter query: the Vulkan loader on Linux (``kvlab.ort.runtime.adapters``, the query
Dawn itself makes), the display adapters Windows lists (``Win32_VideoController`` and the display driver's registry
entries, through PowerShell; Dawn's D3D12 backend then picks the high-performance one, or WARP when none is a
GPU), and ``system_profiler SPDisplaysDataType`` on macOS (Metal). Fields a query does not report stay None.
"""

from __future__ import annotations

from typing import Any

from .adapter import GLVND, adapter_problems, describe, pick
from .collect import collect
from .facts import BACKENDS, GIB, VENDORS, AdapterFacts, PlatformFacts
from .packages import NO_DEPS, PLUGIN_PINS, TORCH, TORCH_CPU_INDEX, WEBGPU_PIN, package_problems
from .queries import WARP, WINDOWS_QUERY, from_vulkan, parse_macos, parse_windows
from .settings import EVIDENCE, PHI4_KV_BYTES, Evidence, advice, recorded_evidence

__all__ = [
    "BACKENDS",
    "EVIDENCE",
    "GIB",
    "GLVND",
    "NO_DEPS",
    "PHI4_KV_BYTES",
    "PLUGIN_PINS",
    "TORCH",
    "TORCH_CPU_INDEX",
    "VENDORS",
    "WARP",
    "WEBGPU_PIN",
    "WINDOWS_QUERY",
    "AdapterFacts",
    "Evidence",
    "PlatformFacts",
    "adapter_problems",
    "advice",
    "assess",
    "collect",
    "describe",
    "from_vulkan",
    "package_problems",
    "parse_macos",
    "parse_windows",
    "pick",
    "recorded_evidence",
]


def assess(facts: PlatformFacts) -> dict[str, Any]:
    """Doctor's verdict: the adapter in words, every problem with its fix, and the advice."""
    return {
        "adapter": describe(facts),
        "problems": package_problems(facts) + adapter_problems(facts),
        "advice": advice(facts),
    }
