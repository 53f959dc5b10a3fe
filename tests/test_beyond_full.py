"""Caches beyond full attention: the presets of other architectures (sliding windows, linear attention, conv
states), what inspection says of each layer, both caches against transformers' own generation (PyTorch, the same
random weights) on CPU and WebGPU, memory to the byte against the tensors held, the static cache's zero
allocations, failures at every boundary of a step, and the bad inputs (unknown layer kinds, in-place states on
WebGPU). Real models built locally, real ONNX Runtime sessions, real transformers."""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext

import numpy as np
import pytest
from conftest import run_python

import kvlab
from kvlab import CacheStateError, ConfigError, DynamicCache, ModelError, StaticCache, Stepper, generate, open_device
from kvlab.core.cache_layout import ConvState, FullAttention, LinearAttention, SlidingWindow
from kvlab.ort.checks.faults import Injected, fault, raising_hook
from kvlab.ort.checks.references import hf_checkpoint, transformers_greedy
from kvlab.ort.runtime.device import backend
from kvlab.ort.runtime.plugin import installed as on_the_plugin_ep

PROMPT = [int(x) for x in np.random.default_rng(0).integers(3, 259, 24)]  # longer than the windows (16)
NEW = 12
F, S, L, C = FullAttention(), SlidingWindow(16), LinearAttention(), ConvState()
KINDS = {
    "sliding-toy": [S, S, S, F] * 2,
    "gemma2-toy": [S, F] * 4,
    "mistral-toy": [S] * 8,
    "hybrid-toy": [L, L, L, F] * 2,
    "conv-toy": [C, C, F, C, C, F, C, F],
}
PRESETS = list(KINDS)
STATEFUL = ["hybrid-toy", "conv-toy"]


@pytest.fixture(scope="module")
def models():
    return {name: kvlab.load(name, progress=False) for name in PRESETS}


@pytest.fixture(scope="module")
def reference(models):
    """transformers' greedy tokens (its own generate and caches) for each preset, on its checkpoint."""
    return {name: transformers_greedy(m, PROMPT, NEW) for name, m in models.items()}


def caches_for(model, device="cpu"):
    out = {"dynamic": DynamicCache(), "static": StaticCache(64)}
    if model.info.layout.states and (device == "cpu" or backend().webgpu_states_in_place):
        out["static-in-place"] = StaticCache(64, states="in-place")
    return out


# ------------------------------------------------------------------------------------------------- inspection
@pytest.mark.parametrize("name", PRESETS)
def test_inspection_tells_each_layers_kind_from_the_graph(models, name):
    info = models[name].info
    assert [layer.kind for layer in info.layout.layers] == KINDS[name]
    for layer in info.layout.layers:
        roles = [e.role for e in layer.entries]
        ops = {e.op for e in layer.entries}
        if type(layer.kind) in (FullAttention, SlidingWindow):
            assert roles == ["key", "value"] and ops == {"GroupQueryAttention"}
            assert all(e.dims == (1, 2, 0, 32) and e.grows for e in layer.entries)
        elif type(layer.kind) is LinearAttention:  # conv_dim = 2 * (2 key heads x 32) + 4 value heads x 32
            assert [(e.role, e.dims, e.op) for e in layer.entries] == [
                ("conv", (1, 256, 3), "CausalConvWithState"),
                ("recurrent", (1, 4, 32, 32), "LinearAttention"),
            ]
        else:  # LFM2: hidden x (conv_L_cache - 1)
            assert [(e.role, e.dims, e.op) for e in layer.entries] == [("conv", (1, 128, 2), "CausalConvWithState")]
    assert info.num_layers == 8 and info.shares_buffers


def test_the_memory_report_is_per_layer_and_known_before_allocating(models):
    dev = open_device("cpu")
    before = dev.live_tensors
    hybrid = StaticCache(1024).memory_report(models["hybrid-toy"].info)
    assert dev.live_tensors == before  # nothing allocated
    rows = {r.layer: r for r in hybrid.layers}
    state = 256 * 3 * 4 + 4 * 32 * 32 * 4  # conv + recurrent, float32
    assert rows[0].kind == "linear attention (recurrent state)" and rows[0].growing_bytes == 0
    assert rows[0].fixed_bytes == 2 * state and rows[0].tensors == 4  # two buffers per state (swap)
    assert (
        rows[3].kind == "full attention" and rows[3].fixed_bytes == 0 and rows[3].growing_bytes == 2 * 2 * 1024 * 32 * 4
    )
    assert hybrid.bytes_per_token == 2 * 2 * 2 * 32 * 4 and hybrid.fixed_bytes == 6 * 2 * state
    assert hybrid.total_bytes == 1024 * hybrid.bytes_per_token + hybrid.fixed_bytes
    assert "2 of 8 layers grow" in str(hybrid)
    in_place = StaticCache(1024, states="in-place").memory_report(models["hybrid-toy"].info)
    assert in_place.fixed_bytes == hybrid.fixed_bytes // 2
    sliding = StaticCache(1024).memory_report(models["sliding-toy"].info)
    assert sliding.fixed_bytes == 0 and "8 of 8 layers grow" in str(sliding)  # a window's buffer still grows


# ------------------------------------------------------------------------------ tokens against transformers
@pytest.mark.parametrize("name", PRESETS)
def test_both_caches_are_token_identical_to_transformers_on_cpu(models, reference, name):
    model, dev = models[name], open_device("cpu")
    before = dev.live_tensors
    for kind, cache in caches_for(model).items():
        with cache:
            g = generate(model, PROMPT, cache=cache, device="cpu", max_new_tokens=NEW, stop_on_eos=False)
            assert g.token_ids == reference[name], kind
            if kind.startswith("static"):  # allocated once, at the first step; nothing after
                assert all(r.new_buffers == 0 and r.cache_tensors_allocated == 0 for r in g.records[1:]), kind
    assert dev.live_tensors == before


@pytest.mark.parametrize("name", ["sliding-toy", "gemma2-toy", "mistral-toy"])
def test_the_window_is_applied(models, reference, name):
    """Without its window transformers says other tokens: equal tokens prove the window is in the graph (for
    Mistral, put back by kvlab's rewrite: the builder's own graph has none)."""
    import torch
    import transformers

    path = hf_checkpoint(models[name])
    config = transformers.AutoConfig.from_pretrained(path)
    config.sliding_window = 100_000
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            pad_token_id=0,
        )
    assert out[0, len(PROMPT) :].tolist() != reference[name]


@pytest.mark.parametrize("name", PRESETS)
def test_both_caches_are_token_identical_to_transformers_on_webgpu(models, reference, name):
    """WebGPU has every op these graphs use (GroupQueryAttention with a window, CausalConvWithState,
    LinearAttention, RotaryEmbedding, ...). Prefill on the CPU EP, handed off (SwiftShader's multi-token prefill
    is wrong from position 4 on: README, Known limits)."""
    model, dev = models[name], open_device("webgpu")
    before = dev.live_tensors
    for kind, cache in caches_for(model, "webgpu").items():
        with cache:
            g = generate(
                model, PROMPT, cache=cache, device="webgpu", prefill_device="cpu", max_new_tokens=NEW, stop_on_eos=False
            )
            assert g.token_ids == reference[name], kind
            if kind == "static":
                assert all(r.new_buffers == 0 for r in g.records[2:])  # after the handoff
    assert dev.live_tensors == before


@pytest.mark.parametrize("name", STATEFUL + ["sliding-toy"])
def test_webgpu_alone_token_by_token_equals_transformers(models, reference, name):
    """All on WebGPU, the prompt fed one token per step (each step a decode step: right on SwiftShader), so the
    first step reads the zero states on the device too."""
    model = models[name]
    for kind, cache in caches_for(model, "webgpu").items():
        with cache, Stepper(model, cache, "webgpu", len(PROMPT) + NEW - 1) as s:
            for t in PROMPT:
                _, record = s.step([t])
            tokens = [record.token]
            while len(tokens) < NEW:
                _, record = s.step([tokens[-1]])
                tokens.append(record.token)
        assert tokens == reference[name], kind


# ------------------------------------------------------------------------------ memory to the byte
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_memory_per_layer_is_exact_against_the_tensors_held(models, name, device):
    model, dev = models[name], open_device(device)
    info = model.info
    for kind, cache in caches_for(model, device).items():
        before = dev.live_bytes
        with cache:
            generate(model, PROMPT[:10], cache=cache, device=device, max_new_tokens=6, stop_on_eos=False)
            held = cache.held_bytes_by_layer()  # summed from the tensors' own (runtime) shapes
            if kind == "dynamic":  # the last presents: every entry at the sequence length
                expected = info.layout.memory(cache.seq_length)
            else:
                expected = cache.memory_report(info).layers
            assert held == {r.layer: r.total_bytes for r in expected}, kind
            assert sum(held.values()) == cache.live_bytes == dev.live_bytes - before, kind
            assert len(cache.tensors) == sum(r.tensors for r in expected)
        assert dev.live_bytes == before


# ------------------------------------------------------------------------------ failures and the transaction
FAULTS = [("run", None), ("after-run", None), ("in-place", None), ("commit", None), ("after-run", KeyboardInterrupt())]


def _decode_with_retries(
    model, cache, dev, prompt, new, hooks=(), catch=(Injected, KeyboardInterrupt, kvlab.InPlaceError)
):
    tokens, failures = [], 0
    with Stepper(model, cache, dev, len(prompt) + new - 1, hooks) as stepper:
        feed = np.array(prompt)
        while len(tokens) < new:
            length, live = cache.seq_length, dev.live_tensors
            try:
                _, record = stepper.step(feed)
            except catch:
                failures += 1
                assert cache.seq_length == length and dev.live_tensors == live
                continue
            tokens.append(record.token)
            feed = np.array([record.token])
    return tokens, failures


@pytest.mark.parametrize("point, error", FAULTS, ids=[f"{p}-{type(e).__name__ if e else 'error'}" for p, e in FAULTS])
@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_failed_step_leaves_the_states_as_they_were(models, reference, device, kind, point, error):
    """The fault matrix of tests/test_reliability.py on the hybrid model: its conv and recurrent states are
    rewritten every step, yet a failed step (the run, after it, the in-place check, the commit, Ctrl-C) leaves
    them as they were, and the retried step gives transformers' tokens (token by token on WebGPU)."""
    model, dev = models["hybrid-toy"], open_device(device)
    baseline = dev.live_tensors
    cache = DynamicCache() if kind == "dynamic" else StaticCache(64)
    prompt = PROMPT if device == "cpu" else PROMPT[:1]
    with fault(point, at_call=3, error=error) as state:
        tokens, failures = _decode_with_retries(model, cache, dev, prompt, NEW)
    assert failures == (0 if kind == "dynamic" and point == "in-place" else 1) and state["raised"] == 1
    if device == "cpu":
        assert tokens == reference["hybrid-toy"]
    else:
        assert tokens == _webgpu_from_one_token(models, cache)
    cache.dispose()
    assert dev.live_tensors == baseline


def _webgpu_from_one_token(models, cache):
    cache.reset()
    return generate(
        models["hybrid-toy"], PROMPT[:1], cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False
    ).token_ids


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_hook_that_raises_rolls_the_states_back(models, reference, kind):
    model, dev = models["hybrid-toy"], open_device("cpu")
    baseline = dev.live_tensors
    with DynamicCache() if kind == "dynamic" else StaticCache(64) as cache:
        tokens, failures = _decode_with_retries(model, cache, dev, PROMPT, NEW, hooks=[raising_hook(4)])
    assert failures == 1 and tokens == reference["hybrid-toy"] and dev.live_tensors == baseline


@pytest.mark.parametrize("point", ["after-run", "hook"])
def test_in_place_states_refuse_to_go_on_after_a_failed_step(models, reference, point):
    """states='in-place' cannot undo a step whose run overwrote its states: the next step is refused (naming
    why), nothing leaks, and a reset (generate() does one) makes the cache whole again."""
    model, dev = models["hybrid-toy"], open_device("cpu")
    baseline = dev.live_tensors
    cache = StaticCache(64, states="in-place")
    hooks = [raising_hook(3)] if point == "hook" else []
    injected = fault("after-run", at_call=3) if point == "after-run" else nullcontext()
    with pytest.raises(CacheStateError, match="updated in place and no longer match its .* tokens: a step"):
        with injected:
            _decode_with_retries(model, cache, dev, PROMPT, NEW, hooks=hooks)
    assert dev.live_tensors == baseline + len(cache.tensors)  # only its own buffers
    g = generate(model, PROMPT, cache=cache, max_new_tokens=NEW, stop_on_eos=False)
    assert g.token_ids == reference["hybrid-toy"]
    cache.dispose()
    assert dev.live_tensors == baseline


# ------------------------------------------------------------------------------ bad inputs
def _copy(model, tmp_path):
    out = tmp_path / "m"
    shutil.copytree(model.info.path, out)
    return out


def test_an_unknown_layer_kind_is_named_with_its_input_output_and_op(models, tmp_path):
    import onnx

    d = _copy(models["conv-toy"], tmp_path)
    graph = onnx.load(str(d / "model.onnx"), load_external_data=False)
    node = next(n for n in graph.graph.node if n.op_type == "CausalConvWithState")
    node.op_type = "ShortConvWithState"  # a layer kind kvlab has no rule for
    onnx.save(graph, str(d / "model.onnx"))
    with pytest.raises(
        ModelError,
        match=r"the state input 'past.0.conv' / output 'present.0.conv' is read by "
        r"ShortConvWithState node '/model/layers.0/conv/CausalConvWithState' and "
        r"written by ShortConvWithState node .*a layer kind kvlab does not know",
    ):
        kvlab.load(d)


def test_an_undeclared_state_input_is_named_with_the_op_reading_it(models, tmp_path):
    d = _copy(models["conv-toy"], tmp_path)
    cfg = json.loads((d / "genai_config.json").read_text())
    del cfg["model"]["decoder"]["inputs"]["past_conv_names"]
    (d / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelError,
        match=r"graph inputs \['past.0.conv', .*are not handled by kvlab \('past.0.conv' "
        r"is read by CausalConvWithState node '/model/layers.0/conv/",
    ):
        kvlab.load(d)


BY_HAND_IN_PLACE = """
import numpy as np, kvlab
dev = kvlab.open_device("webgpu", validation_mode="basic")  # the check that reports it ("disabled" is silent)
model = kvlab.load(MODEL_DIR)
info, session = model.info, dev.session(model.onnx_path)
b = session.binding()
buffers = [dev.zeros(e.shape(8) if e.grows else e.dims, e.dtype) for e in info.entries]
for e, buf in zip(info.entries, buffers):
    b.input(e.past, buf)
    b.output(e.present, buf)
b.input("input_ids", np.array([[5]], np.int64))
b.input("attention_mask", np.ones((1, 1), np.int64))
b.output(info.logits_name, np.empty((1, 1, info.vocab_size), np.float32))
try:
    b.run()
    print("ran")
except Exception as exc:
    print("refused:", exc)
for buf in buffers:
    buf.release()
"""


def test_in_place_states_are_refused_on_webgpu_and_the_reason_still_holds(models):
    """The refusal names what onnxruntime-webgpu 1.27 does; binding a state in place by hand, in a process whose
    device checks ("basic" validation), shows it still does (when a later version accepts it, this test says so).
    The plugin EP accepts it, and kvlab runs in-place states there (their tokens: the transformers tests above,
    which include states='in-place' where the backend allows)."""
    model = models["conv-toy"]
    if backend().webgpu_states_in_place:
        with StaticCache(64, states="in-place") as cache:
            generate(model, PROMPT, cache=cache, device="webgpu", max_new_tokens=2)
        return
    with pytest.raises(
        ConfigError, match=r"StaticCache\(states='in-place'\) cannot run model conv-toy's states on WebGPU"
    ):
        generate(model, PROMPT, cache=StaticCache(64, states="in-place"), device="webgpu", max_new_tokens=2)
    r = run_python(BY_HAND_IN_PLACE.replace("MODEL_DIR", repr(str(model.info.path))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "refused:" in r.stdout and "includes writable usage and another usage in the same synchronization" in r.stdout
    )


def test_in_place_is_checked_for_states_too(models):
    """The static cache's in-place check covers the states' buffers: every state present is in the map of
    buffers the runtime must write into (what commit compares the returned buffers with), bound as such."""
    model, dev = models["conv-toy"], open_device("cpu")
    with StaticCache(64) as cache, Stepper(model, cache, dev, 16) as s:
        s.step(PROMPT[:4])
        b = cache.binding(s.session, 1)
        state_outputs = [e.present for e in model.info.entries if not e.grows]
        assert set(state_outputs) <= set(cache.proof.expected)  # every state present is checked
        assert all(cache.proof.expected[n] == b.bound_outputs[n] for n in cache.proof.expected)
    with pytest.raises(ConfigError, match=r"states='sideways' is not valid; choose one of \('swap', 'in-place'\)"):
        StaticCache(64, states="sideways")


# ------------------------------------------------------------------------------ the build
def test_the_builds_record_their_graph_rewrites(models):
    recipe = lambda name: json.loads((models[name].info.path / "kvlab_recipe.json").read_text())  # noqa: E731
    hybrid = " ".join(recipe("hybrid-toy")["graph_rewrites"])
    for what in (
        "state_window=0 dropped",
        "LinearAttentionGate ->",
        "GatedRMSNorm ->",
        "MRotaryEmbedding",
        "position_ids: [3, batch, sequence] -> [batch, sequence]",
    ):
        assert what in hybrid
    assert len(recipe("mistral-toy")["graph_rewrites"]) == 8  # the window, on every layer
    assert recipe("gemma2-toy")["graph_rewrites"] == []


def test_without_its_rewrites_the_builders_graph_does_not_load(models, tmp_path):
    """The builder's own Qwen3.5 graph, exported again here without kvlab's rewrites: onnxruntime 1.27 refuses
    it (what kvlab.ort.models.rewrites fixes); onnxruntime 1.31 (the plugin EP's environment) has those ops and loads
    it."""
    import onnxruntime as ort

    from kvlab.ort.models.build import export

    export(hf_checkpoint(models["hybrid-toy"]), tmp_path, "hybrid-toy", "fp32", "qwen3_5")
    if on_the_plugin_ep():
        ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
        return
    with pytest.raises(Exception, match="state_window|LinearAttentionGate"):
        ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
