"""WebGPU graph capture of the decode step (kvlab.ort.decode.caches.captured), on the real runtime of this environment
(the built-in EP of onnxruntime-webgpu 1.27 in .venv, the plugin EP in .venv-plugin): tokens equal the uncaptured
StaticCache's, one capture per cache across generations (counted from ONNX Runtime's own log), the graph and
every tensor released on dispose, and the refusals, each naming its cause."""

from __future__ import annotations

import gc
import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import run_python

import kvlab
from kvlab import CacheStateError, ConfigError, DeviceError, ModelError, StaticCache, generate, open_device
from kvlab.lab.graph_edits import with_constant_of_shape
from kvlab.ort.checks import faults
from kvlab.ort.decode.caches.captured import CAPTURE_OPTIONS, CapturedStaticCache, capture_cost, capture_problem
from kvlab.ort.runtime.device import backend
from kvlab.ort.runtime.plugin import PluginWebGpu

PROMPT = [7, 81, 190, 33]  # four tokens: 1.27's SwiftShader prefill is right up to query position 3
NEW = 12


@pytest.fixture(scope="module")
def toy_graph() -> kvlab.Model:
    return kvlab.load("toy", graph_capture=True)


def _static_tokens(model, **kw) -> list[int]:
    with StaticCache(64) as cache:
        return generate(
            model, PROMPT, cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False, **kw
        ).token_ids


def test_the_graph_build_is_the_same_model(toy, toy_graph):
    assert toy_graph.name == "toy-graph" and toy_graph.info.layout == toy.info.layout
    assert capture_problem(toy_graph.info) == ""
    assert "Shape node" in capture_problem(toy.info)
    assert _static_tokens(toy_graph) == _static_tokens(toy)


def test_captured_tokens_equal_the_uncaptured_static_cache(toy, toy_graph):
    dev = open_device("webgpu")
    base = dev.live_tensors
    with CapturedStaticCache(64) as cache:
        g = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False)
        assert dev.live_tensors == base + toy.info.layout.tensors + 5  # KV buffers + 2 ids, 2 masks, logits
        assert (cache.captures, cache.replays) == (2, NEW - 3)  # prefill uncaptured, 1st and 2nd decode capture
    assert g.token_ids == _static_tokens(toy)
    assert str(g.label.cache) == "static@64 graph" and g.label.cache.variant == "graph"
    # "auto" picks where the token is chosen as the cache says for this adapter (the host on a software one)
    assert g.label.greedy_reduction == cache.auto_reduction(toy_graph.info.vocab_size, dev)
    assert g.label.token_on_device == bool(g.label.greedy_reduction)
    decode = [r for r in g.records if r.phase == "decode"]
    assert all(r.cache_tensors_allocated == 0 and r.new_buffers == 0 for r in decode[1:])


def test_a_cpu_prefill_hands_off_to_the_captured_cache(toy, toy_graph):
    """The prefill runs on a plain StaticCache on the CPU EP (its twin), then the KV is copied in."""
    long_prompt = list(range(3, 40))  # longer than 1.27's right prefill on SwiftShader: the CPU does it
    with StaticCache(64) as cache:
        cpu = generate(toy, long_prompt, cache=cache, device="cpu", max_new_tokens=NEW, stop_on_eos=False)
    with CapturedStaticCache(64) as cache:
        assert type(cache.empty_like()) is StaticCache
        g = generate(
            toy_graph,
            long_prompt,
            cache=cache,
            device="webgpu",
            max_new_tokens=NEW,
            stop_on_eos=False,
            prefill_device="cpu",
        )
        assert (cache.captures, cache.replays) == (2, NEW - 3)
    assert [r.phase for r in g.records[:2]] == ["prefill", "handoff"]
    assert g.token_ids == cpu.token_ids


def test_reset_and_reuse_replay_without_recapture(toy_graph):
    """Three generations through one cache: 3 x (NEW - 1) decode runs, two captures (one per pair of step
    buffers), the rest replays; ONNX Runtime's own log (severity info) counts the replays."""
    r = run_python(
        f"""
import kvlab
from kvlab.ort.decode.caches.captured import CapturedStaticCache
m = kvlab.load('toy', graph_capture=True)
cache = CapturedStaticCache(64)
a = kvlab.generate(m, {PROMPT}, cache=cache, device='webgpu', max_new_tokens={NEW}, stop_on_eos=False)
cache.reset()
b = kvlab.generate(m, {PROMPT[::-1]}, cache=cache, device='webgpu', max_new_tokens={NEW}, stop_on_eos=False)
c = kvlab.generate(m, {PROMPT}, cache=cache, device='webgpu', max_new_tokens={NEW}, stop_on_eos=False)
print('KVLAB', cache.captures, cache.replays, a.token_ids == c.token_ids, a.token_ids != b.token_ids, flush=True)
cache.dispose()
""",
        env={"KVLAB_ORT_LOG_SEVERITY": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    decode_runs = 3 * (NEW - 1)
    assert f"KVLAB 2 {decode_runs - 2} True True" in r.stdout
    assert log.count("Replaying the captured WebGpuExecutionProvider graph") == decode_runs - 2
    assert log.count("will use the graph capture feature") == 1  # one capturing session


def test_a_replay_reads_the_updated_inputs(toy, toy_graph):
    """After a capture, a different prompt gives its own tokens (the replay reads the updated inputs)."""
    with CapturedStaticCache(64) as cache:
        a = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
        b = generate(toy_graph, PROMPT[::-1], cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
    with StaticCache(64) as cache:
        b_ref = generate(toy, PROMPT[::-1], cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
    assert b.token_ids == b_ref.token_ids and a.token_ids != b.token_ids


def test_replays_after_the_first_skip_the_read_back(toy_graph, monkeypatch):
    """The presents' buffer identities are read back at the prefill, and at each graph's capture and first replay,
    then no more (a replay runs the recorded buffers), also in a second generation on the same graphs; the tokens
    are those of a cache that checks every step. The real runs are observed, not altered."""
    from kvlab.ort.decode.caches.capture_binding import CaptureBinding

    read: list[bool] = []
    real_run = CaptureBinding.run

    def observed(self):
        result = real_run(self)
        read.append(result.returned_ptrs is not None)
        return result

    monkeypatch.setattr(CaptureBinding, "run", observed)
    with CapturedStaticCache(64) as cache:
        first = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
        again = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=6, stop_on_eos=False)
    assert read == [True] * 4 + [False] * (2 * 5 - 4)  # 5 one-token runs per generation: 2 captures, 8 replays
    assert first.token_ids == again.token_ids == _static_tokens(toy_graph)[:6]


def test_dispose_releases_the_graph_and_every_tensor(toy_graph):
    dev = open_device("webgpu")
    base = dev.live_tensors
    cache = CapturedStaticCache(64)
    g = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=4, stop_on_eos=False)
    session = cache.session(dev, toy_graph, g.label.greedy_reduction)  # the capturing session the steps ran on
    assert session is not None and dev.live_tensors == base + 9  # 4 KV buffers, 5 step buffers
    capturing = weakref.ref(session.ort)
    if isinstance(backend(), PluginWebGpu):
        assert set(cache.graph_ids) <= set(session.ort._captured_graph_bindings)
    cache.dispose()
    assert dev.live_tensors == base and cache.tensors == ()
    if isinstance(backend(), PluginWebGpu):  # released on its own; the session stays for the next cache
        assert not set(cache.graph_ids) & set(session.ort._captured_graph_bindings)
    else:  # 1.27 cannot release one graph: the capturing session, which owns it, is let go
        del session
        gc.collect()
        assert capturing() is None
    with pytest.raises(CacheStateError, match="was disposed"):
        generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=4)
    with CapturedStaticCache(64) as again:  # a new cache captures a graph of its own
        generate(toy_graph, PROMPT, cache=again, device="webgpu", max_new_tokens=4, stop_on_eos=False)
        assert again.captures == 2 and not set(again.graph_ids) & set(cache.graph_ids)
    assert dev.live_tensors == base


def test_a_failed_captured_step_retries_and_keeps_the_graph(toy, toy_graph):
    """A run that fails (injected) after the capture: the step is retried, tokens as without the fault."""
    dev = open_device("webgpu")
    base = dev.live_tensors
    want = _static_tokens(toy)
    with CapturedStaticCache(64) as cache:
        with faults.fault("after-run", at_call=4), pytest.raises(faults.Injected) as info:
            generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False)
        assert info.value.partial.token_ids == want[:3]
        with faults.fault("run", at_call=2, error=KeyboardInterrupt()), pytest.raises(KeyboardInterrupt):
            generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False)
        g = generate(toy_graph, PROMPT, cache=cache, device="webgpu", max_new_tokens=NEW, stop_on_eos=False)
        assert g.token_ids == want and cache.captures == 2
    assert dev.live_tensors == base


# -- refusals, each naming its cause
def test_a_model_not_built_for_capture_is_refused(toy):
    dev = open_device("webgpu")
    base, sessions = dev.live_tensors, dev.sessions
    with CapturedStaticCache(64) as cache:
        with pytest.raises(
            ModelError,
            match=r"cannot be captured: its attention takes the total length from the "
            r"attention mask's length \(Shape node .*graph_capture=True",
        ):
            generate(toy, PROMPT, cache=cache, device="webgpu", max_new_tokens=4)
        assert not cache.allocated and dev.live_tensors == base and dev.sessions == sessions  # before anything


def test_capture_on_the_cpu_is_refused(toy_graph):
    with CapturedStaticCache(64) as cache:
        with pytest.raises(DeviceError, match="device 'cpu' has none"):
            generate(toy_graph, PROMPT, cache=cache, device="cpu", max_new_tokens=4)
        assert not cache.allocated


def test_an_optimum_export_is_refused(optimum_toy):
    with CapturedStaticCache(64) as cache, pytest.raises(ModelError, match="cannot be captured"):
        generate(kvlab.load(optimum_toy), PROMPT, cache=cache, device="webgpu", max_new_tokens=4)


def test_a_node_on_the_cpu_ep_is_refused_by_name(toy_graph, tmp_path):
    model = kvlab.load(with_constant_of_shape(toy_graph.info.path, tmp_path / "cos"))
    dev = open_device("webgpu")
    base = dev.live_tensors
    with (
        CapturedStaticCache(64) as cache,
        pytest.raises(
            DeviceError,
            match=r"graph capture refused for model cos .*"
            r"ConstantOfShape 'lesson/Constant"
            r"OfShape'",
        ),
    ):
        generate(model, PROMPT, cache=cache, device="webgpu", max_new_tokens=4)
    assert dev.live_tensors == base
    assert not [s for s in dev.sessions if "cos" in s]  # neither the refused session nor the diagnosis is kept
    with StaticCache(64) as cache:  # uncaptured, the same model runs (the node on the CPU EP)
        got = generate(model, PROMPT, cache=cache, device="webgpu", max_new_tokens=4, stop_on_eos=False).token_ids
    assert got == _static_tokens(toy_graph)[:4]


def test_a_captured_step_takes_only_its_own_feeds(toy_graph):
    with CapturedStaticCache(64) as cache, kvlab.Stepper(toy_graph, cache, "webgpu", 8) as st:
        st.step(PROMPT)
        b = cache.binding(st.session, 1)
        with pytest.raises(DeviceError, match="takes only"):
            b.input("past_key_values.0.key", np.zeros((1, 2, 64, 16), np.float32))
        with pytest.raises(DeviceError, match="allocates nothing"):
            b.output_new("logits")
        with pytest.raises(kvlab.ConfigError, match=r"one token \(\[1, 1\] ids\)"):
            b.input("input_ids", np.zeros((1, 2), np.int64))


def test_the_capture_session_is_opened_with_the_option(toy_graph):
    with CapturedStaticCache(64) as cache:
        session = cache.session(open_device("webgpu"), toy_graph)
    assert session.options == CAPTURE_OPTIONS and not session.cpu_nodes  # everything on WebGPU


# -- the command line
def _kvlab(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True, timeout=600)


def test_compare_graph_capture_adds_a_third_row_with_the_same_tokens():
    import json

    r = _kvlab(
        "compare",
        "--device",
        "webgpu",
        "--cache",
        "dynamic,static@64,graph@64",
        "abc",
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert list(out["runs"]) == ["dynamic", "static@64", "graph@64"] and out["identical"] is True
    assert out["runs"]["graph@64"]["label"]["cache"]["variant"] == "graph"
    assert out["runs"]["graph@64"]["summary"]["tensors_per_step"] == 0
    cost = out["runs"]["graph@64"]["summary"]["capture"]  # against the static row's median step
    static_ms = float(np.median([s["wall_ms"] for s in out["runs"]["static@64"]["records"] if s["phase"] == "decode"]))
    assert cost["capture_ms"] >= 0 and cost["uncaptured_ms"] == pytest.approx(static_ms)
    saving = static_ms - cost["replay_ms"]
    assert cost["pays_off_after"] == (math.ceil(cost["capture_ms"] / saving) if saving > 0 else None)


def test_capture_cost_is_the_capturing_steps_beyond_a_replay():
    """Two capturing steps of 30 and 20 ms, replays of 4 ms: 42 ms of capture; against an uncaptured 10 ms step it
    pays back after 7 tokens, against a 4 ms one never; fewer than three decode steps cannot tell."""
    step = lambda ms, phase="decode": SimpleNamespace(phase=phase, n_tokens=1, wall_ms=ms)  # noqa: E731
    records = [step(50.0, "prefill"), step(30.0), step(20.0), step(4.0), step(5.0), step(3.0)]
    cost = capture_cost(records, 10.0)
    assert (cost.capture_ms, cost.replay_ms, cost.pays_off_after) == (42.0, 4.0, 7)
    assert "pays for itself after 7 tokens" in str(cost)
    assert capture_cost(records, 4.0).pays_off_after is None and "does not pay" in str(capture_cost(records, 3.0))
    assert capture_cost(records).pays_off_after is None
    with pytest.raises(ConfigError, match="at least 3 decode steps"):
        capture_cost(records[:3])


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--cache", "graph"], "--cache graph replays a captured WebGPU graph; it needs --device webgpu"),
        (["generate", "--cache", "graph", "--device", "webgpu", "--kv-precision", "int8"], "holds the model's KV"),
        (["compare", "--cache", "dynamic,static,graph", "--device", "cpu"], "needs --device webgpu, not cpu"),
    ],
)
def test_graph_capture_flags_that_cannot_work_are_one_line_errors(args, message):
    r = _kvlab(*args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_graph_capture_rows_are_paired_and_token_identical(tmp_path):
    """kvlab bench --set graph_capture=on: static vs static + graph vs genai plain and captured, with the process's and
    the loop thread's CPU time per step, from paired runs."""
    import json

    r = _kvlab(
        "bench",
        "--models",
        "toy",
        "--devices",
        "webgpu",
        "--contexts",
        "4",
        "--new-tokens",
        "5",
        "--reps",
        "2",
        "--set",
        "graph_capture=on",
        "--set",
        "genai=webgpu",
        "--set",
        "static_lens=64",
        "--set",
        "charts=off",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    by = {row["variant"]: row for row in rows}
    assert set(by) >= {"dynamic", "static@64", "static@64 graph", "genai", "genai graph"}
    assert all(row["valid"] and row["tokens_equal"] for row in rows)
    for row in rows:
        assert row["cpu_ms"] > 0 and row["thread_cpu_ms"] > 0 and len(row["cpu_ms_runs"]) == 2
    assert by["static@64 graph"]["model"] == "toy" and by["static@64 graph"]["tensors_per_step"] == 0
    assert [by[v]["model_build"] for v in ("static@64", "static@64 graph", "genai", "genai graph")] == [
        "standard",
        "enable_webgpu_graph",
        "standard",
        "enable_webgpu_graph",
    ]
    assert "graph capture static@64 graph vs static@64: step" in r.stdout
    assert "graph capture genai graph vs genai: step" in r.stdout


def test_gpu_memory_traces_hook_every_runner(monkeypatch, toy, toy_graph):
    """`kvlab bench` on an NVIDIA GPU reads NVML at every step of one more run per variant: kvlab's runs take a
    step hook, genai's (plain and captured) a per-token callback. NVML cannot be read here, so its reader is
    replaced by a counter (fault injection of the one part that needs the hardware); the runs are real."""
    from kvlab.bench import plan
    from kvlab.bench.variants import GENAI, GENAI_GRAPH, KVLAB, GenaiPeer, Variant, run_kvlab
    from kvlab.core.labels import CacheSpec

    class CountingNvml(plan.GpuMemory):
        def __init__(self):
            super().__init__()
            self.available, self._n = True, 0

        def read(self):
            self._n += 1
            return self._n * 4096

    monkeypatch.setattr(plan, "GpuMemory", CountingNvml)
    ids, new = np.array([7, 81, 190, 33], np.int64), 4
    plain, captured = GenaiPeer(toy, "webgpu"), GenaiPeer(toy_graph, "webgpu", graph_capture=True)
    runners = {
        Variant(KVLAB, CacheSpec("static", 16)): lambda hooks=(): run_kvlab(
            toy, ids, lambda: StaticCache(16), "webgpu", new, hooks
        ),
        Variant(GENAI): lambda hooks=(): plain.run(ids, new, hooks),
        Variant(GENAI_GRAPH): lambda hooks=(): captured.run(ids, new, hooks),
    }
    traces = plan.memory_traces(runners)
    assert set(traces) == set(runners)
    for v, t in traces.items():
        assert len(t["gpu_memory_bytes"]) >= new and t["gpu_memory_growth_bytes"] > 0, (v, t)


@pytest.mark.parametrize("reduction", [False, "single", "blocks"])
def test_a_captured_step_writes_from_the_host_only_what_the_graph_did_not(toy_graph, reduction, monkeypatch):
    """The captured graph writes the next mask (and, with the token on the device, the next ids) into the pair of
    step buffers the next step reads: per generation the host writes the first decode step's ids and mask, then
    only ids it chose itself that the pair read does not hold already (none with the token on the device). Tokens
    equal the uncaptured static cache's in two generations through one cache. The writes are observed, not
    altered."""
    from kvlab.ort.decode.caches.capture_binding import CaptureBinding

    writes: list[tuple[int, ...]] = []
    real_write = CaptureBinding._write

    def observed(self, target, host):
        writes.append(tuple(host.shape))
        real_write(self, target, host)

    monkeypatch.setattr(CaptureBinding, "_write", observed)
    want = _static_tokens(toy_graph)
    with CapturedStaticCache(64) as cache:
        for _ in range(2):
            g = generate(
                toy_graph,
                PROMPT,
                cache=cache,
                device="webgpu",
                max_new_tokens=NEW,
                stop_on_eos=False,
                token_on_device=reduction,
            )
            assert g.token_ids == want and g.label.greedy_reduction == (reduction or "")
        host_writes = cache.host_writes
    held, parity, ids_writes = [None, None], 0, 0  # the host's ids: written where that pair does not hold them
    for token in want[:-1] * 2:
        ids_writes += held[parity] != token
        held[parity], parity = token, 1 - parity
    assert writes.count((1, 1)) == (ids_writes if not reduction else 2)  # with the token on the device: the first
    assert writes.count((1, 64)) == 2  # the first decode step's mask, per generation
    assert host_writes == len(writes)  # the cache's own exact counter agrees


@pytest.mark.parametrize("reduction", [False, "single"])
def test_a_captured_step_retried_after_a_failed_hook_gives_the_same_tokens(toy_graph, reduction):
    """A hook that raises after a captured step's run undoes the step; the same step again (on the other pair of
    step buffers, which the failed run wrote) gives the tokens of a run without the fault."""
    from kvlab.ort import Stepper

    want, failing = _static_tokens(toy_graph), {3, 5, 6}

    def hook(record):
        if record.step in failing:
            failing.discard(record.step)
            raise RuntimeError("injected by the test's hook")

    tokens, ids, failures = [], PROMPT, 0
    with (
        CapturedStaticCache(64) as cache,
        Stepper(toy_graph, cache, open_device("webgpu"), 64, hooks=[hook], token_on_device=reduction) as stepper,
    ):
        while len(tokens) < NEW:
            try:
                _, record = stepper.step(ids, logits_out="none")
            except RuntimeError:
                failures += 1
                continue  # the same step again
            tokens.append(record.token)
            ids = [record.token]
        assert cache.captures == 2
    assert failures == 3 and tokens == want
