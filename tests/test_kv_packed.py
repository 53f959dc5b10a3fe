"""Quantized KV in kvlab's ONNX Runtime caches: ``StaticCache(n, kv_precision="int8" | "int4")`` and
``DynamicCache(kv_precision=...)`` hold the packed KV the WebGPU plugin EP's GroupQueryAttention reads and writes
(session option ``kvCacheQuantizationBits``). On the plugin EP (.venv-plugin) they run for real; everywhere else
(onnxruntime-webgpu 1.27, the CPU EP) they are refused when the cache meets the model, naming what runs it, with
nothing allocated."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kvlab
from kvlab.ort import DynamicCache, StaticCache, generate
from kvlab.ort.runtime.plugin import installed

PROMPT = [1, 2, 3, 4, 5, 6]
NEW = 16
CACHES = {"static": lambda p: StaticCache(64, kv_precision=p), "dynamic": lambda p: DynamicCache(kv_precision=p)}


def run(toy, cache, device="webgpu"):
    with cache:
        return generate(toy, PROMPT, max_new_tokens=NEW, cache=cache, device=device), cache.live_bytes


@pytest.mark.parametrize("kind", CACHES)
def test_a_bad_kv_precision_is_named(kind):
    with pytest.raises(kvlab.ConfigError, match=r"kv_precision='q3'\) is not a KV precision.*'int8', 'int4'"):
        CACHES[kind]("q3")
    assert CACHES[kind]("model").kv_precision is None and CACHES[kind](None).spec.variant in ("", None)


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_where_kv_is_not_packed_the_cache_refuses_before_allocating(toy, device):
    if device == "webgpu" and installed():
        pytest.skip("the plugin EP packs KV: test_packed_kv_runs_on_the_plugin_ep")
    cache = StaticCache(64, kv_precision="int8")
    with pytest.raises(kvlab.ConfigError, match=rf"kv_precision='int8'\) cannot run on {device} with .*plugin EP"):
        generate(toy, PROMPT, max_new_tokens=2, cache=cache, device=device)
    assert cache.tensors == () and cache.seq_length == 0
    cache.dispose()


@pytest.mark.skipif(not installed(), reason="packed KV needs the WebGPU plugin EP (.venv-plugin)")
@pytest.mark.parametrize("kind", CACHES)
def test_packed_kv_runs_on_the_plugin_ep(toy, kind):
    """int8: the model-precision run's tokens (toy, 16 new tokens); int4 runs, the same tokens in both caches.
    Bytes exact: toy's K and V are [1, 2, n, 16] fp32 per layer; packed, the last axis is 1 + 16 * bits / 32 words."""
    reference, _ = run(toy, CACHES[kind](None))
    int8, int8_bytes = run(toy, CACHES[kind]("int8"))
    int4, _ = run(toy, CACHES[kind]("int4"))
    assert int8.token_ids == reference.token_ids
    assert int8.label.cache.variant.endswith("kv-int8") and int4.label.cache.variant.endswith("kv-int4")
    other, _ = run(toy, CACHES["dynamic" if kind == "static" else "static"]("int4"))
    assert int4.token_ids == other.token_ids
    words = {"int8": 5, "int4": 3}
    last = int8.records[-1]
    positions = 64 if kind == "static" else len(PROMPT) + NEW - 1
    assert last.live_cache_bytes == 4 * 2 * positions * words["int8"] * 4
    assert last.used_cache_bytes == (last.position + last.n_tokens) * 4 * 2 * words["int8"] * 4
    if kind == "static":
        assert all(r.cache_tensors_allocated == 0 for r in int8.records[1:]), "a static cache allocates once"
        report = StaticCache(64, kv_precision="int4").memory_report(toy.info)
        assert report.bytes_per_token == 4 * 2 * words["int4"] * 4


def test_compare_kv_precision_runs_where_kv_is_packed_and_is_refused_in_one_line_elsewhere():
    """``kvlab compare --kv-precision int8``: both caches packed on the plugin EP (tokens equal between them); on
    the CPU EP (either package) exit 2 with one line naming the runtime."""
    base = [sys.executable, "-m", "kvlab", "compare", "--model", "toy", "hi", "--max-new-tokens", "4"]
    cpu = subprocess.run([*base, "--device", "cpu", "--kv-precision", "int8"], capture_output=True, text=True)
    assert cpu.returncode == 2 and cpu.stderr.count("\n") == 1, cpu.stderr
    assert "kv_precision='int8') cannot run on cpu with" in cpu.stderr
    if installed():
        gpu = subprocess.run([*base, "--device", "webgpu", "--kv-precision", "int8"], capture_output=True, text=True)
        assert gpu.returncode == 0, gpu.stderr
        assert "static@" in gpu.stdout and "kv-int8" in gpu.stdout and "outputs identical: True" in gpu.stdout


@pytest.mark.skipif(not installed(), reason="the packing refusal on hardware adapters is the plugin EP's")
def test_a_hardware_adapter_is_refused_as_measured_on_the_h200():
    """Measured on an NVIDIA H200 machine: on its hardware adapter the plugin EP 0.4.0 still asks for unpacked KV
    with kvCacheQuantizationBits set, so kvlab refuses there. No hardware adapter exists here: the check is called
    on this machine's real device with its adapter relabelled hardware (the one stand-in in this file)."""
    import copy
    from dataclasses import replace

    from kvlab.ort.decode.caches.kv_precision import check_runs_here

    device = kvlab.ort.open_device("webgpu")
    check_runs_here("int8", "StaticCache", kvlab.load("toy").info, device)  # SwiftShader: packed KV runs
    gpu = copy.copy(device)
    gpu.adapter = replace(device.adapter, name="NVIDIA H200", kind="hardware")
    with pytest.raises(
        kvlab.ConfigError, match=r"cannot run on NVIDIA H200: on a hardware adapter the plugin EP asks for unpacked KV"
    ):
        check_runs_here("int8", "StaticCache", kvlab.load("toy").info, gpu)


def test_bench_runs_each_cache_again_with_packed_kv_or_refuses_before_measuring(toy, tmp_path):
    """``kvlab bench --set kv_precisions=int8`` (or int8,int4): on the plugin EP each cache runs again with its KV
    packed, beside its twin in the same paired rounds, and the report gives its step against the twin's (tokens
    reported, not required equal: packed KV is lossy); elsewhere one line, exit 2, before anything runs. In a process
    of its own, as a user runs it (the bench opens WebGPU in the buffer cache mode it measures)."""
    import json

    argv = ["bench", "--models", "toy", "--devices", "webgpu", "--contexts", "16", "--new-tokens", "4", "--reps", "1"]
    argv += ["--set", "static_lens=1", "--set", "genai=none", "--set", "token_on_device=off"]
    argv += ["--set", "kv_precisions=int8", "--set", "charts=off"]
    r = subprocess.run([sys.executable, "-m", "kvlab", *argv, "--out", str(tmp_path)], capture_output=True, text=True)
    if not installed():
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "kv_precision='int8') cannot run on webgpu with onnxruntime-webgpu" in r.stderr
        assert not (tmp_path / "results.json").exists()
        return
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [x["variant"] for x in rows] == ["dynamic", "dynamic kv-int8", "static@19", "static@19 kv-int8"]
    assert all(x["valid"] for x in rows) and all(x["decode_ms"] > 0 for x in rows)
    assert "static@19 kv-int8" in r.stdout and "lossy KV" in r.stdout
