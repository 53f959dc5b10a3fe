"""kvlab.web: the caches on onnxruntime-web's WebGPU in a browser.

The browser tests run the real thing: Debian's Chromium 156 headless on SwiftShader, onnxruntime-web 1.30.0 and
transformers.js 4.3.2 from kvlab/web/node_modules, the toy model built by kvlab; they use the ``chromium``
fixture, so the tiers mark them browser + slow. The rest check the Python side without a browser: jobs, the
server's routes, the page result's validation and its conversion to records, the CLI's flags.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import kvlab
from kvlab.core.errors import CapacityError, ConfigError, DeviceError, ModelError
from kvlab.web import assets
from kvlab.web.chromium import adapter_flags, find_chromium
from kvlab.web.job import TRANSFORMERS_GRAPH, check_model, concrete_past_shapes, make_job, parse_cache
from kvlab.web.node import find_node
from kvlab.web.results import WEB_COLUMNS, BrowserStepRecord, adapter_label, read_result
from kvlab.web.server import PageServer

REPO = Path(__file__).resolve().parents[1]
PROMPT = [5, 6, 7]  # 3 tokens: the toy's prefill uses no 4096-byte buffer, so the KV crossing 2048 B shows
NEW = 16  # the dynamic cache's KV tensors (128 B per token) cross the 2048 -> 4096 byte bucket at 17 tokens


# ---- jobs -------------------------------------------------------------------------------------------------------


def test_job_sizes_and_lists_the_model_files(toy):
    job = make_job(toy, PROMPT, max_new_tokens=NEW)
    assert [c.name for c in job.caches] == ["dynamic", "static@256"]  # positions needed 18, rounded up to 256
    spec = job.to_json()
    assert [f["name"] for f in spec["model"]["files"]] == ["model.onnx", "model.onnx.data"]
    assert spec["model"]["entries"][0] == {
        "past": "past_key_values.0.key",
        "present": "present.0.key",
        "kv_heads": 2,
        "head_dim": 16,
    }
    assert spec["model"]["transformers_graph"]["name"] == TRANSFORMERS_GRAPH
    # kvlab's own runs: the native path's greedy graph (the toy's 512-token vocabulary: one ArgMax), read every 8
    greedy = spec["model"]["greedy"]
    assert greedy["name"] == "model.kvlab-next-single.onnx" and greedy["next"] == "kvlab_next_token"
    assert greedy["ids_dtype"] == "int64" and spec["tokens_per_read"] == 8 and spec["stop_tokens"] == []
    assert set(job.served) == {"model.onnx", "model.onnx.data", greedy["name"], TRANSFORMERS_GRAPH}


def test_job_token_on_the_host_or_the_device(toy):
    host = make_job(toy, PROMPT, max_new_tokens=NEW, token_on_device=False)
    assert host.reduction == "" and host.tokens_per_read == 1 and host.to_json()["model"]["greedy"] is None
    rows = make_job(toy, PROMPT, token_on_device="rows", tokens_per_read=3, stop_tokens=np.array([2]))
    assert rows.to_json()["model"]["greedy"]["ids_dtype"] == "int32" and rows.tokens_per_read == 3
    assert rows.stop_tokens == [2]


@pytest.mark.parametrize(
    ("caches", "error", "says"),
    [
        (["static@2"], CapacityError, "18 positions are needed but max_cache_len is 2"),
        (["static@x"], ConfigError, "the size after 'static@' must be a positive int"),
        (["paged"], ConfigError, "cache 'paged' is not valid"),
        (["captured@x"], ConfigError, "the size after 'captured@' must be a positive int"),
        (["static@9000"], ConfigError, "larger than the model's context length (4096)"),
        (["dynamic", "dynamic"], ConfigError, "name one cache twice"),
        ([], ConfigError, "caches is empty"),
    ],
)
def test_job_refuses_bad_caches(toy, caches, error, says):
    with pytest.raises(error, match=f"^{says}" if says[0].isdigit() else None) as info:
        make_job(toy, PROMPT, max_new_tokens=NEW, caches=caches)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"reps": 0}, "reps=0 must be a positive int"),
        ({"warmup": "yes"}, "warmup='yes' must be True or False"),
        ({"dynamic_impl": "tfjs"}, "dynamic_impl='tfjs' is not valid"),
        ({"buffer_cache_mode": "huge"}, "buffer cache mode 'huge' is not valid"),
        ({"validation_mode": "off"}, "validation mode 'off' is not valid; choose one of ('disabled', 'wgpuOnly'"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be a positive int"),
        ({"max_new_tokens": 5000}, "5002 positions are needed but model toy holds at most 4096"),
        ({"token_on_device": "argmax"}, "token_on_device='argmax' must be True or False, 'auto', or a reduction"),
        ({"tokens_per_read": 0}, "tokens_per_read=0 must be a positive int"),
        ({"token_on_device": False, "tokens_per_read": 4}, "tokens_per_read=4 reads back tokens kept on the GPU"),
        ({"stop_tokens": [600]}, "token id 600 is outside the vocabulary"),
    ],
)
def test_job_refuses_bad_options(toy, kwargs, says):
    with pytest.raises(ConfigError if "positions" not in says else CapacityError) as info:
        make_job(toy, PROMPT, **{"max_new_tokens": NEW, **kwargs})
    assert says in str(info.value)


def test_job_refuses_bad_prompts(toy):
    with pytest.raises(ConfigError, match="token id 999 is outside the vocabulary"):
        make_job(toy, [1, 999])
    with pytest.raises(ConfigError, match="prompt is empty"):
        make_job(toy, [])


def test_parse_cache_sizes_static_to_fit():
    assert parse_cache("static", 300, 4096).max_cache_len == 512
    assert parse_cache("static", 4000, 4096).max_cache_len == 4096
    assert parse_cache("static@300", 300, 4096).name == "static@300"


def test_a_model_with_states_is_refused():
    class Entry:
        grows, role, past, op = False, "conv", "past.0.conv", "CausalConvWithState"

    class Info:
        name, entries, dtype_name = "conv-like", [Entry()], "float32"

    class Stub:
        info = Info()

    with pytest.raises(ModelError, match=r"'past.0.conv' is a fixed-size conv state \(read by CausalConvWithState\)"):
        check_model(Stub())


def test_concrete_past_shapes_change_only_the_shape_metadata(toy):
    import onnx

    data, replaced = concrete_past_shapes(toy)
    assert replaced == {"kv_cache_dim": 16}
    made, original = onnx.load_from_string(data), onnx.load(str(toy.onnx_path), load_external_data=False)
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in made.graph.input]
    assert dims[2] == ["batch_size", 2, "past_sequence_length", 16]
    assert made.graph.node == original.graph.node and made.graph.initializer == original.graph.initializer


# ---- the server --------------------------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_server_serves_only_the_job_and_its_files(toy):
    job = make_job(toy, PROMPT, max_new_tokens=2)
    with PageServer(job) as server:
        assert server.url.startswith("http://127.0.0.1:")
        status, body = _get(server.url + "job")
        assert status == 200 and json.loads(body)["job"]["prompt_ids"] == PROMPT
        assert _get(server.url + "model/model.onnx") == (200, toy.onnx_path.read_bytes())
        assert _get(server.url + f"model/{TRANSFORMERS_GRAPH}")[1] == job.transformers_graph
        assert _get(server.url + "kvlab/runner.mjs")[0] == 200
        refused = ("model/genai_config.json", "model/..%2Fgenai_config.json", "kvlab/../job.py", "npm/webgpu/index.js")
        for path in refused:
            assert _get(server.url + path)[0] == 404, path
        request = urllib.request.Request(server.url + "result", data=b'{"error": "x"}', method="POST")
        urllib.request.urlopen(request, timeout=5)
        assert server.wait_result(1) == {"error": "x"}
    server.close()  # a second close does nothing


def test_server_wait_says_what_happened(toy):
    with PageServer(make_job(toy, PROMPT, max_new_tokens=2)) as server:
        with pytest.raises(DeviceError, match=r"no result within 0.2 s \(no step had finished\)"):
            server.wait_result(0.2)
        server.receive("/progress", {"phase": "decode", "step": 3})
        with pytest.raises(DeviceError, match=r"browser exited .* \(its last finished step: decode step 3\)"):
            server.wait_result(5, alive=lambda: False)


def test_ctrl_c_while_waiting_closes_the_browser_and_the_server_once(toy, tmp_path, monkeypatch):
    """A KeyboardInterrupt while the page runs: the browser's process group ends, its profile goes, the server
    stops; each exactly once (a stand-in browser that only sleeps, so no real one is needed)."""
    from kvlab.web import run

    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KVLAB_CHROMIUM", str(fake))
    made = []

    class Recorded(run.Chromium):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def interrupted(server, timeout, alive=None):
        made.append(server)
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "Chromium", Recorded)
    monkeypatch.setattr(PageServer, "wait_result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.run_job(make_job(toy, PROMPT, max_new_tokens=2), adapter="swiftshader")
    browser, server = made
    assert browser.process.poll() is not None and not Path(browser.profile).exists()
    with pytest.raises(OSError):  # nothing listens any more
        urllib.request.urlopen(server.url + "job", timeout=2)


# ---- the page's result ---------------------------------------------------------------------------------------------


def _step(i: int, token: int) -> dict:
    gpu = dict.fromkeys(("created", "destroyed", "bytes_created", "bytes_destroyed", "live"), 1)
    gpu.update(storage_created=1 if i == 0 else 0, uniform_created=0, staging_created=1)
    return {
        "step": i,
        "phase": "prefill" if i == 0 else "decode",
        "position": 0 if i == 0 else 2 + i,
        "n_tokens": 3 if i == 0 else 1,
        "token": token,
        "wall_ms": 2.0,
        "run_ms": 1.5,
        "cache_tensors_allocated": 4 if i == 0 else 0,
        "cache_bytes_allocated": 1024 if i == 0 else 0,
        "new_buffers": 4 if i == 0 else 0,
        "live_cache_bytes": 1024,
        "gpu": gpu,
    }


def _page_result(job, tokens=(10, 11)) -> dict:
    runs = [
        {"cache": c.name, "impl": "onnxruntime-web", "rep": 0, "warmup": False, "tokens": list(tokens)}
        | {"steps": [_step(i, t) for i, t in enumerate(tokens)], "release": {"buffers_destroyed": 4}}
        for c in job.caches
    ]
    return {
        "version": 1,
        "host": {"kind": "browser", "name": "Chromium 156.0.8078.114", "user_agent": "Headless", "headless": True},
        "adapter": {"vendor": "google", "architecture": "swiftshader", "is_fallback": True, "features": []},
        "ort_version": "1.30.0",
        "transformers": None,
        "session_ms": 12.0,
        "runs": runs,
        "counters": {"created": 9, "destroyed": 9},
    }


def test_read_result_makes_labelled_records(toy):
    job = make_job(toy, PROMPT, max_new_tokens=2, caches=["dynamic", "static@8"])
    result = read_result(_page_result(job), job)
    assert [g.job_cache for g in result.measured] == ["dynamic", "static@8"]
    g = result.by_cache("static@8")[0]
    assert str(g.label.device.adapter) == "google swiftshader in Chromium 156.0.8078.114 (headless) (software)"
    assert g.label.device.runtime == "onnxruntime-web 1.30.0" and g.label.device.buffer_cache_mode == "bucket"
    rec = g.records[1]
    assert isinstance(rec, BrowserStepRecord) and rec.overhead_ms == 0.5 and rec.rss_bytes == 0
    assert rec.used_cache_bytes == 4 * toy.info.bytes_per_token and rec.staging_buffers_created == 1
    frame = g.frame()
    assert list(frame.columns) == [*kvlab.COLUMNS, *WEB_COLUMNS]
    assert frame.attrs["host"].kind == "browser" and frame.attrs["label"] is g.label


def test_read_result_takes_a_run_ended_by_a_stop_token(toy):
    job = make_job(toy, PROMPT, max_new_tokens=4, caches=["static@8"], stop_tokens=[11])
    raw = _page_result(job, tokens=(10, 11))
    raw["runs"][0]["steps"][1]["read_with"] = 3
    g = read_result(raw, job).measured[0]
    assert g.stop_reason == "eos" and g.records[1].read_with == 3 and g.label.token_on_device
    assert (g.label.greedy_reduction, g.label.tokens_per_read) == ("single", 8)
    raw["runs"][0]["tokens"] = raw["runs"][0]["tokens"][:1]
    raw["runs"][0]["steps"] = raw["runs"][0]["steps"][:1]
    with pytest.raises(DeviceError, match=r"has 1 tokens and 1 steps; the job asked for 4 of each, or fewer ending"):
        read_result(raw, job)


def test_adapter_kind_follows_what_the_adapter_says():
    host = read_result.__globals__["BrowserHost"]("browser", "Chrome 140")
    gpu = adapter_label({"vendor": "nvidia", "architecture": "hopper", "features": ["shader-f16"]}, host)
    assert (gpu.name, gpu.kind, gpu.shader_f16) == ("nvidia hopper in Chrome 140", "hardware", True)
    assert adapter_label({"vendor": "google", "architecture": "swiftshader"}, host).kind == "software"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.update(error="no WebGPU\n at x"), "the browser runner failed: no WebGPU$"),
        (lambda r: r.pop("adapter"), "has no 'adapter'"),
        (lambda r: r.update(version=2), "has version 2; this kvlab reads version 1"),
        (lambda r: r["runs"][0].update(cache="static@9"), r"runs\[0\].'cache' is 'static@9'"),
        (lambda r: r["runs"][0].update(impl="webllm"), r"'impl' is 'webllm'; expected one of"),
        (lambda r: r["runs"][0]["tokens"].pop(), "has 1 tokens and 2 steps; the job asked for 2 of each"),
        (lambda r: r["runs"][0]["steps"][1].update(wall_ms=math.nan), r"steps\[1\].'wall_ms' is nan"),
        (lambda r: r["runs"][0]["steps"][1].update(token=3), "its steps' tokens differ from its token list"),
        (lambda r: r["runs"][0]["steps"][1]["gpu"].pop("live"), r"has no runs\[0\].steps\[1\].gpu.'live'"),
        (lambda r: r["runs"][0]["steps"][0].update(step=True), r"'step' is True"),
    ],
)
def test_read_result_refuses_a_malformed_result(toy, change, says):
    job = make_job(toy, PROMPT, max_new_tokens=2, caches=["dynamic", "static@8"])
    raw = _page_result(job)
    change(raw)
    with pytest.raises(DeviceError, match=says):
        read_result(raw, job)


# ---- assets, browser, CLI flags ------------------------------------------------------------------------------------


def test_assets_name_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_WEB_ASSETS", str(tmp_path))
    with pytest.raises(DeviceError, match="ort.webgpu.bundle.min.mjs is missing: install the npm packages with bash"):
        assets.npm_file("ort")
    assert assets.versions()["onnxruntime-web"] == "missing"
    with pytest.raises(ConfigError, match="npm asset 'ort.js' is not valid"):
        assets.npm_file("ort.js")
    with pytest.raises(ConfigError, match="kvlab web file '../job.py' is not valid"):
        assets.kvlab_file("../job.py")


def test_installed_npm_versions_are_the_pinned_ones():
    assert assets.versions() == json.loads((assets.WEB_DIR / "package.json").read_text())["dependencies"]


def test_chromium_choice_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CHROMIUM", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="KVLAB_CHROMIUM=.* is not an executable file"):
        find_chromium()
    assert adapter_flags("swiftshader") == ["--use-webgpu-adapter=swiftshader"] and adapter_flags("default") == []
    with pytest.raises(ConfigError, match="adapter='gpu' is not valid"):
        adapter_flags("gpu")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--contexts", "1k"], "argument --contexts: '1k': '1k' is not an int"),
        (["--contexts", "0"], "0 must be >= 1"),
        (["--cache", "static@0"], "cache 'static@0' is not valid"),
        (["--host", "safari"], "invalid choice: 'safari'"),
        (["--set", "timeout=-1"], "--set 'timeout=-1': -1.0 must be > 0"),
    ],
)
def test_cli_bad_flags_are_one_line_exit_2(flags, says):
    p = subprocess.run(
        [sys.executable, "-m", "kvlab", "browser-bench", *flags], capture_output=True, text=True, cwd=REPO
    )
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---- the real thing: Chromium on SwiftShader -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    assets.npm_file("ort")
    return path


@pytest.fixture(scope="module")
def cpu_tokens(toy) -> list[int]:
    return kvlab.generate(toy, PROMPT, device="cpu", max_new_tokens=NEW, stop_on_eos=False).token_ids


def test_browser_caches_on_swiftshader(chromium, toy, cpu_tokens):
    """One page, no warm-up: transformers.js's dynamic cache first (the pool learns the decode activations in
    its first decode step), then kvlab's static cache."""
    from kvlab.web import browser_generate

    result = browser_generate(toy, PROMPT, max_new_tokens=NEW, warmup=False, adapter="swiftshader")
    assert result.host.kind == "browser" and result.host.name.startswith("Chromium 156")
    assert result.adapter.kind == "software" and "swiftshader" in result.adapter.name
    assert result.ort_version == "1.30.0" and result.transformers == {"version": "4.3.2", "error": None}
    (dynamic,), (static,) = result.by_cache("dynamic"), result.by_cache("static@256")
    assert dynamic.impl == "transformers.js" and dynamic.label.device.runtime.startswith("transformers.js 4.3.2")
    assert dynamic.token_ids == cpu_tokens and static.token_ids == cpu_tokens
    entries = len(toy.info.entries)
    # static: its 4 KV buffers made once, in the first step; after it no storage buffer is created at all
    assert static.records[0].cache_tensors_allocated == entries and static.records[0].storage_buffers_created >= 4
    assert all(r.storage_buffers_created == 0 and r.cache_tensors_allocated == 0 for r in static.records[1:])
    assert static.release == {"buffers_destroyed": entries, "bytes_destroyed": entries * 256 * 128}
    # dynamic: fresh presents every step; once warm, new GPU buffers where the KV tensors cross a bucket
    assert all(r.cache_tensors_allocated == entries for r in dynamic.records)
    crossing = [r for r in dynamic.records[2:] if r.storage_buffers_created]
    assert crossing and all(r.position + r.n_tokens > 16 for r in crossing), [
        (r.step, r.storage_buffers_created) for r in dynamic.records
    ]
    assert result.counters["created"] == result.counters["destroyed"]  # everything counted was released


def test_token_on_the_gpu_in_bursts_on_the_host_and_in_a_captured_replay(chromium, toy, cpu_tokens):
    """kvlab's greedy graph in the page: the token stays on the GPU, read back every 8 steps (one mapAsync a burst),
    a burst's steps run past the stop token undone; the same tokens as the page's own argmax of the logits and
    the kernel's CPU EP run. The captured cache (the capture build of the model) replays onnxruntime-web's
    captured step with the same tokens, no buffer created after its first replay; everything it made released.
    The page runs in validation mode "disabled" (Chromium's Dawn toggles named in the host) unless the job says
    otherwise (the host-token job: "basic", Dawn as Chromium starts it)."""
    from kvlab.ort import load
    from kvlab.web import run_job

    graph = load("toy", graph_capture=True)
    want = kvlab.generate(graph, PROMPT, device="cpu", max_new_tokens=NEW, stop_on_eos=False).token_ids
    stop = want[7]  # step 7: inside the first decode burst (steps 1-8), which runs one step past it
    caches = {"caches": ["dynamic", "static", "captured"], "dynamic_impl": "onnxruntime-web"}
    device = make_job(graph, PROMPT, max_new_tokens=NEW, warmup=False, stop_tokens=[stop], **caches)
    on_host_options = {"caches": ["static"], "token_on_device": False, "validation_mode": "basic"}
    host = make_job(toy, PROMPT, max_new_tokens=NEW, warmup=False, **on_host_options)
    on_gpu, on_host = (run_job(job, adapter="swiftshader") for job in (device, host))
    (by_host,) = on_host.measured
    assert by_host.token_ids == cpu_tokens and [r.read_with for r in by_host.records] == [0] * NEW
    assert not by_host.label.token_on_device
    assert str(by_host.label.device).endswith(", validation basic") and "Dawn" not in str(on_host.host)
    assert on_gpu.raw["validation_mode"] == "disabled" and on_host.raw["validation_mode"] == "basic"
    assert str(on_gpu.host).endswith(", Dawn skip_validation+disable_robustness"), on_gpu.host
    assert on_gpu.raw["dawn_validates"] is False and on_host.raw["dawn_validates"] is True  # Chromium took the flag
    assert [g.job_cache for g in on_gpu.measured] == ["dynamic", "static@256", "static@256 graph"]
    for g in on_gpu.measured:
        assert g.label.token_on_device and g.label.tokens_per_read == 8, g.label
        assert g.token_ids == want[:8] and g.stop_reason == "eos", (g.job_cache, g.token_ids)
        assert [r.read_with for r in g.records] == [0] + [8] * 7  # the burst's 8th step: past the stop, undone
        assert len({round(r.wall_ms, 9) for r in g.records[1:]}) == 1  # the burst's time shared out
    static = on_gpu.by_cache("static@256")[0]
    # the ring (9 token buffers and a staging buffer) made with the prefill; after it no storage buffer at all
    assert static.records[0].storage_buffers_created >= len(toy.info.entries) + 9
    assert all(r.storage_buffers_created == 0 for r in static.records[1:])
    assert not on_gpu.refused, on_gpu.refused
    captured = on_gpu.by_cache("static@256 graph")[0]
    # step 1 records the graph, step 2 checks the first replay against the same step run uncaptured; then nothing
    assert captured.records[1].gpu_buffers_created > 0
    assert [r.gpu_buffers_created for r in captured.records[3:]] == [0] * (len(captured.records) - 3)
    assert on_gpu.counters["created"] == on_gpu.counters["destroyed"]  # the ring and the capture released as well


def test_job_names_why_a_model_cannot_be_captured(toy):
    with pytest.raises(ModelError, match=r"toy cannot run a captured cache in the page: .*\(Shape node '/model/attn"):
        make_job(toy, PROMPT, caches=["captured"])
    graph = kvlab.load("toy", graph_capture=True)
    with pytest.raises(ConfigError, match="a captured cache keeps every input and output on the GPU"):
        make_job(graph, PROMPT, caches=["captured"], token_on_device=False)
    job = make_job(graph, PROMPT, caches=["static", "captured@64"])
    assert [c.name for c in job.caches] == ["static@256", "static@64 graph"]
    assert "seqlens_k ('/model/attn_mask_reformat" in job.to_json()["model"]["step_length_inputs"]


def test_cli_browser_bench_writes_results(chromium, tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run(
        [sys.executable, "-m", "kvlab", "browser-bench", "--contexts", "3", "--new-tokens", "3", "--reps", "1"]
        + ["--adapter", "swiftshader", "--set", "charts=off", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads((out / "results.json").read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"dynamic transformers.js", "static@256"} and all(r["tokens_equal"] for r in rows.values())
    dynamic, static = rows["dynamic transformers.js"], rows["static@256"]
    assert dynamic["runner"] == "transformers.js" and static["runner"] == "kvlab" and static["fitted"]
    assert static["storage_buffers_per_step"] == 0 and dynamic["tensors_per_step"] == 4
    assert result["environment"]["backend_version"] == "1.30.0" and "Chromium" in result["environment"]["host"]
    assert static["validation_mode"] == "disabled" and static["dawn_toggles"] == "skip_validation,disable_robustness"
    assert static["dawn_validates"] is False
    assert len(result["runs"]) == 4  # a warm-up and a measured round of each cache


def test_widget_front_end_is_one_module_node_can_parse(tmp_path):
    from kvlab.web.widget import BUNDLE, bundle

    esm = bundle(BUNDLE)
    assert "from './" not in esm and esm.count("\nexport ") == 1 and "export default { render }" in esm
    (tmp_path / "widget.mjs").write_text(esm)
    node = subprocess.run([find_node(), "--check", str(tmp_path / "widget.mjs")], capture_output=True, text=True)
    assert node.returncode == 0, node.stderr


def test_widget_kernel_side_without_a_browser(toy):
    """What the kernel does with the page's messages: sends every blob then the job on 'start', reads the result,
    compares with its own CPU EP run and says so in the summary (the page side: tests/test_web_notebook.py)."""
    from kvlab.web.widget import BrowserLab

    lab = BrowserLab(toy, PROMPT, new_tokens=2, caches=["dynamic", "static@8"])
    sent = []
    lab.send = lambda content, buffers=None: sent.append((content, buffers))
    gpu = {"vendor": "nvidia", "architecture": "hopper", "features": [], "max_buffer_size": 2**34}
    lab._on_msg(lab, {"type": "start", "have": [], "browser": {"name": "Chrome", "webgpu": True, "adapter": gpu}}, [])
    kinds = [c["type"] for c, _ in sent]
    assert kinds[-1] == "job" and kinds.count("blob") >= 5 and lab.running
    blobs = {c["name"] for c, _ in sent if c["type"] == "blob"}
    assert {"model:toy:model.onnx", "model:toy:model.onnx.data", f"model:toy:{TRANSFORMERS_GRAPH}"} <= blobs
    cpu = kvlab.generate(toy, PROMPT, device="cpu", max_new_tokens=2, stop_on_eos=False).token_ids
    lab._on_msg(lab, {"type": "result", "result": _page_result(lab.job, tokens=cpu)}, [])
    assert not lab.running and lab.result is not None and lab.status.startswith("done: the kernel received 2 runs")
    assert "greedy tokens equal the kernel's CPU EP run: True" in lab.summary
    lab._on_msg(lab, {"type": "result", "result": {"error": "WebGPU is off"}}, [])
    assert lab.status == "error: the browser runner failed: WebGPU is off"


def test_the_button_fits_the_run_to_the_adapter(toy):
    from kvlab.web.widget import SMALL_RUN, adapter_plan, run_bytes

    job = make_job(toy, toy.tokens_of("a b c", 200), max_new_tokens=16)
    gpu = {"vendor": "nvidia", "architecture": "hopper", "features": [], "max_buffer_size": 2**34}
    software = {"vendor": "google", "architecture": "swiftshader", "is_fallback": True, "features": []}
    assert adapter_plan({"name": "Chrome", "webgpu": True, "adapter": gpu}, job)[0] == "asked"
    kind, line = adapter_plan({"name": "Chromium", "webgpu": True, "adapter": software}, job)
    assert kind == "small" and f"running toy with a {SMALL_RUN[1]}-token prompt" in line
    small = {**gpu, "max_buffer_size": run_bytes(job) - 1}
    kind, line = adapter_plan({"name": "Chrome", "webgpu": True, "adapter": small}, job)
    assert kind == "small" and line.startswith("this adapter's buffers hold at most 1 MiB")
    kind, line = adapter_plan({"name": "Firefox", "webgpu": False}, job)
    assert (
        kind == "recorded" and line == "no WebGPU here (this browser has no WebGPU): showing the recorded run instead"
    )
    assert adapter_plan({}, job)[0] == adapter_plan(None, job)[0] == "recorded"


def test_the_button_without_webgpu_shows_the_recording_and_a_cancel_says_what_was_released(toy):
    from kvlab.web.widget import BrowserLab

    lab = BrowserLab(toy, PROMPT, new_tokens=2)
    sent, drawn = [], []
    lab.send = lambda content, buffers=None: sent.append(content["type"])
    lab.on_recorded(lambda: drawn.append(lab.over_recorded()))
    lab._on_msg(lab, {"type": "start", "have": [], "browser": {"name": "Firefox 145.0", "webgpu": False}}, [])
    assert sent == ["recorded"] and not lab.running and lab.plan.startswith("no WebGPU here")
    assert drawn and all("(recorded)" in t.name for t in drawn[0].data)
    software = {"vendor": "google", "architecture": "swiftshader", "is_fallback": True, "features": []}
    lab.browser = {"name": "Chromium", "webgpu": True, "adapter": software}
    lab._on_msg(lab, {"type": "start", "have": []}, [])
    assert sent[-1] == "job" and lab.ran is lab.job and "as asked is small enough" in lab.plan
    counters = {"created": 7, "destroyed": 7, "live": 0}
    lab._on_msg(lab, {"type": "result", "result": {"cancelled": True, "counters": counters}}, [])
    assert lab.result is None and lab.cancelled == counters and not lab.running
    assert lab.status == "cancelled after 0 steps: the page released its buffers (7 created, 7 destroyed, 0 live)"


def test_numpy_counts_make_a_job_the_page_can_read(toy):
    """reps and max_new_tokens as numpy ints (a notebook's np.arange, say): the job still goes out as JSON."""
    job = make_job(toy, np.array(PROMPT), max_new_tokens=np.int64(2), reps=np.int32(2), caches=["static"])
    assert json.loads(json.dumps(job.to_json()))["reps"] == 2
