"""KV-shared layers (Gemma 4), built through mobius: the preset ``kv-shared-toy`` (six layers, the last two reading
the KV of layers 3 and 2), what inspection says of each layer, the memory report (a shared layer: 0 bytes), both
caches against transformers' own Gemma 4 generation on CPU and WebGPU, the WebGPU kernel's window on a layer with
no keys of its own (a one-node case), and what a mobius graph needs repaired. Real models built locally, real ONNX
Runtime sessions, real transformers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import kvlab
from kvlab import CapacityError, ConfigError, DynamicCache, ModelError, StaticCache, generate, open_device
from kvlab.core.cache_layout import FullAttention, SharedKV, SlidingWindow
from kvlab.ort.checks.references import transformers_greedy
from kvlab.ort.models import mobius
from kvlab.presets.recipes import TinyKVShared

PROMPT = [int(x) for x in np.random.default_rng(0).integers(3, 259, 24)]  # longer than the window (16)
NEW = 12
SHORT, SHORT_NEW = PROMPT[:8], 8  # 15 positions: within the window
S, F = SlidingWindow(16), FullAttention()
KINDS = [S, S, F, S, SharedKV(3, 16), SharedKV(2, 0)]


@pytest.fixture(scope="module")
def model():
    return kvlab.load("kv-shared-toy", progress=False)


@pytest.fixture(scope="module")
def reference(model):
    return {"long": transformers_greedy(model, PROMPT, NEW), "short": transformers_greedy(model, SHORT, SHORT_NEW)}


def test_inspection_sees_shared_layers_as_borrowing_kv(model):
    layout = model.info.layout
    assert [layer.kind for layer in layout.layers] == KINDS
    assert [len(layer.entries) for layer in layout.layers] == [2, 2, 2, 2, 0, 0]  # no past/present of their own
    assert [layer.entries[0].dims for layer in layout.layers[:4]] == [(1, 2, 0, 16)] * 2 + [
        (1, 2, 0, 32),
        (1, 2, 0, 16),
    ]
    assert [e.past for e in model.info.entries] == [
        f"past_key_values.{i}.{r}" for i in range(4) for r in ("key", "value")
    ]
    assert model.info.shares_buffers


def test_the_memory_report_gives_a_shared_layer_zero_bytes_of_its_own(model):
    report = StaticCache(1024).memory_report(model.info)
    rows = {r.layer: r for r in report.layers}
    assert [rows[i].growing_bytes for i in range(6)] == [2 * 2 * 1024 * h * 4 for h in (16, 16, 32, 16)] + [0, 0]
    assert rows[4].kind == "KV of layer 3 (window 16)" and rows[5].kind == "KV of layer 2 (full)"
    assert rows[4].tensors == rows[5].tensors == 0 and report.tensors == 8
    assert report.bytes_per_token == 2 * 2 * 4 * (16 + 16 + 32 + 16) and "4 of 6 layers grow" in str(report)


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_memory_per_layer_is_exact_against_the_tensors_held(model, device):
    dev = open_device(device)
    for cache in (DynamicCache(), StaticCache(16)):
        before = dev.live_bytes
        with cache:
            generate(model, SHORT[:4], cache=cache, device=device, max_new_tokens=4, stop_on_eos=False)
            held = cache.held_bytes_by_layer()
            expected = (
                model.info.layout.memory(cache.seq_length)
                if cache.kind == "dynamic"
                else cache.memory_report(model.info).layers
            )
            assert held == {r.layer: r.total_bytes for r in expected if r.tensors}, cache.kind
            assert sum(held.values()) == cache.live_bytes == dev.live_bytes - before
        assert dev.live_bytes == before


def test_both_caches_are_token_identical_to_transformers_on_cpu(model, reference):
    """24 prompt tokens: the sliding layers (shared and not) attend to their last 16 positions."""
    for cache in (DynamicCache(), StaticCache(64)):
        with cache:
            g = generate(model, PROMPT, cache=cache, device="cpu", max_new_tokens=NEW, stop_on_eos=False)
        assert g.token_ids == reference["long"], cache.kind
        if cache.kind == "static":
            assert all(r.new_buffers == 0 and r.cache_tensors_allocated == 0 for r in g.records[1:])


def test_both_caches_are_token_identical_to_transformers_on_webgpu_within_the_window(model, reference):
    """Prefill on the CPU EP, handed off (SwiftShader's multi-token prefill is wrong from position 4 on)."""
    dev = open_device("webgpu")
    before = dev.live_tensors
    for cache in (DynamicCache(), StaticCache(16)):
        with cache:
            g = generate(
                model,
                SHORT,
                cache=cache,
                device="webgpu",
                prefill_device="cpu",
                max_new_tokens=SHORT_NEW,
                stop_on_eos=False,
            )
        assert g.token_ids == reference["short"], cache.kind
    assert dev.live_tensors == before


def test_beyond_the_window_webgpu_is_refused_before_it_runs(model):
    for cache in (DynamicCache(), StaticCache(64)):
        with pytest.raises(
            CapacityError,
            match=r"35 positions are needed, but model kv-shared-toy's KV-shared "
            r"sliding layers \[4\] \(window 16\) are right on WebGPU only up to 16 positions",
        ):
            generate(model, PROMPT, cache=cache, device="webgpu", prefill_device="cpu", max_new_tokens=NEW)
        assert cache.seq_length == 0


def _one_gqa(path, window):
    """One GroupQueryAttention node as mobius makes a KV-shared layer's: empty keys and values, a past."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "sk", "total"],
        ["out", "ok", "ov"],
        domain="com.microsoft",
        num_heads=4,
        kv_num_heads=2,
        scale=1.0,
        local_window_size=window,
    )
    f = lambda name, shape: helper.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(
        [node],
        "shared_kv_layer",
        [
            f("q", [1, 1, 64]),
            f("k", [1, 0, 32]),
            f("v", [1, 0, 32]),
            f("pk", [1, 2, "p", 16]),
            f("pv", [1, 2, "p", 16]),
            helper.make_tensor_value_info("sk", T.INT32, [1]),
            helper.make_tensor_value_info("total", T.INT32, []),
        ],
        [f("out", [1, 1, 64]), f("ok", None), f("ov", None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    onnx.save(model, str(path))


def gqa_feeds(rng, p):
    """Inputs of ``_one_gqa``'s node: a query, no keys or values of its own, a past of ``p`` positions."""
    return {
        "q": rng.normal(size=(1, 1, 64)).astype(np.float32),
        "k": np.zeros((1, 0, 32), np.float32),
        "v": np.zeros((1, 0, 32), np.float32),
        "pk": rng.normal(size=(1, 2, p, 16)).astype(np.float32),
        "pv": rng.normal(size=(1, 2, p, 16)).astype(np.float32),
        "sk": np.array([p - 1], np.int32),
        "total": np.array(p, np.int32),
    }


def test_the_webgpu_kernel_ignores_the_window_of_a_layer_without_keys(tmp_path):
    """The cause of the refusal above, in one node: past 28 positions, window 16. The CPU EP equals attention
    over the last 16 (numpy); WebGPU equals attention over all 28. When a package fixes it this test says so."""
    _one_gqa(tmp_path / "gqa.onnx", 16)
    p = 28
    feeds = gqa_feeds(np.random.default_rng(0), p)

    def attention(first):
        q, k, v = feeds["q"].reshape(4, 16), np.repeat(feeds["pk"][0], 2, 0), np.repeat(feeds["pv"][0], 2, 0)
        s = np.einsum("hd,hpd->hp", q, k[:, first:])
        w = np.exp(s - s.max(1, keepdims=True))
        return np.einsum("hp,hpd->hd", w / w.sum(1, keepdims=True), v[:, first:]).reshape(1, 1, 64)

    outs = {}
    for device in ("cpu", "webgpu"):
        session = open_device(device).session(tmp_path / "gqa.onnx")
        b = session.binding()
        for name, value in feeds.items():
            b.input(name, value)
        out = np.empty((1, 1, 64), np.float32)
        b.output("out", out)
        b.output_new("ok")
        b.output_new("ov")
        result = b.run()
        outs[device] = out
        for t in result.new.values():
            t.release()
    np.testing.assert_allclose(outs["cpu"], attention(p - 16), atol=1e-5)
    np.testing.assert_allclose(outs["webgpu"], attention(0), atol=1e-5)  # every position: no window


def test_the_build_repaired_what_mobius_declares_wrongly(model):
    """What mobius 0.1.0's graph had before kvlab's repair, as the build recorded it."""
    record = json.loads((model.info.path / "kvlab_recipe.json").read_text())
    assert record["exporter"].startswith("mobius-onnx 0.1.0")
    rewrites = record["graph_rewrites"]
    assert rewrites[0] == "unread inputs dropped: " + str(
        [f"past_key_values.{i}.{r}" for i in (4, 5) for r in ("key", "value")]
    )
    assert [r.split(":")[0] for r in rewrites[1:]] == [
        "past_key_values.2.key",
        "past_key_values.2.value",
        "present.2.key",
        "present.2.value",
    ]
    assert all("head size 16 -> 32" in r for r in rewrites[1:])


def test_an_unrepaired_mobius_graph_is_refused_naming_what_and_the_fix(model, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    d = tmp_path / "m"
    shutil.copytree(model.info.path, d)
    graph = onnx.load(str(d / "model.onnx"), load_external_data=False)
    graph.graph.input.append(helper.make_tensor_value_info("past_key_values.4.key", TensorProto.FLOAT, [1, 2, "p", 16]))
    next(i for i in graph.graph.input if i.name == "past_key_values.2.value").type.tensor_type.shape.dim[
        3
    ].dim_value = 16
    onnx.save(graph, str(d / "model.onnx"))
    with pytest.raises(
        ModelError,
        match=r"a mobius 0.1.0 export kvlab cannot bind: graph inputs "
        r"\['past_key_values.4.key'\] are read by no node .*'past_key_values.2.value' is declared "
        r"with heads of 16, but .* writes heads of 32 .*repair\(<dir>/model.onnx\) fixes both",
    ):
        kvlab.load(d)
    assert len(mobius.repair(d / "model.onnx")) == 2
    assert kvlab.load(d).info.layout == model.info.layout


def test_bad_recipes_and_precisions_are_named():
    with pytest.raises(
        ConfigError, match=r"model 'kv-shared-toy' is built by mobius in precision 'fp32' only, not 'fp16'"
    ):
        kvlab.load("kv-shared-toy", precision="fp16", progress=False)
    with pytest.raises(
        ConfigError,
        match=r"TinyKVShared.kv_shared=1 must leave, before the shared layers, a layer of "
        r"each type they share .*no earlier \['full_attention'\]",
    ):
        TinyKVShared(("sliding_attention", "full_attention"), kv_shared=1, window=8)
    with pytest.raises(ConfigError, match=r"TinyKVShared.window=0 must be a positive int"):
        TinyKVShared(("sliding_attention", "sliding_attention"), kv_shared=1, window=0)
    with pytest.raises(ConfigError, match=r"TinyKVShared.layer_types=\('conv', 'conv'\): Gemma 4 layers are"):
        TinyKVShared(("conv", "conv"), kv_shared=1, window=8)


def test_graph_capture_is_refused_naming_the_constant_of_shape_nodes(model):
    """mobius's KV-shared layers make their empty keys with ConstantOfShape, which neither package runs on WebGPU
    (measured: onnxruntime-webgpu 1.27.0 also puts the mask's int64 ReduceSum and Sub, and the Concats, on the CPU
    EP; onnxruntime-ep-webgpu 0.4.0 only the two ConstantOfShape nodes): the capturing session is refused before
    anything is captured, naming the nodes and the package."""
    from kvlab import DeviceError
    from kvlab.ort.decode.caches.captured import CapturedStaticCache

    with CapturedStaticCache(16) as cache, pytest.raises(DeviceError) as refused:
        generate(model, SHORT, cache=cache, device="webgpu", prefill_device="cpu", max_new_tokens=2)
    message = str(refused.value)
    assert "graph capture refused for model kv-shared-toy on onnxruntime-" in message
    for layer in (4, 5):
        assert f"ConstantOfShape 'model/layers.{layer}/self_attn/ConstantOfShape_node_" in message
    assert cache.captures == 0
