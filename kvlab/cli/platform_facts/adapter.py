"""Which adapter WebGPU gets (``pick``, Dawn's high-performance preference), in words (``describe``), and what stops
it with a fix (``adapter_problems``). Pure functions of ``PlatformFacts``."""

from __future__ import annotations

from typing import Any

from .facts import BACKENDS, AdapterFacts, PlatformFacts

_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "other": 3, "cpu": 4}  # Dawn's preference, high-performance
# What a headless machine's vendor Vulkan driver may need beside it (the GL vendor-neutral dispatch)
GLVND = ("libvulkan1", "libglvnd0", "libglx0", "libegl1", "libopengl0", "libgl1", "libgles2")


def pick(facts: PlatformFacts) -> AdapterFacts | None:
    """The adapter the WebGPU EP will get (Dawn, high-performance: discrete, then integrated, ..., a CPU one last)."""
    return min(facts.adapters, key=lambda a: _RANK.get(a.adapter_type, 3), default=None)


def _apt(facts: PlatformFacts, packages: list[str] | tuple[str, ...]) -> str:
    return f"sudo apt-get install {' '.join(packages)}" if facts.apt else f"install {' '.join(packages)} (Debian names)"


def adapter_problems(facts: PlatformFacts) -> list[dict[str, str]]:
    """Why WebGPU has no adapter, or only a CPU one, when a fix exists."""
    out = []
    chosen = pick(facts)
    for d in facts.drivers:  # a GPU whose Vulkan driver is installed but cannot start: what provides the rest
        fix = (
            f"{_apt(facts, d['packages'])} (a headless machine's vendor driver may need glvnd: {_apt(facts, GLVND)})"
            if d.get("packages")
            else f"install what {d['library']} needs (`ldd {d['library']}` lists it)"
        )
        out.append({"problem": f"a GPU Vulkan driver is installed but cannot start: {d['error']}", "fix": fix})
    if facts.system == "Linux":
        if facts.vulkan_loader is False:
            out.append(
                {
                    "problem": "no Vulkan loader (libvulkan.so.1): WebGPU cannot start on Linux without it",
                    "fix": _apt(facts, ["libvulkan1"])
                    + ("" if facts.hardware_icds or facts.swiftshader else " chromium-common (SwiftShader)"),
                }
            )
        elif chosen is None and " set by the user" in facts.vulkan_note:
            fix = "unset it: kvlab then points the loader at a GPU driver, or at SwiftShader"
            if not (facts.hardware_icds or facts.swiftshader):
                fix += f" ({_apt(facts, ['libvulkan1', 'chromium-common'])} installs SwiftShader)"
            out.append(
                {"problem": f"no WebGPU adapter: the Vulkan loader finds no device ({facts.vulkan_note})", "fix": fix}
            )
        elif chosen is None and not facts.drivers:
            out.append(
                {
                    "problem": "no WebGPU adapter: no GPU Vulkan driver and no SwiftShader"
                    + (f" ({facts.vulkan_note})" if facts.vulkan_note else ""),
                    "fix": f"{_apt(facts, ['libvulkan1', 'chromium-common'])} (SwiftShader; `python scripts/setup.py` "
                    "does it as root), or install your GPU's Vulkan driver",
                }
            )
    elif facts.system == "Darwin" and chosen is not None and "no Metal" in chosen.source:
        out.append({"problem": f"{chosen.description} lists no Metal support", "fix": "update macOS (14 or later)"})
    elif chosen is None and facts.query_error:
        out.append({"problem": f"the adapter query failed: {facts.query_error}", "fix": "run `kvlab doctor` again"})
    return out


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
