"""Graph capture of kv-shared-toy (kvlab.ort.models.mobius.for_capture, kvlab.ort.decode.caches.shared_kv), on the
real runtime of this environment (onnxruntime-webgpu 1.27 in .venv, the plugin EP in .venv-plugin): the capture build's
rewrites, every node of it on WebGPU, and CapturedStaticCache on it: token-identical to the uncaptured StaticCache
where the package captures a layer with no keys of its own, refused before capture by name where it fails (the
failure itself shown on one node)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_kv_shared import SHORT, SHORT_NEW, _one_gqa, gqa_feeds

import kvlab
from kvlab import DeviceError, StaticCache, generate, open_device
from kvlab.ort.decode.caches.capture_binding import run_options
from kvlab.ort.decode.caches.captured import CAPTURE_OPTIONS, CapturedStaticCache
from kvlab.ort.decode.caches.shared_kv import shared_capture_problem
from kvlab.ort.runtime.device import backend
from kvlab.ort.runtime.session import release_all, zeros_all

FAILS = backend().package == "onnxruntime-webgpu"  # measured: 1.27.0 fails, the plugin EP 0.4.0 captures


@pytest.fixture(scope="module")
def graph_model():
    return kvlab.load("kv-shared-toy", graph_capture=True, progress=False)


def test_the_capture_build_rewrites_only_the_nodes_capture_cannot_hold(graph_model):
    record = json.loads((graph_model.info.path / "kvlab_recipe.json").read_text())
    assert record["graph_capture"] is True
    rewrites = record["graph_rewrites"][5:]  # after the repairs both builds have
    assert [r.split(":")[0] for r in rewrites] == [
        "model/layers.4/self_attn/ConstantOfShape_node_243",
        "model/layers.5/self_attn/ConstantOfShape_node_279",
        "model/ReduceSum_node_32",
    ]
    assert "[batch, 0, 32] -> Slice(query" in rewrites[0] and "[batch, 0, 64] -> Slice(query" in rewrites[1]
    assert graph_model.info.layout == kvlab.load("kv-shared-toy", progress=False).info.layout


def test_every_node_of_the_capture_build_runs_on_webgpu(graph_model):
    """The capturing session opens (ONNX Runtime refuses one with any node on the CPU EP)."""
    dev = open_device("webgpu")
    session = dev.session(graph_model.onnx_path, "kv-shared-toy, capture build", CAPTURE_OPTIONS)
    try:
        assert session.cpu_nodes == []
    finally:
        dev.forget(graph_model.onnx_path, CAPTURE_OPTIONS)


def test_the_capture_build_is_token_identical_uncaptured(graph_model):
    with StaticCache(16) as cache:
        got = generate(graph_model, SHORT, cache=cache, device="cpu", max_new_tokens=SHORT_NEW, stop_on_eos=False)
    model = kvlab.load("kv-shared-toy", progress=False)
    with StaticCache(16) as cache:
        want = generate(model, SHORT, cache=cache, device="cpu", max_new_tokens=SHORT_NEW, stop_on_eos=False)
    assert got.token_ids == want.token_ids


def test_captured_static_cache_equals_static_or_is_refused_by_name(graph_model):
    kw = dict(device="webgpu", prefill_device="cpu", max_new_tokens=SHORT_NEW, stop_on_eos=False)
    with StaticCache(16) as cache:
        want = generate(graph_model, SHORT, cache=cache, **kw).token_ids
    with CapturedStaticCache(16) as cache:
        if FAILS:
            with pytest.raises(DeviceError) as refused:
                generate(graph_model, SHORT, cache=cache, **kw)
            message = str(refused.value)
            assert "graph capture refused for model kv-shared-toy-graph: onnxruntime-webgpu 1.27" in message
            assert "'model/layers.4/self_attn/GroupQueryAttention_node_245'" in message
            assert "(0, 1, 1)" in message and "onnxruntime-ep-webgpu 0.4.0" in message
            assert cache.captures == 0
            return
        got = generate(graph_model, SHORT, cache=cache, **kw)
        assert got.token_ids == want
        assert (cache.captures, cache.replays) == (2, SHORT_NEW - 3)  # the prefill's token, then two captures
    with CapturedStaticCache(16) as cache:  # the token and the mask stay on the device (this graph is opset 24)
        got = generate(graph_model, SHORT, cache=cache, token_on_device="single", **kw)
        assert got.token_ids == want and cache.host_writes == 2  # the first decode step's ids and mask, no more


def _gqa_captured(path, p):
    """Two captured runs of the one-node KV-shared layer (``_one_gqa``), every input a device tensor; the output."""
    dev = open_device("webgpu")
    feeds = gqa_feeds(np.random.default_rng(1), p)
    outs = [((1, 1, 64), np.float32), ((1, 2, p, 16), np.float32), ((1, 2, p, 16), np.float32)]
    tensors = zeros_all(dev, [(v.shape, v.dtype) for v in feeds.values()] + outs)
    session = dev.session(path, "one KV-shared GQA node, captured", CAPTURE_OPTIONS)
    try:
        b = session.binding()
        for (name, value), t in zip(feeds.items(), tensors):
            if value.size:
                dev.backend.write(t.ortvalue(), value)
            b.input(name, t)
        for name, t in zip(("out", "ok", "ov"), tensors[7:]):
            b.output(name, t)
        b.run_options = run_options(dev.backend.ort, 77)
        b.run()
        b.run()  # the replay
        return feeds, tensors[7].numpy()
    finally:
        release_all(tensors)
        dev.forget(path, CAPTURE_OPTIONS)


def test_one_node_with_no_keys_of_its_own_under_capture(tmp_path):
    """The cause of the refusal, minimal: one GroupQueryAttention with empty keys and values and a past of 12,
    captured. onnxruntime-webgpu 1.27.0 fails with an empty dispatch; the plugin EP 0.4.0 replays the attention
    over the 12 positions. When a package fixes it this test says so."""
    _one_gqa(tmp_path / "gqa.onnx", 16)
    if FAILS:
        with pytest.raises(Exception, match=r"Invalid dispatch group size \(0, 1, 1\)"):
            _gqa_captured(tmp_path / "gqa.onnx", 12)
        return
    feeds, out = _gqa_captured(tmp_path / "gqa.onnx", 12)
    q, k, v = feeds["q"].reshape(4, 16), np.repeat(feeds["pk"][0], 2, 0), np.repeat(feeds["pv"][0], 2, 0)
    s = np.einsum("hd,hpd->hp", q, k)
    w = np.exp(s - s.max(1, keepdims=True))
    want = np.einsum("hp,hpd->hd", w / w.sum(1, keepdims=True), v).reshape(1, 1, 64)
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_the_refusal_names_only_the_package_measured_to_fail(graph_model):
    class Newer:
        package, version = "onnxruntime-webgpu", "1.28.0"

    class Plugin:
        package, version = "onnxruntime-ep-webgpu", "0.4.0 on onnxruntime 1.31.1"

    assert shared_capture_problem(graph_model.info, Newer()) == ""  # not measured: ONNX Runtime says
    assert shared_capture_problem(graph_model.info, Plugin()) == ""
    Newer.version = "1.27.0"
    assert "GroupQueryAttention_node_281" in shared_capture_problem(graph_model.info, Newer())
