"""``kvlab doctor``'s platform logic: this machine's facts, gathered at one boundary (``collect``), and what they mean
(``assess``: which adapter WebGPU gets and why, the problems with one fix each, and ``advice``: which notebook
settings show the dynamic-vs-static difference live here), as pure functions of those facts.

The facts come from each OS's own adapter query: the Vulkan loader on Linux (``kvlab.ort.runtime.adapters``, the query
Dawn itself makes), the display adapters Windows lists (``Win32_VideoController`` and the display driver's registry
entries, through PowerShell; Dawn's D3D12 backend then picks the high-performance one, or WARP when none is a
GPU), and ``system_profiler SPDisplaysDataType`` on macOS (Metal). Fields a query does not report stay None.

The room: the facts (``facts``), their gathering (``collect``, ``queries``), what they mean (``adapter``,
``packages``, ``settings``). It imports the standard library and ``kvlab.ort.runtime`` (the Vulkan query) only;
``kvlab.cli.doctor`` imports it.
"""

from __future__ import annotations

from typing import Any

from .adapter import adapter_problems, describe
from .collect import collect
from .facts import GIB, PlatformFacts
from .packages import NO_DEPS, PLUGIN_PINS, TORCH, TORCH_CPU_INDEX, WEBGPU_PIN, package_problems
from .queries import from_vulkan, parse_macos, parse_windows
from .settings import advice

__all__ = [
    "GIB",
    "NO_DEPS",
    "PLUGIN_PINS",
    "TORCH",
    "TORCH_CPU_INDEX",
    "WEBGPU_PIN",
    "PlatformFacts",
    "advice",
    "assess",
    "collect",
    "from_vulkan",
    "parse_macos",
    "parse_windows",
]


def assess(facts: PlatformFacts) -> dict[str, Any]:
    """Doctor's verdict: the adapter in words, every problem with its fix, and the advice."""
    return {
        "adapter": describe(facts),
        "problems": package_problems(facts) + adapter_problems(facts),
        "advice": advice(facts),
    }
