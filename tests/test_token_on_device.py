"""The greedy token kept on the device (``token_on_device=True``, ``kvlab.ort.decode.greedy``): the graph picks the
token and the next step reads it from a device tensor. Compared against kvlab's own host-side greedy path on the same
real session (which tests/test_generate.py compares with onnxruntime-genai and transformers)."""

from __future__ import annotations

import numpy as np
import pytest

import kvlab
from kvlab import ConfigError, DynamicCache, Sampling, StaticCache
from kvlab.ort import Stepper, generate, open_device
from kvlab.ort.checks.faults import Injected, fault
from kvlab.ort.decode.greedy import auto_reduction
from kvlab.ort.runtime.plugin import installed
from kvlab.ort.runtime.session import Binding, DeviceTensor

PROMPT = "Once upon a time"
CACHES = {"dynamic": DynamicCache, "static": lambda: StaticCache(64)}


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("kind", list(CACHES))
def test_tokens_equal_the_host_greedy_path(toy, device, kind):
    dev = open_device(device)
    before = dev.live_tensors
    runs = {}
    for on_device in (False, True, "rows"):
        with CACHES[kind]() as cache:
            runs[on_device] = generate(
                toy, PROMPT, cache=cache, device=device, max_new_tokens=20, stop_on_eos=False, token_on_device=on_device
            )
    assert runs[True].token_ids == runs[False].token_ids == runs["rows"].token_ids
    assert len(runs[True].token_ids) == 20 and runs["rows"].label.greedy_reduction == "rows"
    assert dev.live_tensors == before  # the two token tensors went with the stepper


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_no_token_is_fed_from_the_host_after_the_prefill(toy, device, monkeypatch):
    """Every decode step binds its input ids to a device tensor the previous run wrote (the spy wraps the real
    Binding.input; the runs are real)."""
    fed: list[str] = []
    real = Binding.input

    def spy(self, name, value):
        if name == toy.info.input_names["input_ids"]:
            fed.append("device" if isinstance(value, DeviceTensor) else "host")
        return real(self, name, value)

    monkeypatch.setattr(Binding, "input", spy)
    with StaticCache(64) as cache:
        generate(toy, PROMPT, cache=cache, device=device, max_new_tokens=8, stop_on_eos=False, token_on_device=True)
    assert fed == ["host"] + ["device"] * 7


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_failed_step_is_retried_from_the_token_it_read(toy, device):
    """A step that fails after its run (fault injection: the run really happened and wrote the other token
    tensor) leaves the cache and the token feed as they were: retried, the generation continues as if nothing
    happened. A host-side step in between (logits asked for) makes the next one feed its ids from the host."""
    ids = toy.encode(PROMPT)
    with StaticCache(64) as cache:
        want = generate(
            toy, ids, cache=cache, device=device, max_new_tokens=10, stop_on_eos=False, token_on_device=False
        ).token_ids
    with StaticCache(64) as cache, Stepper(toy, cache, open_device(device), 64, token_on_device=True) as st:
        tokens = [st.step(ids, logits_out="none")[1].token]
        while len(tokens) < 10:
            feed = np.array([tokens[-1]], np.int64)
            if len(tokens) == 4:
                with fault("after-run"), pytest.raises(Injected):
                    st.step(feed, logits_out="none")
                assert cache.seq_length == len(ids) + 3
            logits_out = "last" if len(tokens) == 6 else "none"  # one step on the host path
            out, rec = st.step(feed, logits_out=logits_out)
            assert (out is None) == (logits_out == "none")
            tokens.append(rec.token)
    assert tokens == want


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_the_label_says_where_the_token_was_chosen(toy, device):
    """Which path is faster depends on the device, the adapter and the vocabulary (data/token-on-the-device/): the
    default ("auto") keeps the token on the device on the CPU EP and on a hardware adapter, chooses on the host on a
    software one, and each run's label says which path ran."""

    def run(**kw):
        return generate(toy, PROMPT, device=device, max_new_tokens=6, stop_on_eos=False, **kw)

    default, host, on_device = run(), run(token_on_device=False), run(token_on_device=True)
    adapter = open_device(device).label.adapter.kind
    assert default.label.token_on_device == (device == "cpu" or adapter == "hardware")  # toy: vocabulary 260
    assert not host.label.token_on_device and on_device.label.token_on_device
    assert on_device.token_ids == host.token_ids == default.token_ids


def test_auto_keeps_the_token_on_the_device_only_where_it_was_measured_to_pay():
    from kvlab.ort.decode.greedy import AUTO_MAX_VOCAB

    assert auto_reduction(1024, "hardware", "webgpu") == "single"  # phi4-kv's vocabulary: x0.91 of genai
    assert auto_reduction(49152, "hardware", "webgpu") == "rows"  # SmolLM2's: x0.99 of genai, the host path x1.02+
    assert auto_reduction(AUTO_MAX_VOCAB + 1, "hardware", "webgpu") == "rows"
    assert auto_reduction(260, "software", "webgpu") == ""
    assert auto_reduction(260, "hardware", "cpu") == auto_reduction(49152, "hardware", "cpu") == "single"


def test_auto_with_sampling_chooses_on_the_host(toy):
    g = generate(toy, PROMPT, max_new_tokens=3, sampling=Sampling(do_sample=True, seed=0), token_on_device="auto")
    assert not g.label.token_on_device


def test_refusals(toy):
    with pytest.raises(
        ConfigError,
        match="token_on_device='yes' must be True or False, 'auto', or a reduction of the greedy graph: "
        "'blocks', 'single', 'rows'",
    ):
        generate(toy, PROMPT, max_new_tokens=2, token_on_device="yes")
    with pytest.raises(ConfigError, match="sampling .do_sample=True. needs the logits on the host"):
        generate(toy, PROMPT, max_new_tokens=2, token_on_device=True, sampling=Sampling(do_sample=True, seed=0))
    from kvlab.ort.decode.caches.ring import RingStaticCache

    with pytest.raises(ConfigError, match="a RingStaticCache runs a session of its own"):
        Stepper(toy, RingStaticCache(64), open_device("cpu"), 64, token_on_device=True)
    assert kvlab.ort.decode.greedy.greedy_graph(toy).is_file()  # written beside the model, reused


def test_bench_pairs_the_token_on_device_twin_with_its_static_cache(toy):
    """``kvlab bench --set token_on_device=on``: each static cache runs again with the token kept on the device, in the
    same paired rounds, with the same tokens."""
    from kvlab.bench import Plan, report, run_plan

    plan = Plan(
        targets=[("toy", "cpu")],
        contexts={"cpu": [32]},
        new_tokens={"cpu": 6},
        reps=2,
        genai={"cpu": False},
        small_pages_twin=False,
        matmuls_only=False,
        token_on_device={"cpu": True},
    )
    rows = run_plan(plan, log=lambda _: None)["rows"]
    names = [r["variant"] for r in rows]
    # the twin runs the reduction the default picks on the CPU EP, named
    assert names == ["dynamic", "static@37", "static@37 token-on-device (single)"]
    assert all(r["tokens_equal"] for r in rows) and rows[2]["token_on_device"] and not rows[1]["token_on_device"]
    assert rows[2]["greedy_reduction"] == "single" and rows[1]["greedy_reduction"] == ""
    assert len(rows[2]["decode_ms_runs"]) == 2 and report({"rows": rows})


def test_a_greedy_graph_that_cannot_be_written_is_a_model_error(toy, tmp_path):
    """The greedy graph is written beside the model's graph: when that fails, the error names the directory and
    leaves no temporary file. (A directory stands where the file would go: a real failure of the write, also for
    root, whom directory permissions do not stop.)"""
    import shutil

    from kvlab import ModelError
    from kvlab.ort.decode.greedy import SUFFIXES, greedy_graph

    copy = tmp_path / "toy"
    shutil.copytree(toy.info.path, copy, ignore=shutil.ignore_patterns("*" + SUFFIXES["blocks"]))
    model = kvlab.load(str(copy))
    (copy / ("model" + SUFFIXES["blocks"]) / "in-the-way").mkdir(parents=True)
    with pytest.raises(ModelError, match=f"greedy graph beside its model.onnx, in {copy}"):
        greedy_graph(model)
    assert not list(copy.glob("*.tmp"))


def test_step_phases_default_to_what_generate_runs(toy):
    """``kvlab profile phases`` without a token flag measures generate()'s default (``token_on_device="auto"``):
    the reduction auto picks for this vocabulary on this adapter, named in the result (the host path, "", on the
    CPU EP and on a software adapter)."""
    from kvlab import bench

    for device in ("cpu", "webgpu"):
        r = bench.step_phases(toy, device, context=16, new_tokens=4, rounds=1, genai=False)
        dev = open_device(device)
        want = auto_reduction(toy.info.vocab_size, dev.label.adapter.kind, device)
        assert (r["greedy_reduction"], r["token_on_device"]) == (want, bool(want))


def test_step_phases_with_the_token_on_device(toy):
    """``kvlab profile phases --token-on-device``: kvlab's rounds keep the token on the device (real sessions,
    SwiftShader) and repeat their tokens, which equal the host path's."""
    from kvlab import bench

    r = bench.step_phases(toy, "webgpu", context=16, new_tokens=5, rounds=1, genai=False, token_on_device=True)
    assert r["token_on_device"] and r["kvlab_tokens_repeat"]
    with StaticCache(64) as cache:
        want = generate(
            toy,
            bench.plan.prompt_ids(toy, 16),
            cache=cache,
            device="webgpu",
            max_new_tokens=5,
            stop_on_eos=False,
            token_on_device=False,
        ).token_ids
    with StaticCache(64) as cache:
        got = generate(
            toy,
            bench.plan.prompt_ids(toy, 16),
            cache=cache,
            device="webgpu",
            max_new_tokens=5,
            stop_on_eos=False,
            token_on_device=True,
        ).token_ids
    assert got == want


def _logits_only_model(path, vocab: int):
    """A real one-node graph whose "logits" output is its input: the greedy reductions run on exactly the logits
    a test chooses (ties, -inf, a vocabulary that is not a whole number of blocks)."""
    from types import SimpleNamespace

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])],
        "logits_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", vocab])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", vocab])],
    )
    path.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    onnx.save(model, str(path / "model.onnx"))
    info = SimpleNamespace(logits_name="logits", vocab_size=vocab, input_names={})
    return SimpleNamespace(onnx_path=str(path / "model.onnx"), info=info, name=f"logits-{vocab}")


@pytest.mark.parametrize("vocab", [97, 512, 1024, 49152])
@pytest.mark.parametrize("reduction", ["blocks", "single", "rows"])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_every_reduction_picks_numpys_argmax_ties_included(tmp_path, device, reduction, vocab):
    from kvlab.ort.decode.greedy import NEXT, greedy_graph, not_a_token

    model = _logits_only_model(tmp_path, vocab)
    session = open_device(device).session(greedy_graph(model, reduction), f"greedy {reduction} over {vocab}")
    on_cpu = {n.split(":", 1)[1] for n in session.cpu_nodes if device == "webgpu" and ":kvlab/" in n}
    # WebGPU runs few int64 ops: the built-in package casts the [1, 1] index to int64 on the CPU EP (the plugin EP on
    # WebGPU)
    allowed = {"kvlab/to_int64"} if reduction == "blocks" and not installed() else set()
    assert on_cpu <= allowed, session.cpu_nodes
    rng = np.random.default_rng(vocab)
    cases = [rng.normal(size=(1, 3, vocab)).astype(np.float32) for _ in range(6)]
    for x in cases[:3]:  # ties: the largest value at several places, the lowest index must win
        places = rng.choice(vocab, size=4, replace=False)
        x[0, -1, places] = x.max() + 1
    cases[3][0, -1, :] = 0.0  # all equal: index 0
    cases[4][0, -1, :-1] = -3e38  # only the last (a padded block's neighbour) is not the lowest float
    for x in cases:
        got = session.ort.run([NEXT], {"x": x})[0]
        assert got.shape == (1, 1) and int(got[0, 0]) == int(np.argmax(x[0, -1])), (reduction, vocab)
    for bad in (np.nan, np.inf, -np.inf):  # a non-finite logit anywhere: a token outside the vocabulary
        x = cases[0].copy()
        x[0, -1, vocab // 2] = bad
        got = int(session.ort.run([NEXT], {"x": x})[0][0, 0])
        assert not_a_token(got, vocab) and got == (vocab if reduction == "single" else -1), (reduction, bad, got)


def test_an_unknown_reduction_is_named(toy):
    from kvlab.ort.decode.greedy import greedy_graph

    with pytest.raises(
        ConfigError, match=r"reduction='tree' is not valid; choose one of \('blocks', 'single', 'rows'\)"
    ):
        greedy_graph(toy, "tree")


def test_auto_on_a_captured_cache_keeps_the_token_on_the_device_where_one_argmax_pays(monkeypatch):
    """Under capture the graph writes the greedy token into the next step's ids (``caches.capture_binding``): "auto"
    takes "single" where ``auto_reduction`` says "single", the host where it says "rows" (a captured step's ids stay
    int64), and an explicit "rows" is refused by name. The adapter's answer is faked at the boundary
    (SwiftShader is a software adapter, where "auto" chooses the host); the runs are real."""
    import kvlab.ort.decode.greedy as greedy
    from kvlab.ort import CapturedStaticCache

    graph_toy = kvlab.load("toy", graph_capture=True)
    with StaticCache(64) as cache:
        want = generate(graph_toy, PROMPT, cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
    monkeypatch.setattr(greedy, "auto_reduction", lambda *a: "single")
    with CapturedStaticCache(64) as cache:
        g = generate(graph_toy, PROMPT, cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
    assert (g.label.token_on_device, g.label.greedy_reduction) == (True, "single")
    assert g.token_ids == want.token_ids
    monkeypatch.setattr(greedy, "auto_reduction", lambda *a: "rows")
    with CapturedStaticCache(64) as cache:
        g = generate(graph_toy, PROMPT, cache=cache, device="webgpu", max_new_tokens=4, stop_on_eos=False)
    assert not g.label.token_on_device and g.token_ids == want.token_ids[:4]
    with pytest.raises(ConfigError, match="with reduction 'single' or 'blocks', not 'rows'"):
        with CapturedStaticCache(64) as cache:
            generate(graph_toy, PROMPT, cache=cache, device="webgpu", max_new_tokens=2, token_on_device="rows")


def test_rows_takes_int32_ids_and_refuses_a_graph_whose_ids_feed_more_than_a_gather(tmp_path):
    """ "rows" retypes the input ids to int32: right where only a Gather reads them as indices (the built models),
    refused by name where another node reads them (here a Cast beside the embedding's Gather)."""
    from types import SimpleNamespace

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from kvlab import ModelError
    from kvlab.ort.decode.greedy import greedy_graph, ids_dtype

    def model(extra_reader: bool):
        nodes = [helper.make_node("Gather", ["table", "input_ids"], ["logits"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", 8])]
        if extra_reader:
            nodes.append(helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT))
            outputs.append(helper.make_tensor_value_info("ids_f", TensorProto.FLOAT, [1, "n"]))
        table = numpy_helper.from_array(np.eye(8, dtype=np.float32), "table")
        ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "n"])
        graph = helper.make_graph(nodes, "ids", [ids], outputs, [table])
        path = tmp_path / f"extra-{extra_reader}"
        path.mkdir()
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path / "m.onnx")
        info = SimpleNamespace(logits_name="logits", vocab_size=8, input_names={"input_ids": "input_ids"})
        return SimpleNamespace(onnx_path=str(path / "m.onnx"), info=info, name=f"ids-{extra_reader}")

    g = onnx.load(str(greedy_graph(model(False), "rows"))).graph
    assert [i.type.tensor_type.elem_type for i in g.input if i.name == "input_ids"] == [TensorProto.INT32]
    assert ids_dtype("rows") == np.int32 and ids_dtype("single") == ids_dtype("blocks") == np.int64
    with pytest.raises(
        ModelError,
        match=r"input ids as int32, which only a Gather's indices accept; 'input_ids' is "
        r"also read by \['Cast', 'Gather'\]: use 'blocks' or 'single'",
    ):
        greedy_graph(model(True), "rows")
