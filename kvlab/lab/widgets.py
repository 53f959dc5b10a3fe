"""Notebook widgets: ``CacheLab``, a dashboard to run one model with either cache and watch it step by step.

    from kvlab.lab.widgets import CacheLab
    lab = CacheLab("toy", device="webgpu")
    lab                                   # shows the controls, a live chart and the table of runs
    lab.max_cache_len.value = 64          # every control can be driven from code (and from pytest)
    lab.run_button.click()                # the same callback as the Run button

Each run makes a fresh cache and disposes it at the end, so the lab never holds device memory between runs.
That is what lets it honour a change of WebGPU buffer cache mode: ONNX Runtime keeps one WebGPU context per
process whose mode is fixed when it is created, so a new mode means closing the context
(``kvlab.close_device("webgpu")``) and opening a fresh one. kvlab refuses that while any cache still holds
WebGPU tensors, and where the package keeps the context for the whole process (``kvlab.ort.runtime.plugin``); the lab
then says so and leaves the open context (and its mode) as it is.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.devices import BUFFER_CACHE_MODES, DEVICES
from ..core.errors import CapacityError, ConfigError, DeviceError, KvlabError, check_choice
from ..core.generation import Generation, positions_needed
from ..ort import Device, Model, StaticCache, close_device, generate, load, make_cache, open_device, opened
from ..ort.decode.caches import CACHE_KINDS
from ..presets import BUILTIN_NAMES
from .liveplot import LivePlot
from .style import run_color, runtime_text, unit

# Models too big for a software WebGPU adapter: seconds per token there (docs/known-limits.md).
SLOW_ON_SOFTWARE = frozenset({"smollm2"})

LAB_TEXT = (
    "A language model writes one token at a time. For every token it has already seen it keeps a key and a value "
    "vector in each attention layer: the KV cache. A dynamic cache grows by one position each step, which on many "
    "runtimes means a fresh, slightly longer buffer and a copy of everything so far. A static cache reserves "
    "max_cache_len positions once and writes each new token in place. "
)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def open_webgpu(mode: str) -> Device:
    """The WebGPU device with this buffer cache mode: the open one when its mode matches, else a fresh context.

    Raises DeviceError (naming the live tensors) when the open context must be closed but cannot be, because
    some cache still holds WebGPU tensors."""
    check_choice(mode, BUFFER_CACHE_MODES, "buffer cache mode ", DeviceError)
    current = opened("webgpu")
    if current is None:
        return open_device("webgpu", buffer_cache_mode=mode)
    if current.label.buffer_cache_mode == mode:
        return current
    try:
        close_device("webgpu")
    except DeviceError as exc:
        raise DeviceError(
            f"the WebGPU context is open with buffer cache mode {current.label.buffer_cache_mode!r}; switching "
            f"to {mode!r} needs a fresh context, but {exc}. Or restart the kernel."
        ) from exc
    return open_device("webgpu", buffer_cache_mode=mode)


def prompt_ids(model: Model, n_tokens: int, text: str = LAB_TEXT) -> np.ndarray:
    """``n_tokens`` real-text token ids: ``text`` tokenized and repeated as needed (ValueError below 1)."""
    if n_tokens < 1:
        raise ValueError(f"prompt length {n_tokens} must be >= 1")
    return np.resize(model.encode(text), n_tokens).astype(np.int64)


class CacheLab:
    """Controls for cache type, max_cache_len, prompt length, new tokens, device and WebGPU buffer cache mode;
    a Run button; a live chart; a status line (memory plan, errors); a table with one row per run. The arguments
    are the controls' first values (``models``: the other choices of the model control; ``allow_slow``: run a
    model too big for a software adapter anyway). ``browser``: a widget that runs a job on the notebook's own
    browser GPU (``kvlab.web.widget.BrowserLab``: anything with ``on_result(fn)`` whose result has ``measured``
    generations): shown under the controls, and every run it sends back joins the chart and the table, labelled
    with the browser and its adapter. Raises ConfigError for a bad choice, ValueError for an unknown model."""

    def __init__(
        self,
        model: str | Model = "toy",
        *,
        models: Sequence[str] | None = None,
        device: str = "webgpu",
        cache_type: str = "static",
        max_cache_len: int = 128,
        prompt_tokens: int = 32,
        new_tokens: int = 24,
        buffer_cache_mode: str = "bucket",
        throttle_s: float = 0.25,
        max_runs: int = 4,
        progress: bool = True,
        allow_slow: bool = False,
        browser: Any = None,
    ):
        import ipywidgets as w

        check_choice(cache_type, CACHE_KINDS, "cache_type=")
        check_choice(device, DEVICES, "device=")
        check_choice(buffer_cache_mode, BUFFER_CACHE_MODES, "buffer_cache_mode=")
        first = model if isinstance(model, str) else model.name
        self._models: dict[str, Model] = {} if isinstance(model, str) else {model.name: model}
        names = list(dict.fromkeys([first, *(models or [])]))
        unknown = [n for n in names if n not in BUILTIN_NAMES and n not in self._models]
        if unknown:
            raise ValueError(f"models {unknown} are not valid; choose from {BUILTIN_NAMES}")
        self.progress, self.allow_slow = progress, allow_slow
        style = {"description_width": "110px"}
        lay = w.Layout(width="330px")
        self.model = w.Dropdown(options=names, value=first, description="model", style=style, layout=lay)
        self.cache_type = w.ToggleButtons(
            options=list(CACHE_KINDS),
            value=cache_type,
            description="cache",
            style={**style, "button_width": "104px"},
            layout=w.Layout(width="340px", display="flex", flex_flow="row"),
        )
        self.max_cache_len = w.BoundedIntText(
            value=max_cache_len, min=1, max=1 << 16, description="max_cache_len", style=style, layout=lay
        )
        self.prompt_tokens = w.IntSlider(
            value=prompt_tokens,
            min=1,
            max=2048,
            description="prompt tokens",
            continuous_update=False,
            style=style,
            layout=lay,
        )
        self.new_tokens = w.IntSlider(
            value=new_tokens, min=1, max=256, description="new tokens", continuous_update=False, style=style, layout=lay
        )
        self.device = w.Dropdown(options=list(DEVICES), value=device, description="device", style=style, layout=lay)
        self.buffer_cache_mode = w.Dropdown(
            options=list(BUFFER_CACHE_MODES),
            value=buffer_cache_mode,
            description="buffer cache",
            style=style,
            layout=lay,
        )
        self.run_button = w.Button(
            description="Run", button_style="primary", icon="play", layout=w.Layout(width="120px")
        )
        self.plan = w.HTML()
        self.status = w.HTML()
        self.table = w.HTML()
        self.progress_bar = w.IntProgress(
            value=0, min=0, max=1, description="tokens", layout=w.Layout(width="200px", visibility="hidden")
        )
        self.plot = LivePlot(throttle_s, max_runs)
        for widget, cls in (
            (self.model, "model"),
            (self.cache_type, "cache-type"),
            (self.max_cache_len, "max-cache-len"),
            (self.prompt_tokens, "prompt-tokens"),
            (self.new_tokens, "new-tokens"),
            (self.device, "device"),
            (self.buffer_cache_mode, "buffer-cache-mode"),
            (self.run_button, "run"),
            (self.plan, "plan"),
            (self.status, "status"),
            (self.table, "results"),
        ):
            widget.add_class(f"kvlab-{cls}")
        self.runs: list[Generation] = []
        self._shades: dict[str, int] = {}  # runs drawn so far per cache kind: each gets its own shade
        self._warmed: set[tuple[Any, ...]] = set()  # settings already warmed up (see _warm_up)
        self.rows: list[dict[str, Any]] = []
        self.last_error: Exception | None = None
        self.running = False
        for control in (
            self.model,
            self.cache_type,
            self.max_cache_len,
            self.prompt_tokens,
            self.new_tokens,
            self.device,
            self.buffer_cache_mode,
        ):
            control.observe(self._update_plan, names="value")
        self.run_button.on_click(lambda _: self.run())
        controls = w.VBox(
            [
                self.model,
                self.cache_type,
                self.max_cache_len,
                self.prompt_tokens,
                self.new_tokens,
                self.device,
                self.buffer_cache_mode,
                w.HBox([self.run_button, self.progress_bar]),
            ],
            layout=w.Layout(min_width="360px"),
        )
        right = w.VBox([self.plan, self.status], layout=w.Layout(flex="1 1 0", min_width="0", padding="0 0 0 12px"))
        parts = [w.HBox([controls, right], layout=w.Layout(width="100%"))]
        self.browser = browser
        if browser is not None:
            browser.on_result(self.add_browser_result)
            parts.append(browser)
        self.widget = w.VBox([*parts, self.plot.box, self.table], layout=w.Layout(width="100%", max_width="860px"))
        self.widget.add_class("kvlab-cachelab")
        self._render_table()
        self._update_plan()

    # -- display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict) and "text/plain" in bundle:  # what a viewer without the live widget shows
            bundle["text/plain"] = (
                "kvlab CacheLab dashboard (live widgets): run this cell to show it. Its controls, "
                "chart and table are drawn by the running kernel."
            )
        return bundle

    @property
    def figure(self) -> Any:
        """The live plotly FigureWidget."""
        return self.plot.figure

    @property
    def status_text(self) -> str:
        """The status line as plain text."""
        return html.unescape(re.sub(r"<[^>]+>", "", self.status.value)).strip()

    # -- state
    def get_model(self) -> Model:
        name = self.model.value
        if name not in self._models:
            self._models[name] = load(name)
        return self._models[name]

    def needed(self) -> int:
        """Positions the run needs: prompt + new tokens - 1 (the last token is never fed back)."""
        return positions_needed(self.prompt_tokens.value, self.new_tokens.value)

    def _update_plan(self, change: Any = None) -> None:
        static = self.cache_type.value == "static"
        self.max_cache_len.disabled = not static
        self.buffer_cache_mode.disabled = self.device.value != "webgpu"
        info = self.get_model().info
        need = self.needed()
        lines = [
            f"<b>{html.escape(info.name)}</b> ({info.dtype_name}): {2 * info.num_layers} KV tensors, "
            f"{info.bytes_per_token:,} bytes per token; this run needs <b>{need}</b> positions "
            f"({self.prompt_tokens.value} prompt + {self.new_tokens.value} new - 1)."
        ]
        if static:
            report = StaticCache(self.max_cache_len.value).memory_report(info)
            fits = need <= self.max_cache_len.value
            lines.append(
                f"Static: reserves {_mib(report.total_bytes)} once ({self.max_cache_len.value} positions); "
                f"the run will use {_mib(need * info.bytes_per_token)}. "
                + (
                    "<span style='color:#2ca02c'>fits</span>"
                    if fits
                    else "<span style='color:#d62728'><b>does not fit</b>: the run will be refused before "
                    "anything is allocated</span>"
                )
            )
        else:
            lines.append("Dynamic: the runtime allocates new, one-token-longer KV tensors every step.")
        if self.device.value == "webgpu":
            lines.append(self._mode_note())
        self.plan.value = "<div style='line-height:1.5'>" + "<br>".join(lines) + "</div>"

    def _mode_note(self) -> str:
        dev = opened("webgpu")
        want = self.buffer_cache_mode.value
        if dev is None:
            return f"WebGPU buffer cache mode: {want} (the context opens on Run)."
        have = dev.label.buffer_cache_mode
        if have == want:
            return f"WebGPU buffer cache mode in force: <b>{have}</b>."
        return (
            f"The WebGPU context is open with mode <b>{have}</b>; Run closes it and opens a fresh one with "
            f"<b>{want}</b> (only possible when no cache holds WebGPU tensors: {dev.live_tensors} alive now)."
        )

    # -- running
    def run(self) -> Generation | None:
        """One generation with the current settings. kvlab errors are shown in the status line (and kept in
        ``last_error``) rather than raised; the run is added to the table either way."""
        if self.running:
            self._show_error(RuntimeError("a run is already going; wait for it to finish"))
            return None
        self.running, self.run_button.disabled, self.last_error = True, True, None
        self.status.value = "<i>running...</i>"
        row: dict[str, Any] = {}
        try:
            return self._run(row)
        except KvlabError as exc:
            self._show_error(exc, row)
            return None
        except Exception as exc:
            self._show_error(exc, row)
            raise
        finally:
            if row:
                self.rows.append(row)
                self._render_table()
            self.running, self.run_button.disabled = False, False
            self._update_plan()

    def _run(self, row: dict[str, Any]) -> Generation:
        model = self.get_model()
        cache_type, new = self.cache_type.value, self.new_tokens.value
        ids = prompt_ids(model, self.prompt_tokens.value)
        mode = self.buffer_cache_mode.value if self.device.value == "webgpu" else "-"
        row.update(
            {
                "run": len(self.rows) + 1,
                "model": model.name,
                "device": self.device.value,
                "buffer cache": mode,
                "cache": cache_type,
                "max_cache_len": self.max_cache_len.value if cache_type == "static" else "-",
                "prompt": len(ids),
                "new": new,
                "needed": self.needed(),
            }
        )
        dev = open_webgpu(mode) if self.device.value == "webgpu" else open_device("cpu")
        if (
            dev.name == "webgpu"
            and dev.adapter.kind == "software"
            and model.name in SLOW_ON_SOFTWARE
            and not self.allow_slow
        ):
            raise ConfigError(
                f"model {model.name} on a software WebGPU adapter ({dev.adapter.name}) decodes at "
                "seconds per token; choose device 'cpu' or the toy model here "
                "(CacheLab(..., allow_slow=True) to run it anyway)"
            )
        cache = make_cache(cache_type, self.max_cache_len.value if cache_type == "static" else None)
        before = dev.live_tensors
        label = f"#{row['run']} {cache_type}" + (f"({self.max_cache_len.value})" if cache_type == "static" else "")
        label += f" \u00b7 {dev.name}" + (f" {mode}" if dev.name == "webgpu" else "")
        mode_note = f" \u00b7 buffer cache {mode}" if dev.name == "webgpu" else ""
        title = (
            f"<b>{model.name} ({model.info.dtype_name}) on {dev.name}: {html.escape(str(dev.adapter))}</b>"
            f"<br><sup>run #{row['run']}: {cache_type} cache"
            f"{f' (max_cache_len={self.max_cache_len.value})' if cache_type == 'static' else ''}, prompt "
            f"{len(ids)} + {new} new tokens{mode_note} \u00b7 {runtime_text(dev.label)}</sup>"
        )
        self._warm_up(model, ids, dev, cache_type, mode)
        self._set_units(model)
        self.plot.start(label, self._next_color(cache_type), title)
        bar = self._progress(new, label)
        hooks = [self.plot.add, lambda r: bar.update(1) if bar is not None and r.phase != "handoff" else None]
        try:
            with cache:
                try:
                    g = generate(
                        model, ids, cache=cache, device=dev, max_new_tokens=new, stop_on_eos=False, on_step=hooks
                    )
                except CapacityError as exc:
                    held = bool(getattr(cache, "allocated", False))
                    added = dev.live_tensors - before
                    row.update({"result": "CapacityError", "new buffers": added})
                    raise CapacityError(
                        f"{exc}. Nothing was allocated: the cache holds "
                        f"{'buffers' if held else 'no buffers'} and {added} tensors were added on "
                        f"{dev.name}."
                    ) from exc
        finally:
            self.plot.finish()
            if bar is not None:
                bar.close()
        row.update(outcome(g))
        self.runs.append(g)
        self.status.value = (
            f"<span style='color:#2ca02c'>run #{row['run']} done</span> (after an untimed warm-up "
            f"the first time these settings ran): {len(g.token_ids)} tokens, "
            f"median decode step {g.decode_ms():.1f} ms on {html.escape(str(g.device))}; cache disposed "
            f"({dev.live_tensors - before} tensors left on {dev.name})."
        )
        return g

    def _warm_up(self, model: Model, ids: np.ndarray, dev: Device, cache_type: str, mode: str) -> None:
        """One untimed two-token run the first time a setting is used in this process: a fresh WebGPU context
        compiles its shaders in its first steps, which would make the first timed run look slower than the next.
        Skipped when the run would not fit: the timed run reports that."""
        size = self.max_cache_len.value if cache_type == "static" else None
        key = (model.name, dev.name, mode, cache_type, size, len(ids))
        if key in self._warmed or (size is not None and positions_needed(len(ids), 2) > size):
            return
        self.status.value = "<i>warming up: one untimed run compiles the kernels for these shapes...</i>"
        # WebGPU compiles per shape, so its warm-up feeds the whole prompt; the CPU EP compiles nothing, and a few
        # tokens make its session's first-run costs without paying a long prompt's prefill twice
        feed = ids if dev.name == "webgpu" else ids[:8]
        with make_cache(cache_type, size) as cache:
            generate(model, feed, cache=cache, device=dev, max_new_tokens=2, stop_on_eos=False)
        self._warmed.add(key)

    def _next_color(self, kind: str) -> str:
        index = self._shades.get(kind, 0)
        self._shades[kind] = index + 1
        return run_color(kind, index)

    def _set_units(self, model: Model) -> None:
        """KiB or MiB on the memory panel, from the largest reservation this run can make."""
        need = max(self.needed(), self.max_cache_len.value if self.cache_type.value == "static" else 0)
        scale, units = unit(need * model.info.bytes_per_token)
        self.plot.set_units(*((scale, units) if units == "MiB" else (1024, "KiB")))

    def add_browser_result(self, result: Any) -> None:
        """The runs a browser sent back (``result.measured``: kvlab Generations) added to the chart and the table,
        each labelled with the browser host and its WebGPU adapter."""
        for g in result.measured:
            number = len(self.rows) + 1
            kind = g.label.cache.kind
            where = f"{getattr(result, 'host', 'browser')}: {g.label.device.adapter}"
            name = f"#{number} {g.label.cache} \u00b7 browser"
            title = (
                f"<b>{html.escape(g.label.model)} ({g.label.dtype}) in the browser: {html.escape(str(where))}</b>"
                f"<br><sup>run #{number}: {g.label.cache}, prompt {len(g.prompt_ids)} + {len(g.token_ids)} new "
                f"tokens \u00b7 {html.escape(g.label.device.runtime)}</sup>"
            )
            self.plot.draw(name, self._next_color(kind), title, g.records)
            self.rows.append(
                {
                    "run": number,
                    "model": g.label.model,
                    "device": "browser webgpu",
                    "buffer cache": g.label.device.buffer_cache_mode or "-",
                    "cache": kind,
                    "max_cache_len": g.label.cache.max_cache_len if kind == "static" else "-",
                    "prompt": len(g.prompt_ids),
                    "new": len(g.token_ids),
                    "needed": positions_needed(len(g.prompt_ids), len(g.token_ids)),
                    **outcome(g),
                }
            )
            self.runs.append(g)
        self._render_table()
        self.status.value = (
            f"<span style='color:#2ca02c'>{len(result.measured)} browser runs added</span> from "
            f"{html.escape(str(getattr(result, 'host', 'the browser')))}."
        )

    def _progress(self, total: int, label: str) -> Any:
        """The dashboard's own progress bar (a widget in the layout: it adds no cell output, so it behaves the
        same in JupyterLab, under nbval and in pytest)."""
        if not self.progress:
            return None
        bar = self.progress_bar
        bar.max, bar.value, bar.description = total, 0, "tokens"
        bar.layout.visibility = "visible"

        class _Bar:
            def update(self, n: int) -> None:
                bar.value = min(bar.max, bar.value + n)

            def close(self) -> None:
                bar.layout.visibility = "hidden"

        return _Bar()

    def _show_error(self, exc: Exception, row: dict[str, Any] | None = None) -> None:
        self.last_error = exc
        if row is not None and row and "result" not in row:
            row["result"] = type(exc).__name__
        self.status.value = (
            "<div style='color:#b00020;border-left:4px solid #b00020;padding:4px 8px;"
            f"background:#fdeaea'><b>{type(exc).__name__}</b>: {html.escape(str(exc))}</div>"
        )

    # -- results
    @property
    def results(self) -> Any:
        """One row per run (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _render_table(self) -> None:
        if not self.rows:
            self.table.value = "<p><i>No runs yet: set the controls and press Run.</i></p>"
            return
        df = self.results
        df = df.drop(columns=[c for c in HIDDEN_COLUMNS if c in df.columns]).astype(object).map(_cell)
        self.table.value = (
            _TABLE_CSS
            + "<div style='overflow-x:auto'>"
            + df.to_html(index=False, classes="kvlab-results-table", border=0, escape=True)
            + "</div>"
        )


# columns the dashboard's table leaves out to fit its width (``results`` keeps them)
HIDDEN_COLUMNS = ("first tokens",)

_TABLE_CSS = """<style>
.kvlab-results-table {border-collapse: collapse; font-size: 12px; margin-top: 6px}
.kvlab-results-table th {background: #f3f5f7; padding: 3px 8px; max-width: 90px; white-space: normal;
  text-align: center; font-weight: 600; border-bottom: 1px solid #ccc}
.kvlab-results-table td {padding: 3px 8px; white-space: nowrap; text-align: right; border-bottom: 1px solid #eee}
.kvlab-results-table tr:last-child td {background: #eef6ff}
</style>"""


def outcome(g: Generation) -> dict[str, Any]:
    """The table's columns for a finished run: its result, median decode step, memory and allocations."""
    f = g.frame()
    return {
        "result": f"ok: {len(g.token_ids)} tokens",
        "decode ms (median)": round(g.decode_ms(), 1),
        "reserved KiB": round(f["live_cache_bytes"].max() / 1024, 1),
        "used KiB": round(f["used_cache_bytes"].iloc[-1] / 1024, 1),
        "allocated KiB (all steps)": round(f["cache_bytes_allocated"].sum() / 1024, 1),
        "new buffers": int(f["new_buffers"].sum()),
        "first tokens": " ".join(str(t) for t in g.token_ids[:6]),
    }


def _cell(value: Any) -> Any:
    """Table cells: blanks for missing values, integers without '.0'."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value
