"""kvlab.lab.widgets and kvlab.lab.plots without a browser: widget values set from code fire the same callbacks a user's
clicks do (real generations on the CPU EP; WebGPU context switching in a subprocess)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
from conftest import run_python

import kvlab
from kvlab import CacheSpec, DeviceLabel, open_device
from kvlab.core.buckets import bucket_positions
from kvlab.core.generation import first_divergence
from kvlab.core.labels import Adapter, RunLabel
from kvlab.lab import plots, recorded
from kvlab.lab.runs import as_run
from kvlab.lab.widgets import CacheLab
from kvlab.ort.runtime.plugin import installed as on_the_plugin_ep


@pytest.fixture
def lab(toy) -> CacheLab:
    return CacheLab(
        toy, device="cpu", cache_type="static", max_cache_len=64, prompt_tokens=16, new_tokens=8, throttle_s=0.0
    )


def test_run_button_runs_and_fills_chart_and_table(lab):
    lab.run_button.click()
    assert lab.last_error is None, lab.last_error
    row = lab.results.iloc[-1]
    assert row["cache"] == "static" and row["max_cache_len"] == 64 and row["result"] == "ok: 8 tokens"
    lat, reserved, used = lab.figure.data
    assert len(lat.x) == 7 and list(lat.x) == list(range(17, 24))  # 7 decode steps, cache length after each
    assert reserved.y[-1] == pytest.approx(64 * lab.get_model().info.bytes_per_token / 1024)  # reserved up front
    assert used.y[-1] == pytest.approx(23 * lab.get_model().info.bytes_per_token / 1024)
    title = lab.figure.layout.title.text
    assert "toy (float32) on cpu: " in title and "(hardware)" in title and "max_cache_len=64" in title
    assert "run #1 done" in lab.status_text and lab.running is False and lab.run_button.disabled is False


def test_cache_type_and_max_cache_len_change_the_next_run(lab):
    lab.run_button.click()
    lab.cache_type.value = "dynamic"
    assert lab.max_cache_len.disabled  # meaningless for a dynamic cache
    lab.run_button.click()
    static, dynamic = lab.results.iloc[0], lab.results.iloc[1]
    assert dynamic["cache"] == "dynamic" and dynamic["max_cache_len"] == "-"
    assert lab.runs[0].token_ids == lab.runs[1].token_ids
    assert dynamic["allocated KiB (all steps)"] > static["allocated KiB (all steps)"]
    assert len(lab.figure.data) == 6 and lab.figure.data[3].name.startswith("#2 dynamic")
    lab.cache_type.value = "static"
    lab.max_cache_len.value = 200
    lab.run_button.click()
    assert lab.results.iloc[-1]["max_cache_len"] == 200
    assert lab.figure.data[-3].name.startswith("#3 static(200)")


def test_capacity_error_is_shown_and_nothing_is_allocated(lab):
    cpu = open_device("cpu")
    before = cpu.live_tensors
    lab.max_cache_len.value = 10
    assert "does not fit" in lab.plan.value and "23</b> positions" in lab.plan.value
    result = lab.run()  # kvlab errors are shown, not raised
    assert result is None and isinstance(lab.last_error, kvlab.CapacityError)
    assert "23 positions are needed but max_cache_len is 10" in lab.status_text
    assert "Nothing was allocated" in lab.status_text
    assert cpu.live_tensors == before
    assert lab.results.iloc[-1]["result"] == "CapacityError"
    lab.max_cache_len.value = 23  # exactly enough
    lab.run()
    assert lab.last_error is None and lab.results.iloc[-1]["result"] == "ok: 8 tokens"


def test_live_plot_is_throttled(toy):
    slow = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=12, throttle_s=60.0)
    slow.run()
    assert slow.plot.redraws <= 2  # the first step and the final flush, not one per token
    assert len(slow.figure.data[0].x) == 11  # yet every decode step is in the chart at the end
    fast = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=12, throttle_s=0.0)
    fast.run()
    assert fast.plot.redraws >= 12


def test_only_the_last_runs_stay_in_the_chart(toy):
    lab = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=3, max_runs=2)
    for _ in range(3):
        lab.run()
    assert len(lab.figure.data) == 6 and lab.figure.data[0].name.startswith("#2")
    assert len(lab.results) == 3


def test_bad_arguments_name_the_valid_choices(toy):
    with pytest.raises(ValueError, match=r"cache_type='paged' is not valid; choose one of \('dynamic', 'static'\)"):
        CacheLab(toy, cache_type="paged")
    with pytest.raises(ValueError, match="buffer_cache_mode='huge' is not valid"):
        CacheLab(toy, buffer_cache_mode="huge")
    with pytest.raises(ValueError, match="device='tpu' is not valid"):
        CacheLab(toy, device="tpu")


@pytest.mark.skipif(
    on_the_plugin_ep(),
    reason="the plugin EP keeps one WebGPU context per process, so a second "
    "buffer cache mode is refused there (tests/test_plugin.py::"
    "test_other_context_options_in_one_process_are_refused)",
)
def test_buffer_cache_mode_switch_needs_every_webgpu_cache_disposed():
    """In a fresh process (one WebGPU context per process): the lab reopens the context with the new mode, refuses
    while a user's cache still holds WebGPU tensors, and succeeds once it is disposed."""
    code = """
import kvlab
from kvlab.lab.widgets import CacheLab
lab = CacheLab("toy", models=["smollm2"], device="webgpu", buffer_cache_mode="simple", prompt_tokens=8, new_tokens=3)
lab.run()
assert lab.last_error is None, lab.last_error
assert kvlab.open_device("webgpu").label.buffer_cache_mode == "simple"
held = kvlab.StaticCache(16)
kvlab.generate("toy", [1, 2, 3], cache=held, device="webgpu", max_new_tokens=2)
lab.buffer_cache_mode.value = "disabled"
assert "Run closes it" in lab.plan.value
lab.run()
assert isinstance(lab.last_error, kvlab.DeviceError), lab.last_error
assert "open with buffer cache mode 'simple'" in str(lab.last_error) and "still alive" in str(lab.last_error)
assert kvlab.open_device("webgpu").label.buffer_cache_mode == "simple"
held.dispose()
lab.run()
assert lab.last_error is None, lab.last_error
assert kvlab.open_device("webgpu").label.buffer_cache_mode == "disabled"
assert list(lab.results["buffer cache"]) == ["simple", "disabled", "disabled"]
lab.model.value = "smollm2"  # never decoded on SwiftShader: refused before any step, with the way out
lab.run()
if kvlab.open_device("webgpu").adapter.kind == "software":
    assert isinstance(lab.last_error, kvlab.ConfigError) and "choose device 'cpu'" in str(lab.last_error)
print("ok")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- kvlab.lab.plots
def _frame(device: str, positions: range, tensors: int = 24, per_tensor_token: int = 4096) -> pd.DataFrame:
    """Synthetic records shaped like a dynamic-cache run (for plot labelling only; no model involved)."""
    rows = []
    for i, p in enumerate(positions):
        length = p + 1
        rows.append(
            {c: 0 for c in kvlab.COLUMNS}
            | {
                "step": i + 1,
                "phase": "decode",
                "device": device,
                "position": p,
                "n_tokens": 1,
                "wall_ms": 1.0 + i,
                "cache_tensors_allocated": tensors,
                "cache_bytes_allocated": tensors * length * per_tensor_token,
                "live_cache_bytes": tensors * length * per_tensor_token,
                "used_cache_bytes": tensors * length * per_tensor_token,
            }
        )
    df = pd.DataFrame(rows, columns=list(kvlab.COLUMNS))
    adapter = Adapter("SwiftShader Device (Subzero)", "software", "vulkan")
    df.attrs = {"label": RunLabel("kv-heavy", "float32", DeviceLabel(device, adapter), CacheSpec("dynamic"))}
    return df


def test_latency_plot_says_what_produced_it_and_draws_buckets_where_the_staircase_is():
    fig = plots.latency(_frame("webgpu", range(900, 2200, 50)))
    title = fig.layout.title.text
    for part in ("kv-heavy (float32)", "webgpu", "(software)", "context"):
        assert part in title
    lines = sorted(s.x0 for s in fig.layout.shapes)
    assert lines == [1024, 2048]  # 4 and 8 MiB per KV tensor at 4 KiB per token; 12/16 MiB beyond the range
    assert "12 MiB at 3,072" in title
    assert bucket_positions(4096) == {4: 1024, 8: 2048, 12: 3072, 16: 4096}


def test_cpu_runs_get_no_bucket_lines_and_differing_devices_go_to_the_legend(toy):
    with kvlab.StaticCache(64) as c:
        a = kvlab.generate(toy, [1, 2, 3], cache=c, device="cpu", max_new_tokens=4)
    web = _frame("webgpu", range(3, 6), tensors=4, per_tensor_token=128)
    web.attrs["label"] = replace(web.attrs["label"], model="toy")
    fig = plots.latency([a, web])
    names = [t.name for t in fig.data]
    assert "cpu [" in names[0] and "webgpu [" in names[1]
    assert plots.latency(a).layout.shapes == ()
    assert "onnxruntime" in plots.latency(a).layout.title.text  # the runtime that produced a live run


def test_sweep_labels_recorded_results_with_their_environment(tmp_path):
    variants = lambda c: [("dynamic", None, False), ("static", 4160, False), ("static", c + 5, True)]  # noqa: E731
    result = {
        "environment": {
            "date": "2026-11-29 08:00:00 UTC",
            "cpu": "AMD EPYC",
            "backend_package": "onnxruntime-webgpu",
            "backend_version": "1.27.0",
            "commit": "abc1234",
        },
        "rows": [
            {
                "model": "kv-heavy",
                "device": "webgpu",
                "adapter": "SwiftShader (software)",
                "buffer_cache_mode": "bucket",
                "dtype": "float32",
                "context": c,
                "kv_tensor_mib": c / 256,
                "variant": f"{kind}@{n}" if n else kind,
                "runner": "kvlab",
                "cache_kind": kind,
                "max_cache_len": n,
                "fitted": fitted,
                "cache_variant": "",
                "new_tokens": 6,
                "decode_ms": 100.0,
                "decode_ms_min": 90.0,
                "decode_ms_max": 110.0,
            }
            for c in (256, 1024, 2048)
            for kind, n, fitted in variants(c)
        ],
    }
    buys = recorded.load("what-a-static-cache-buys")  # its figure.py draws a recording made like this one
    (tmp_path / "figure.py").write_text(buys.read("figure.py"))
    (tmp_path / "results.json").write_text(json.dumps(result))
    rec = recorded.Recording("made-up", tmp_path)
    fig = rec.draw("sweep", file="results.json", recorded_model="kv-heavy", recorded_device="webgpu")
    assert all("(recorded)" in t.name and t.line.dash == "dot" for t in fig.data)
    assert sorted(t.name for t in fig.data) == [
        "dynamic bucket (recorded)",
        "static@4160 bucket (recorded)",
        "static@fit bucket (recorded)",
    ]  # one line per variant
    assert all(len(t.x) == 3 for t in fig.data)
    title = fig.layout.title.text
    assert "RECORDED, not live: kv-heavy (float32) on webgpu [SwiftShader (software)]" in title and "abc1234" in title
    assert sorted(s.x0 for s in fig.layout.shapes) == [1024, 2048]
    with pytest.raises(ValueError, match="no rows for model 'toy'"):
        rec.draw("sweep", file="results.json", recorded_model="toy", recorded_device="webgpu")


def test_token_diff_highlights_the_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    styled = plots.token_diff([1, 2, 3], [1, 5, 3], names=("cpu", "webgpu"))
    html = styled.to_html()
    assert "first divergence at generated token 1" in html and "#f8c9c9" in html


def test_plots_refuse_what_they_cannot_label():
    with pytest.raises(ValueError, match=r"needs attrs\['label'\], a kvlab RunLabel \(what produced it\)"):
        plots.latency(pd.DataFrame(columns=list(kvlab.COLUMNS)))
    with pytest.raises(TypeError, match="cannot plot list"):
        as_run([1, 2])


def test_the_first_run_of_a_setting_is_warmed_up_untimed(lab, monkeypatch):
    """The first run of each setting does one untimed two-token run first (a fresh WebGPU context compiles its
    shaders in its first steps); the table gets one row per timed run, and a repeated setting is not warmed again."""
    import kvlab.lab.widgets as widgets

    lengths: list[int] = []  # tokens of every generation the lab runs
    real = widgets.generate

    def counting(*args, **kwargs):
        g = real(*args, **kwargs)
        lengths.append(len(g.token_ids))
        return g

    monkeypatch.setattr(widgets, "generate", counting)
    lab.run_button.click()
    lab.run_button.click()
    lab.max_cache_len.value = 48
    lab.run_button.click()
    assert lengths == [2, 8, 8, 2, 8]  # warm-up, timed, timed again (warm), a new size: warm-up, timed
    assert len(lab.results) == 3 and lab.last_error is None


def test_the_dashboard_reads_as_one_line_where_its_widgets_cannot_render(lab):
    bundle = lab._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("kvlab CacheLab dashboard (live widgets): run this cell")


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_the_buffer_watch_sees_a_static_cache_write_in_place_and_a_dynamic_one_never(toy, device):
    from kvlab.lab.buffers import BufferWatch

    watches = []
    for cache in (kvlab.DynamicCache(), kvlab.StaticCache(32)):
        with cache:
            watch = BufferWatch(cache)
            kvlab.generate(
                toy,
                [5, 6, 7, 8],
                cache=cache,
                device=device,
                max_new_tokens=6,
                stop_on_eos=False,
                on_step=watch,
                tokens_per_read=1,  # the watch reads the cache as each step ends
            )
            watches.append(watch)
    dynamic, static = watches
    tensors = toy.info.layout.tensors
    assert static.states[0] == ["fresh"] * tensors and all(s == ["in place"] * tensors for s in static.states[1:])
    assert dynamic.states[0] == ["fresh"] * tensors and not any("in place" in s for s in dynamic.states[1:])
    assert dynamic.lengths == static.lengths == [4, 5, 6, 7, 8, 9]
    fig = plots.buffer_map(watches)
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 2 and heatmaps[1].z.shape == (tensors, 6)


def test_the_recorded_staircase_draws_both_pool_modes_with_the_predicted_churn():
    from kvlab.core.buckets import predict_churn

    fig = recorded.load("staircase-on-webgpu").figure()
    names = [t.name for t in fig.data]
    assert {
        "dynamic, pool bucket",
        "static, pool bucket",
        "dynamic, pool disabled",
        "static, pool disabled",
        "predicted, pool bucket",
        "counted, pool bucket",
    } <= set(names)
    predicted = next(t for t in fig.data if t.name == "predicted, pool bucket")
    contexts = [int(x) for x in predicted.x]
    per_token = 8 * 128 * 4  # kv-heavy: 8 KV heads x 128, float32
    assert list(predicted.y) == [predict_churn(24, per_token, c + 1).fresh for c in contexts]
    assert "NVIDIA H200 (hardware)" in fig.layout.title.text


def test_each_run_of_a_kind_gets_its_own_shade_and_the_dashboard_fits_its_output_area(toy):
    """One shade per run (two static runs never share a colour), full tick labels on the log axis, and a chart
    narrower than JupyterLab's output area (about 870 px)."""
    lab = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=3, max_runs=4)
    for kind in ("static", "static", "dynamic", "static"):
        lab.cache_type.value = kind
        lab.run()
    colors = [t.line.color for t in lab.figure.data[::3]]
    assert len(set(colors)) == 4, colors
    assert lab.figure.layout.width <= 860 and lab.widget.layout.max_width == "860px"
    assert 20 in lab.figure.layout.yaxis.tickvals and lab.figure.layout.yaxis.type == "log"


def test_runs_from_a_browser_join_the_dashboards_chart_and_table(toy):
    """A browser widget's result (kvlab Generations, as kvlab.web.results makes them) is drawn and tabled like a
    run of the lab's own; the widget is shown inside the dashboard."""
    import ipywidgets as w

    class FakeBrowser(w.HTML):
        def on_result(self, fn):
            self.callback = fn

    runs = []
    for cache in (kvlab.DynamicCache(), kvlab.StaticCache(32)):
        with cache:
            runs.append(kvlab.generate(toy, [5, 6, 7, 8], cache=cache, max_new_tokens=5, stop_on_eos=False))
    browser = FakeBrowser()
    lab = CacheLab(toy, device="cpu", browser=browser)
    assert browser in lab.widget.children
    browser.callback(type("Result", (), {"measured": runs, "host": "Chromium 156 (headless)"})())
    assert list(lab.results["device"]) == ["browser webgpu", "browser webgpu"]
    assert list(lab.results["cache"]) == ["dynamic", "static"] and lab.results.iloc[1]["max_cache_len"] == 32
    assert len(lab.figure.data) == 6 and lab.figure.data[3].name == "#2 static@32 \u00b7 browser"
    assert "in the browser" in lab.figure.layout.title.text and "2 browser runs added" in lab.status_text


def test_the_recorded_gain_and_the_staircase_at_a_glance_read_their_rows():
    buys = recorded.load("what-a-static-cache-buys")
    gains = dict(buys.draw("gains", "phi4-kv-webgpu", precision="fp32"))
    assert sorted(gains) == [1024, 2048, 4096, 8192, 16384] and gains[1024] == pytest.approx(43.9 / 9.9, rel=0.01)
    glance = recorded.load("staircase-on-webgpu").draw("glance")
    assert [t.name for t in glance.data] == [
        "dynamic cache (recorded)",
        "static cache (recorded)",
        "dynamic, predicted from the bucket table",
    ]
    fig = buys.figure(curves=[("phi4-kv, H200", "phi4-kv-webgpu", {"precision": "fp32"})], note="n")
    assert fig.data[0].name == "phi4-kv, H200 (recorded)" and fig.layout.yaxis.ticktext[0] == "1x"
    assert len(buys.figure().data) == 3  # the three recorded machines


def test_a_png_that_fails_to_render_is_tried_again_then_left_out(monkeypatch):
    import plotly.io as pio
    from plotly.io import _base_renderers

    from kvlab.lab.style import PNG_ATTEMPTS, retrying_png

    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) < PNG_ATTEMPTS:
            raise RuntimeError("ReferenceError: kaleido_scopes is not defined")
        return b"png"

    monkeypatch.setattr(_base_renderers, "to_image", flaky)
    renderer = retrying_png(pio.renderers["png"], 900)
    assert renderer.to_mimebundle({}) == {"image/png": "cG5n"} and len(calls) == PNG_ATTEMPTS
    calls.clear()
    monkeypatch.setattr(_base_renderers, "to_image", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("down")))
    assert renderer.to_mimebundle({}) == {} and renderer.width == 900


def test_max_cache_len_is_a_slider_with_a_text_box_beside_it_moving_together(lab):
    import ipywidgets as w

    assert isinstance(lab.max_cache_len, w.IntSlider) and isinstance(lab.max_cache_len_text, w.BoundedIntText)
    lab.max_cache_len_text.value = 300  # typed in the box
    assert lab.max_cache_len.value == 300
    lab.max_cache_len.value = 128  # moved on the slider
    assert lab.max_cache_len_text.value == 128
    controls = lab.widget.children[0].children[0]  # the column of controls
    row = next(r for r in controls.children if isinstance(r, w.HBox) and lab.max_cache_len in r.children)
    assert lab.max_cache_len_text in row.children
    lab.cache_type.value = "dynamic"
    assert lab.max_cache_len.disabled and lab.max_cache_len_text.disabled


def test_the_chart_compares_runs_of_one_prompt_length_only(toy):
    """A run with another prompt length clears the chart (not the table): one length axis, no 50-position run
    squeezed beside a 2,000-position one."""
    lab = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=3, max_cache_len=64)
    lab.run()
    lab.cache_type.value = "dynamic"
    lab.run()
    assert len(lab.figure.data) == 6
    lab.prompt_tokens.value = 40
    lab.run()
    assert len(lab.figure.data) == 3 and lab.figure.data[0].name.startswith("#3 dynamic")
    assert min(lab.figure.data[0].x) > 40 and len(lab.results) == 3
    assert lab.figure.data[0].line.color == lab.figure.data[1].line.color  # the kind's first shade again


def test_a_refused_run_draws_nothing_in_the_chart(toy):
    """A run refused before allocating (max_cache_len too small) is a row of the table, not a line of the chart: the
    chart keeps its room for the runs that ran (notebook 02's refusal sits between its lesson's runs)."""
    lab = CacheLab(toy, device="cpu", prompt_tokens=8, new_tokens=3, max_cache_len=64)
    lab.run()
    lab.max_cache_len.value = 8
    lab.run()
    assert type(lab.last_error).__name__ == "CapacityError" and len(lab.results) == 2
    assert [t.name for t in lab.figure.data if t.showlegend is not False] == [lab.figure.data[0].name]
    assert lab.figure.data[0].name.startswith("#1 static") and len(lab.figure.data) == 3


def test_the_chat_shows_its_newest_message_and_its_labels_in_full():
    """The transcript box starts scrolled to its end (a column-reverse flex box), so the newest message shows; the
    buttons and the checkbox are wide enough for their labels."""
    from kvlab.lab.chat import ChatLab

    chat = ChatLab("toy", device="cpu", max_new_tokens=3, reprefill=False)
    try:
        for message in ("hello", "and again", "a third one"):
            chat.send(message)
        html = chat.transcript.value
        assert "flex-direction:column-reverse" in html and "overflow-y:auto" in html
        assert html.index("hello") < html.index("a third one")  # in reading order inside the reversed box
        assert chat.edit_button.layout.width == "170px" and chat.use_lookup.layout.width == "auto"
    finally:
        chat.close()


def test_a_live_text_prints_itself_again_when_its_source_changes():
    """Notebook 00's adapter table: run before the browser answers, it follows the answer when it comes."""
    import traitlets

    from kvlab.lab.show import live_text

    class Source(traitlets.HasTraits):
        browser = traitlets.Dict({})

    source = Source()
    shown = live_text(source, "browser", lambda: f"browser: {source.browser.get('name', 'no answer yet')}")
    assert repr(shown) == "browser: no answer yet" and shown.widget.outputs[0]["text"] == "browser: no answer yet\n"
    source.browser = {"name": "Chromium"}
    assert shown.widget.outputs[0]["text"] == "browser: Chromium\n"
    assert repr(shown) == "browser: no answer yet"  # the plain text stays what the cell printed


def test_the_recorded_chat_figure_keeps_the_kept_cache_visible_on_genais_line(tmp_path):
    """09's recorded H200 run (data/conversation/figure.py): genai's append_tokens costs what the kept cache costs,
    so its line is drawn first, wider and dashed, with its own marker: both stay visible."""
    rows = [{"history_tokens": h, "reuse_ttft_ms": [t], "reprefill_ttft_ms": [4 * t], "genai_ttft_ms": [t]}
            for h, t in ((520, 30.7), (1008, 47.5))]  # fmt: skip
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps({"rows": rows, "model": "phi4-kv", "device": "webgpu"}))
    (tmp_path / "figure.py").write_text(recorded.load("conversation").read("figure.py"))
    fig = recorded.Recording("conversation", tmp_path).figure("x/results.json")
    genai, kept, reprefill = fig.data
    assert genai.name.startswith("onnxruntime-genai") and kept.name == "kept cache" and reprefill.name == "re-prefill"
    assert genai.line.dash == "dash" and genai.line.width > kept.line.width and list(genai.y) == list(kept.y)
    assert len({t.marker.symbol for t in fig.data}) == 3
