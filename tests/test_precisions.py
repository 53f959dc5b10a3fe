"""The model files people run: fp16 and int4 (q4f16) builds of the onnxruntime-genai builder, and a Hugging Face
Optimum export. Real builds, real ONNX Runtime; the references are onnxruntime-genai and transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kvlab
from kvlab import ConfigError, DeviceError, DynamicCache, ModelError, StaticCache, generate, open_device
from kvlab.bench import weight_bytes_per_token
from kvlab.bench.weights import weight_bytes_by_op
from kvlab.ort.checks.references import genai_greedy, transformers_greedy
from kvlab.ort.models.rewrites import cast_bool_gathers
from kvlab.presets import RECIPES

KVLAB = str(Path(sys.executable).parent / "kvlab")
PROMPT = [3 + (i * 7) % 256 for i in range(24)]


@pytest.fixture(scope="module", params=["fp16", "int4"])
def toy_p(request) -> kvlab.Model:
    return kvlab.load("toy", precision=request.param)


def test_the_graph_says_what_each_precision_holds(toy, toy_p):
    i = toy_p.info
    assert toy_p.name == f"toy-{toy_p.name.split('-')[1]}" and i.dtype == np.float16 and i.logits_dtype == np.float16
    assert i.weights == ("float16" if toy_p.name.endswith("fp16") else "int4")
    assert i.precision == f"{i.weights} weights, float16 activations, float16 KV cache"
    assert toy.info.precision == "float32 weights, float32 activations, float32 KV cache"
    assert 2 * StaticCache(64).memory_report(i).total_bytes == StaticCache(64).memory_report(toy.info).total_bytes


def test_both_caches_agree_with_onnxruntime_genai_and_the_static_one_allocates_once(toy_p):
    with StaticCache(64) as s, DynamicCache() as d:
        a = generate(toy_p, PROMPT, cache=s, max_new_tokens=12, stop_on_eos=False)
        b = generate(toy_p, PROMPT, cache=d, max_new_tokens=12, stop_on_eos=False)
    assert a.token_ids == b.token_ids == genai_greedy(toy_p, PROMPT, 12)
    fs, fd = a.frame(), b.frame()
    assert (fs.cache_tensors_allocated[1:] == 0).all() and (fs.new_buffers[1:] == 0).all()
    assert (fd.cache_tensors_allocated == 4).all()
    assert fd.cache_bytes_allocated.iloc[1] == (len(PROMPT) + 1) * toy_p.info.bytes_per_token  # 2 bytes a value


def test_float16_on_webgpu_runs_where_the_adapter_computes_in_float16_and_is_refused_elsewhere(toy_p):
    """SwiftShader has no shader-f16: a float16 kernel fails at its first run there ("Program Gather requires f16
    but the device does not support it") and the process dies at exit, so kvlab refuses before any kernel runs,
    having read the adapter's Vulkan features. On a GPU that has it, both caches run and agree with the CPU EP."""
    dev = open_device("webgpu")
    before = dev.live_tensors
    cache = StaticCache(64)
    if dev.adapter.shader_f16 is False:
        with pytest.raises(DeviceError, match=r"computes in float16, but the WebGPU adapter .* has no shader-f16"):
            generate(toy_p, PROMPT, cache=cache, device="webgpu", max_new_tokens=4)
        assert not cache.allocated and dev.live_tensors == before
        return
    cpu = generate(toy_p, PROMPT, device="cpu", max_new_tokens=8, stop_on_eos=False)
    with cache, DynamicCache() as d:
        a = generate(
            toy_p, PROMPT, cache=cache, device="webgpu", prefill_device="cpu", max_new_tokens=8, stop_on_eos=False
        )
        b = generate(toy_p, PROMPT, cache=d, device="webgpu", prefill_device="cpu", max_new_tokens=8, stop_on_eos=False)
    assert a.token_ids == b.token_ids == cpu.token_ids
    assert (a.frame().new_buffers[2:] == 0).all() and dev.live_tensors == before


def test_int4_weight_bytes_are_the_packed_weights_and_their_scales():
    """MatMulNBits holds 4 bits per weight and one float16 scale per block of 32, for every projection and the
    lm_head (computed here from the recipe's shapes, not from the graph)."""
    t = RECIPES["toy"]
    per_layer = (
        t.hidden * (t.heads + 2 * t.kv_heads) * t.head_dim
        + t.heads * t.head_dim * t.hidden
        + 3 * t.hidden * t.intermediate
    )
    weights = t.layers * per_layer + t.hidden * t.vocab
    by_op = weight_bytes_by_op(kvlab.load("toy", precision="int4"))
    assert by_op["MatMulNBits"] == weights // 2 + weights // 32 * 2
    fp32 = weight_bytes_per_token(kvlab.load("toy"))
    assert weight_bytes_per_token(kvlab.load("toy", precision="int4")) < 0.2 * fp32


@pytest.mark.parametrize(
    "precision, message",
    [
        ("bf16", r"precision 'bf16' cannot run here: the builder's bf16 graph uses MultiHeadAttention"),
        ("q8", r"precision 'q8' is not valid; choose one of \('fp32', 'fp16', 'int4'\)"),
        (True, r"precision True is not valid"),
    ],
)
def test_precisions_that_cannot_run_are_named(precision, message):
    with pytest.raises(ConfigError, match=message):
        kvlab.load("toy", precision=precision)


def test_a_directory_keeps_its_own_precision(toy):
    with pytest.raises(ConfigError, match=r"precision='int4' applies to built-in models"):
        kvlab.load(toy.info.path, precision="int4")
    r = subprocess.run([KVLAB, "generate", "--model", "toy:bf16"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("kvlab: error: precision 'bf16' cannot run here")


def test_the_bf16_refusal_is_what_onnxruntime_says(tmp_path):
    """The reason kvlab gives for refusing bf16, measured: the builder's bf16 toy cannot open on the CPU EP."""
    from kvlab.ort.models.build import export
    from kvlab.presets import ensure_checkpoint

    export(ensure_checkpoint("toy"), tmp_path, "toy", "bf16")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph.node}
    assert "MultiHeadAttention" in ops and "GroupQueryAttention" not in ops
    with pytest.raises(Exception, match=r"Could not find an implementation for Where\(16\)"):
        ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])


def test_smollm2_int4_both_caches_identical_on_cpu(long_prompt):
    model = kvlab.load("smollm2", precision="int4")
    assert model.info.weights == "int4" and model.info.dtype == np.float16
    with StaticCache(512) as s, DynamicCache() as d:
        a = generate(model, long_prompt, cache=s, max_new_tokens=16, stop_on_eos=False)
        b = generate(model, long_prompt, cache=d, max_new_tokens=16, stop_on_eos=False)
    assert a.token_ids == b.token_ids == genai_greedy(model, long_prompt, 16)


# ------------------------------------------------------------------------------------------------- Optimum layout
def test_an_optimum_export_loads_with_its_graphs_facts(optimum_toy, toy):
    m = kvlab.load(optimum_toy)
    i = m.info
    assert (i.num_layers, i.num_kv_heads, i.head_dim, i.vocab_size) == (
        toy.info.num_layers,
        toy.info.num_kv_heads,
        toy.info.head_dim,
        toy.info.vocab_size,
    )
    assert set(i.input_names) == {"input_ids", "attention_mask", "position_ids"} and not i.shares_buffers


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_dynamic_cache_runs_an_optimum_export_like_the_builders_model(optimum_toy, toy, device):
    """Same weights, two exporters: the Optimum graph (Concat presents, position_ids) decodes the tokens of the
    builder's graph on the CPU EP and of transformers; on WebGPU too (its prefill is not the GQA kernel's)."""
    m = kvlab.load(optimum_toy)
    dev = open_device(device)
    before = dev.live_tensors
    with DynamicCache() as cache:
        got = generate(m, PROMPT, cache=cache, device=device, max_new_tokens=8, stop_on_eos=False).token_ids
    assert got == generate(toy, PROMPT, device="cpu", max_new_tokens=8, stop_on_eos=False).token_ids
    assert got == transformers_greedy(toy, PROMPT, 8)
    assert dev.live_tensors == before


def test_a_static_cache_refuses_an_optimum_export_with_the_reason_and_the_way_out(optimum_toy):
    m = kvlab.load(optimum_toy)
    cache = StaticCache(32)
    with pytest.raises(
        ModelError,
        match=r"StaticCache cannot use model .*'present.0.key' is made by 'Concat' node '/model/.*"
        r"What works: a DynamicCache on this graph; for a StaticCache, rebuild the model with the onnxruntime-genai",
    ):
        generate(m, PROMPT, cache=cache, max_new_tokens=2)
    assert not cache.allocated


def test_the_bool_gather_rewrite_keeps_every_output(optimum_toy):
    """onnxruntime-webgpu 1.27 crashes on a bool Gather, so kvlab computes it in int32 on WebGPU; the rewritten
    graph gives the original's outputs exactly (both on the CPU EP, on the same inputs)."""
    model = onnx.load(str(optimum_toy / "model.onnx"))
    done = cast_bool_gathers(model)
    assert done and all(line.startswith("bool Gather '/model/") for line in done)
    feeds = {
        "input_ids": np.array([PROMPT[:6]], np.int64),
        "attention_mask": np.ones((1, 6), np.int64),
        "position_ids": np.arange(6, dtype=np.int64)[None],
    }
    feeds.update(
        {f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 16), np.float32) for i in range(2) for kv in ("key", "value")}
    )
    a = ort.InferenceSession(str(optimum_toy / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    b = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert kvlab.open_device("webgpu").session(optimum_toy / "model.onnx").rewrites
