"""The two ONNX Runtime packages behind the one Backend seam.

The full run (scripts/full_run.sh) runs every test marked ``package`` again in .venv-plugin (onnxruntime 1.31.1 +
onnxruntime-ep-webgpu 0.4.0, made by ``bash scripts/setup.sh --full`` or ``--plugin``). The tests here check what
the plugin route does differently, on its real runtime; in .venv they check the built-in route."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_python

import kvlab
from kvlab import DeviceError, open_device
from kvlab.ort.runtime.builtin import BuiltinWebGpu
from kvlab.ort.runtime.device import backend
from kvlab.ort.runtime.plugin import PluginWebGpu, installed

REPO = Path(__file__).resolve().parents[1]
on_plugin = pytest.mark.skipif(not installed(), reason="the plugin route: runs in .venv-plugin")


def test_the_installed_package_picks_the_backend():
    if installed():
        assert type(backend()) is PluginWebGpu and backend().package == "onnxruntime-ep-webgpu"
        assert backend().version.startswith("0.4.0 on onnxruntime 1.31")
    else:
        assert type(backend()) is BuiltinWebGpu and backend().package == "onnxruntime-webgpu"


def test_labels_name_the_package_that_runs_each_device():
    cpu, gpu = open_device("cpu").label, open_device("webgpu").label
    if installed():  # the CPU EP is onnxruntime's; the WebGPU EP the plugin library's, on that onnxruntime
        assert (cpu.backend, gpu.backend) == ("onnxruntime", "onnxruntime-ep-webgpu")
        assert gpu.runtime.startswith("onnxruntime-ep-webgpu 0.4.0 on onnxruntime 1.31")
    else:
        assert cpu.runtime == gpu.runtime == "onnxruntime-webgpu 1.27.0"


@on_plugin
def test_plugin_sessions_run_on_the_ep_with_their_options(toy):
    session = open_device("webgpu").session(toy.onnx_path)
    assert session.ort.get_providers()[0] == "WebGpuExecutionProvider"
    assert not any(n.startswith(("GroupQueryAttention", "MatMul")) for n in session.cpu_nodes)
    if open_device("webgpu").adapter.kind == "software":  # SwiftShader: the EP lists it only when told it may
        assert os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER") == "1"


@on_plugin
def test_an_option_the_ep_rejects_is_an_error_not_a_silent_cpu_session(toy):
    """ONNX Runtime falls back to a CPU-only session when the EP rejects an option value; kvlab says so."""
    dev = open_device("webgpu")
    with pytest.raises(DeviceError, match=r"did not take the session .*'storageBufferCacheMode': 'nonsense'"):
        backend().create_session(str(toy.onnx_path), dev, {"storageBufferCacheMode": "nonsense"})


@on_plugin
def test_device_tensors_are_allocated_directly_and_zeroed():
    dev = open_device("webgpu")
    before = dev.live_tensors
    for dtype in (np.float32, np.float16, np.int64):
        t = dev.zeros((2, 3, 4), dtype)
        assert t.ortvalue().device_name() == "webgpu" and (t.numpy() == 0).all() and t.dtype == dtype
        backend().write(t.ortvalue(), np.full((2, 3, 4), 7, dtype))
        assert (t.numpy() == 7).all()
        t.release()
    assert dev.live_tensors == before


@on_plugin
def test_other_context_options_in_one_process_are_refused():
    """The plugin's WebGPU context outlives its sessions once a tensor crossed host<->device, so a second
    buffer cache mode would silently keep the first: refused (the same mode again is fine)."""
    r = run_python("""
import kvlab
d = kvlab.open_device('webgpu', buffer_cache_mode='simple')
d.zeros((4,), 'float32').release()
d.close()
kvlab.open_device('webgpu', buffer_cache_mode='simple').close()
print('same mode reopened')
try:
    kvlab.open_device('webgpu', buffer_cache_mode='disabled')
except kvlab.DeviceError as e:
    print('refused:', e)
""")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "same mode reopened" in r.stdout
    created = "{'validationMode': 'disabled', 'storageBufferCacheMode': 'simple'}"  # kvlab's validation default
    assert f"refused: this process's WebGPU context was created with {created}" in r.stdout
    assert "Use a new process" in r.stdout


@on_plugin
def test_genai_runs_the_plugin_ep_beside_kvlab_in_one_process(toy):
    """The library is registered once with ONNX Runtime and once with onnxruntime-genai (a second registration
    with ONNX Runtime would make the next session crash); both run in one process, same tokens."""
    from kvlab.ort.checks.references import genai_greedy

    with kvlab.StaticCache(64) as cache:
        ours = kvlab.generate(
            toy, [7, 81, 190, 33], cache=cache, device="webgpu", max_new_tokens=8, stop_on_eos=False
        ).token_ids
    assert genai_greedy(toy, [7, 81, 190, 33], 8, device="webgpu") == ours
    assert genai_greedy(toy, [7, 81, 190, 33], 8, device="webgpu") == ours  # a second genai model: no new registration
    with kvlab.StaticCache(64) as cache:  # and kvlab's sessions still open afterwards
        assert (
            kvlab.generate(
                toy, [7, 81, 190, 33], cache=cache, device="webgpu", max_new_tokens=8, stop_on_eos=False
            ).token_ids
            == ours
        )


@on_plugin
def test_genai_first_in_a_process_runs_the_plugin_ep():
    """genai on WebGPU before anything of kvlab's opened the device: kvlab registers the library with ONNX Runtime
    and opens its context first (genai alone answered "WebGPU execution provider is not supported in this
    build"); the process exits cleanly (kvlab's sessions go before the runtime at exit)."""
    r = run_python("""
import kvlab
from kvlab.ort.checks.references import genai_greedy
print(genai_greedy(kvlab.load('toy'), [7, 81, 190, 33], 4, device='webgpu'))
with kvlab.StaticCache(64) as cache:
    print(kvlab.generate('toy', [7, 81, 190, 33], cache=cache, device='webgpu', max_new_tokens=4,
                         stop_on_eos=False).token_ids)
""")
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = r.stdout.strip().splitlines()[-2:]
    assert first == second


@on_plugin
def test_doctor_names_the_plugin_backend():
    r = subprocess.run([sys.executable, "-m", "kvlab", "doctor", "--json"], capture_output=True, text=True, timeout=600)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["problems"] == [], r.stdout[-2000:] + r.stderr[-2000:]
    assert out["backend"] == "onnxruntime-ep-webgpu (WebGPU plugin EP on onnxruntime)"
    assert out["versions"]["onnxruntime"] == "1.31.1" and out["versions"]["onnxruntime-webgpu"] == "missing"
    assert out["runs"]["webgpu"]["ok"] and out["runs"]["webgpu"]["tokens"] == out["runs"]["cpu"]["tokens"]
