"""kvlab bench --quick, as CI's smoke run: it measures, pairs, checks tokens and writes its files."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvlab.bench import memory_bandwidth, weight_bytes_per_token
from kvlab.bench.chart import bench_figure as figure
from kvlab.ort.runtime.plugin import installed
from kvlab.presets import RECIPES

KVLAB = str(Path(sys.executable).parent / "kvlab")


def test_bench_quick_writes_valid_paired_results(tmp_path):
    proc = subprocess.run(
        [KVLAB, "bench", "--quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    env, rows = result["environment"], result["rows"]
    assert env["huge_pages"]["thp_mode"] is None or "[" in env["huge_pages"]["thp_mode"]
    # the roofline: bandwidth measured before every round of runs and after the last, paired with each round
    bw = env["bandwidth_gbps"]
    assert len(bw["paired"]) == len({(r["device"], r["context"]) for r in rows}) * (result["plan"]["reps"] + 1)
    assert bw["best"] == max([bw["copy_1t"], bw["copy_2t"], bw["read_1t"], bw["read_2t"], *bw["paired"]])
    for r in rows:
        assert r["roofline_fraction_min"] <= r["roofline_fraction"] <= r["roofline_fraction_max"]
        assert r["roofline_fraction_at_run_best"] > 0 and r["bandwidth_gbps"] <= bw["best"]
        assert 0 <= r["cpu_steal_fraction"] < 1  # the hypervisor's share of this VM's CPU time during the row
    runtime = ("onnxruntime-ep-webgpu", "0.4.0") if installed() else ("onnxruntime-webgpu", "1.27.0")  # this env's
    assert env["versions"][runtime[0]] == runtime[1] and env["bandwidth_gbps"]["best"] > 0
    assert env["backend_package"] == runtime[0]
    assert env["commit"] and env["cpu"]
    assert {(r["device"], r["cache_kind"] or r["runner"]) for r in rows} >= {
        ("cpu", "dynamic"),
        ("cpu", "static"),
        ("cpu", "genai"),
        ("webgpu", "dynamic"),
        ("webgpu", "static"),
    }
    # every variant produced the same tokens; the matmuls-only floor makes none
    assert all(r["valid"] and r["tokens_equal"] is (None if r["variant"] == "matmuls only" else True) for r in rows)
    floor = [r for r in rows if r["variant"] == "matmuls only"]
    assert {r["device"] for r in floor} == {"cpu"} and all(r["kv_read_bytes"] == 0 for r in floor)
    t = RECIPES["toy"]  # the floor reads the projections and the lm_head, nothing else
    per_layer = (
        t.hidden * (t.heads + 2 * t.kv_heads) * t.head_dim
        + t.heads * t.head_dim * t.hidden
        + 3 * t.hidden * t.intermediate
    )
    assert all(r["weight_bytes"] == 4 * (t.layers * per_layer + t.hidden * t.vocab) for r in floor)
    assert "matmuls alone" in proc.stdout
    for r in rows:
        assert r["decode_ms_min"] <= r["decode_ms"] <= r["decode_ms_max"] and r["reps"] == 2
        if r["cache_kind"] == "static":
            assert r["tensors_per_step"] == 0 and r["new_buffers_per_step"] == 0
        if r["variant"] == "dynamic":
            assert r["tensors_per_step"] == 4 and r["ratio_to_dynamic"] == 1.0
    assert (tmp_path / "results.csv").read_text().startswith("model,device,adapter")
    for name in ("toy-cpu", "toy-webgpu"):
        png = tmp_path / f"{name}.png"  # kaleido may fail under load: the bench's output says why
        assert (tmp_path / f"{name}.html").is_file() and png.is_file() and png.stat().st_size > 10_000, proc.stdout
    assert "toy/webgpu/bucket ctx 256: dynamic" in proc.stdout and "wrote " in proc.stdout
    # the chart: lines over the measured contexts (ticks there); with one context, a bar per variant
    fig = figure(result, "toy", "cpu")
    assert {t.type for t in fig.data} == {"scatter"} and list(fig.layout.xaxis.tickvals) == [64, 256]
    one = {**result, "rows": [r for r in rows if r["context"] == 256]}
    bars = figure(one, "toy", "cpu").data
    assert {t.type for t in bars} == {"bar"}
    assert len(bars) == len({r["variant"] for r in one["rows"] if r["device"] == "cpu"})


def test_memory_bandwidth_is_measured():
    bw = memory_bandwidth(size_mib=32, repeats=2)
    assert set(bw) == {"copy_1t", "copy_2t", "read_1t", "read_2t", "best"} and bw["best"] == max(bw.values()) > 0.1


def test_weight_bytes_count_gathered_tables_by_row(smollm2):
    # SmolLM2: 134.5M parameters in fp32. The builder ties the embedding to the lm_head (the table is a
    # Transpose of lm_head.MatMul.weight, folded at load): the lm_head reads the whole matrix once per token,
    # the embedding lookup one row, so every parameter is read once. The rotary cos/sin tables the builder adds
    # (2 MiB) are read one row per token too.
    b = weight_bytes_per_token(smollm2)
    assert np.isclose(b, 134_515_008 * 4, rtol=1e-5)


def test_op_profile_breaks_a_decode_step_down_by_operator(tmp_path, toy):
    """ONNX Runtime's own profiler, read back: every op type of the toy graph, the time between nodes, and the
    run, whose parts add up to it. The profiled device is closed afterwards; a plain one opens again."""
    from kvlab import bench, ort

    rows = bench.op_profile(toy, "cpu", context=32, new_tokens=5)
    ops = {r["op"]: r for r in rows}
    assert {"MatMul", "GroupQueryAttention", "(between nodes)", "(run)"} <= set(ops)
    import onnx

    graph = onnx.load(str(toy.onnx_path), load_external_data=False).graph
    for op in ("MatMul", "GroupQueryAttention"):  # kept as they are by ORT's graph optimizations on the CPU EP
        assert ops[op]["nodes_per_step"] == sum(n.op_type == op for n in graph.node)
    parts = sum(r["ms_per_step"] for r in rows if r["op"] != "(run)")
    assert abs(parts - ops["(run)"]["ms_per_step"]) < 1e-6 and ops["(run)"]["share"] == 1.0
    assert ort.opened("cpu") is None and "profile" not in ort.open_device("cpu").ep_options
    proc = subprocess.run(
        [KVLAB, "profile", "ops", "--model", "toy", "--context", "16", "--new-tokens", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "new_tokens=2 must be an int >= 3" in proc.stderr
    out = tmp_path / "ops.csv"
    proc = subprocess.run(
        [KVLAB, "profile", "ops", "--model", "toy", "--context", "16", "--new-tokens", "4", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GroupQueryAttention" in proc.stdout and out.read_text().startswith("op,ms_per_step,nodes_per_step,share")


def test_small_pages_twin_is_paired_with_the_fitted_static_cache(toy):
    """The CPU rows carry the fitted static cache a second time, decoded on a private device whose weights stay in
    4 KiB pages; the report pairs the two round by round. Closing that private device leaves the open one open."""
    from kvlab.bench import Plan, report, run_plan
    from kvlab.ort import opened

    plan = Plan(
        targets=[("toy", "cpu")],
        contexts={"cpu": [32]},
        new_tokens={"cpu": 4},
        static_lens=[],
        reps=2,
        genai={"cpu": False},
        matmuls_only=False,
    )
    result = run_plan(plan, log=lambda line: None)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"dynamic", "static@35", "static@35 4KiB-pages"}
    assert all(r["tokens_equal"] and len(r["decode_ms_runs"]) == 2 for r in rows.values())
    assert rows["static@35 4KiB-pages"]["tensors_per_step"] == 0
    assert "huge pages x" in report(result) and "(static@35, paired, faster in " in report(result)
    assert opened("cpu") is not None and not opened("cpu").closed


def test_matmuls_only_floor_runs_the_models_own_weights_and_is_dropped_after(toy, tmp_path):
    """The floor graph holds every fp32 MatMul of the model with the same weight tensors (so the same bytes), and
    run_plan drops its session from the open device when the run ends."""
    import onnx

    from kvlab.bench import Plan, matmuls_only_model, run_matmuls_only, run_plan
    from kvlab.ort import open_device

    path, nbytes = matmuls_only_model(toy, tmp_path)
    src = onnx.load(str(toy.onnx_path))
    weights = {n.input[1] for n in src.graph.node if n.op_type == "MatMul"}
    floor = onnx.load(str(path))
    assert {t.name for t in floor.graph.initializer} == weights and len(floor.graph.node) == len(weights)
    got = {t.name: onnx.numpy_helper.to_array(t) for t in floor.graph.initializer}
    assert all((got[t.name] == onnx.numpy_helper.to_array(t)).all() for t in src.graph.initializer if t.name in weights)
    assert nbytes == sum(a.nbytes for a in got.values())
    assert run_matmuls_only(path, "cpu", 4) > 0
    open_device("cpu").forget(path)
    before = set(open_device("cpu").sessions) | {str(toy.onnx_path)}  # the toy's own session may open and stay
    run_plan(
        Plan(
            targets=[("toy", "cpu")],
            contexts={"cpu": [16]},
            new_tokens={"cpu": 3},
            static_lens=[],
            reps=1,
            genai={"cpu": False},
            small_pages_twin=False,
        ),
        log=lambda line: None,
    )
    assert set(open_device("cpu").sessions) <= before  # the floor's session is dropped after the plan


def test_step_phases_account_for_a_whole_decode_step(tmp_path, toy):
    """``kvlab profile phases`` on the real toy session and onnxruntime-genai: the phases timed inside a step
    and the rest add up to the step's wall time, the step and the loop add up to the token-to-token time, genai's
    tokens equal kvlab's, and the ratios are paired by round. The runtime's copies of host inputs are counted as
    the runtime's (the record's run_ms), not as Python's own time."""
    from kvlab import bench

    r = bench.step_phases(toy, "cpu", context=24, new_tokens=6, rounds=2, token_on_device=False)
    rows = {row["phase"]: row["ms_per_step"] for row in r["rows"]}
    assert list(rows) == list(bench.profile.PHASES)
    assert r["tokens_equal_genai"] and r["kvlab_tokens_repeat"]
    assert rows["ort run"] > 0 and rows["read back"] > 0 and rows["runtime binds inputs"] > 0
    assert len(r["step_ratios"]) == 2 and r["step_ratio"] == float(np.median(r["step_ratios"]))
    assert 0 < r["python_ms"] < r["kvlab_step_ms"] and r["python_share"] < 1
    # per step, whatever else runs on the machine: every phase timed inside the step lies within it (none is
    # negative, and what they leave of the step's wall time is not), and the step and the loop make the token to
    # token time (medians of sums are not sums of medians, so the per-step values are what is checked)
    assert len(r["per_step_ms"]) >= 2 * 3
    for step in r["per_step_ms"]:
        assert all(step[p] > -1e-6 for p in bench.profile.PHASES), step
        assert step["wall"] + step["between steps"] == pytest.approx(step["token to token"]), step
        assert step["python"] <= step["wall"], step
    out = tmp_path / "phases.json"
    proc = subprocess.run(
        [
            KVLAB,
            "profile",
            "phases",
            "--model",
            "toy",
            "--context",
            "16",
            "--new-tokens",
            "4",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runtime binds inputs" in proc.stdout and "Python's own time" in proc.stdout
    saved = json.loads(out.read_text())
    assert saved["rounds"] == 1 and saved["weights"] == toy.info.weights
    # the label names the model as built and its weights, not only the KV cache's precision
    assert f"({toy.name}: {toy.info.weights} weights, {saved['precision']} KV cache, on cpu;" in proc.stdout
    proc = subprocess.run(
        [KVLAB, "profile", "phases", "--model", "toy", "--rounds", "0"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "argument --rounds: 0 must be >= 1" in proc.stderr


def test_a_context_past_a_models_length_is_refused_before_anything_runs(toy):
    """A plan whose last context does not fit the model is refused before the first row is measured (it used to
    run the contexts before it and then fail, discarding them), naming the context and the longest that fits."""
    from kvlab import ConfigError
    from kvlab.bench import Plan, run_plan

    plan = Plan(
        targets=[("toy", "cpu")],
        contexts={"cpu": [16, toy.info.context_length]},
        new_tokens={"cpu": 4},
        reps=1,
        small_pages_twin=False,
    )
    logged: list[str] = []
    with pytest.raises(
        ConfigError,
        match=r"context 4096 \+ 4 new tokens exceed toy's context length 4096; use "
        r"contexts up to 4092",
    ):
        run_plan(plan, log=logged.append)
    assert logged == []  # not even the bandwidth measurement ran


@pytest.mark.parametrize("ctrl_c", ["default", "ignored", "pressed"])
def test_a_stopped_bench_keeps_the_contexts_it_finished(tmp_path, ctrl_c):
    """`timeout` stops a long `kvlab bench` with SIGTERM (record_gpu.sh runs every step under one): the contexts
    that finished are written, every variant of each and nothing of the one in progress (results.json says
    "complete": false), stderr is one line, no traceback, and the exit code Ctrl-C's. Also where Ctrl-C is ignored,
    as in a job a script started in the background (SIGINT inherited as ignored), and for Ctrl-C itself (``pressed``:
    a SIGINT instead). A real run of toy on the CPU EP, a real signal, sent as soon as the second context's line is
    printed."""
    import os
    import signal

    disposition = signal.SIG_IGN if ctrl_c == "ignored" else signal.SIG_DFL
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            KVLAB,
            "bench",
            "--models",
            "toy",
            "--devices",
            "cpu",
            "--contexts",
            "16,32,3000,4000",
            "--new-tokens",
            "64",
            "--reps",
            "1",
            "--set",
            "static_lens=1",
            "--set",
            "charts=off",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "ctx 32:" in line:
            proc.send_signal(signal.SIGINT if ctrl_c == "pressed" else signal.SIGTERM)
            break
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, (seen, rest, err)
    assert [e for e in err.splitlines() if e.startswith("kvlab")] == [
        "kvlab: interrupted (every cache and device tensor was released)"
    ], err
    assert "stopped early: wrote the contexts that finished" in rest, rest
    result = json.loads((out / "results.json").read_text())
    assert result["complete"] is False
    per_context: dict[int, int] = {}
    for row in result["rows"]:
        per_context[row["context"]] = per_context.get(row["context"], 0) + 1
    assert {16, 32} <= set(per_context) and 4000 not in per_context, per_context
    assert len(set(per_context.values())) == 1, per_context  # no context half in


def test_a_finished_bench_says_it_is_complete(tmp_path):
    from kvlab.bench import Plan, run_plan

    result = run_plan(
        Plan(
            targets=[("toy", "cpu")],
            contexts={"cpu": [16]},
            new_tokens={"cpu": 4},
            reps=1,
            small_pages_twin=False,
            matmuls_only=False,
            genai={"cpu": False},
        ),
        log=lambda _: None,
    )
    assert result["complete"] is True and {r["context"] for r in result["rows"]} == {16}


def test_a_target_tagged_with_a_precision_runs_in_that_precision_only(tmp_path):
    """``--models smollm2:int4`` (a Plan target ``("smollm2:int4", device)``) runs int4 alone; an untagged target
    runs in each of the plan's precisions; a directory keeps its name whole, a colon in it included."""
    from kvlab import ConfigError
    from kvlab.bench import Plan

    odd = str(tmp_path / "a:b")
    plan = Plan(targets=[("smollm2:int4", "cpu"), ("toy", "webgpu"), (odd, "cpu")], precisions=["fp32", "fp16"])
    assert plan.runs() == [
        ("smollm2", "int4", "cpu"),
        ("toy", "fp32", "webgpu"),
        ("toy", "fp16", "webgpu"),
        (odd, "fp32", "cpu"),
        (odd, "fp16", "cpu"),
    ]
    with pytest.raises(ConfigError, match="precision 'int3' is not valid"):
        Plan(targets=[("toy:int3", "cpu")]).runs()
