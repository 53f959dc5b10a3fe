"""Each OS's adapter query, read into ``AdapterFacts``: the Vulkan loader's devices on Linux (``from_vulkan``), the
display adapters Windows lists (``WINDOWS_QUERY``, ``parse_windows``) and ``system_profiler`` on macOS
(``parse_macos``). Pure functions of the query's output; fields a query does not report stay None."""

from __future__ import annotations

import json
import re
from typing import Any

from .facts import VENDORS, AdapterFacts

# Windows display adapters that are not a GPU: with only these, Dawn's D3D12 backend runs on WARP
_NOT_A_GPU = re.compile(r"Microsoft (Basic|Remote|Hyper-V)|Citrix|Parsec|Virtual Display|Indirect Display", re.I)
WARP = "Microsoft Basic Render Driver (WARP)"
_MAKERS = {"nvidia": "nvidia", "advanced micro": "amd", "amd": "amd", "intel": "intel", "qualcomm": "qualcomm"}


def from_vulkan(d: Any) -> AdapterFacts:
    """An AdapterFacts of a ``kvlab.ort.runtime.adapters.VulkanDevice``."""
    vendor = VENDORS.get(d.vendor_id or -1, "")
    return AdapterFacts(
        d.name,
        "vulkan",
        d.type,
        vendor=vendor,
        architecture="swiftshader" if "swiftshader" in d.name.lower() else "",
        is_fallback=d.type == "cpu",
        shader_f16=d.shader_f16,
        memory_bytes=d.memory_bytes,
        max_binding_bytes=d.max_storage_buffer_range,
        source="the Vulkan loader: vkGetPhysicalDeviceProperties",
    )


# Present display adapters, and the display drivers' memory sizes (Win32_VideoController.AdapterRAM stops at 4 GiB)
WINDOWS_QUERY = (
    "$ErrorActionPreference='SilentlyContinue'; "
    "$c = @(Get-CimInstance Win32_VideoController | Select-Object Name,AdapterCompatibility,AdapterRAM,PNPDeviceID,"
    "Status); $r = @(Get-ItemProperty 'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\Class\\"
    "{4d36e968-e325-11ce-bfc1-08002be10318}\\0*' | Select-Object DriverDesc,'HardwareInformation.qwMemorySize'); "
    "ConvertTo-Json -Compress -Depth 3 @{controllers=$c; registry=$r}"
)


def parse_windows(text: str) -> list[AdapterFacts]:
    """The adapters Dawn's D3D12 backend can get, from WINDOWS_QUERY's JSON: each present GPU, or WARP (Windows'
    CPU implementation of D3D12) when no display adapter is a GPU."""
    data = json.loads(text)
    memory = {}
    for r in _as_list(data.get("registry")):
        size = r.get("HardwareInformation.qwMemorySize")
        if r.get("DriverDesc") and isinstance(size, int):
            memory[r["DriverDesc"]] = size
    out = []
    for c in _as_list(data.get("controllers")):
        name, pnp = str(c.get("Name") or ""), str(c.get("PNPDeviceID") or "")
        if (
            not name
            or c.get("Status") not in (None, "OK")
            or _NOT_A_GPU.search(name)
            or pnp.upper().startswith("ROOT\\")
        ):
            continue
        ven = re.search(r"VEN_([0-9A-Fa-f]{4})", pnp)
        vendor = VENDORS.get(int(ven.group(1), 16), "") if ven else ""
        if not vendor:  # the vendor's name as Windows writes it
            maker = str(c.get("AdapterCompatibility") or "").lower()
            vendor = next((v for k, v in _MAKERS.items() if k in maker), "")
        ram = c.get("AdapterRAM") if isinstance(c.get("AdapterRAM"), int) else None
        out.append(
            AdapterFacts(
                name,
                "d3d12",
                _windows_type(vendor, name),
                vendor=vendor,
                memory_bytes=memory.get(name, ram),
                source="Win32_VideoController (the type guessed from vendor and name)",
            )
        )
    if not out:
        out.append(
            AdapterFacts(
                WARP, "d3d12", "cpu", vendor="microsoft", is_fallback=True, source="no display adapter is a GPU"
            )
        )
    return out


def _as_list(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, dict)]


def _windows_type(vendor: str, name: str) -> str:
    if vendor == "nvidia":
        return "discrete"
    if vendor == "amd":
        return (
            "integrated"
            if re.search(r"Radeon\(TM\) Graphics|Radeon Graphics|Vega \d+ Graphics|\d+M", name)
            else "discrete"
        )
    if vendor == "intel":
        return "discrete" if re.search(r"Arc(\(TM\))? [AB]\d", name) else "integrated"
    if vendor in ("qualcomm", "arm"):
        return "integrated"
    return "other"


def parse_macos(text: str, ram_bytes: int | None) -> list[AdapterFacts]:
    """The GPUs ``system_profiler -json SPDisplaysDataType`` lists, with Metal support; Apple silicon's memory is
    the unified memory (``ram_bytes``)."""
    out = []
    for g in _as_list(json.loads(text).get("SPDisplaysDataType")):
        name = str(g.get("sppci_model") or g.get("_name") or "")
        vendor_text = str(g.get("spdisplays_vendor") or g.get("sppci_vendor") or "").lower()
        vendor = next(
            (v for v in ("apple", "amd", "ati", "nvidia", "intel") if v in vendor_text or v in name.lower()), ""
        )
        vendor = "amd" if vendor == "ati" else vendor
        metal = str(g.get("spdisplays_mtlgpufamilysupport") or g.get("spdisplays_metal") or "")
        family = re.search(r"metal(\d+)", metal.lower())
        apple = vendor == "apple"
        out.append(
            AdapterFacts(
                name,
                "metal",
                "integrated" if apple or vendor == "intel" else "discrete" if vendor else "other",
                vendor=vendor,
                architecture=f"metal-{family.group(1)}" if family else "",
                memory_bytes=ram_bytes if apple else _macos_bytes(str(g.get("spdisplays_vram") or "")),
                source="system_profiler SPDisplaysDataType" + ("" if metal else " (no Metal support listed)"),
            )
        )
    return out


def _macos_bytes(text: str) -> int | None:
    m = re.match(r"\s*(\d+)\s*(MB|GB)", text)
    return int(m.group(1)) << (20 if m.group(2) == "MB" else 30) if m else None
