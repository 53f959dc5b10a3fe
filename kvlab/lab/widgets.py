"""``CacheLab``, the notebook dashboard that runs one model with either cache and draws it step by step.

    from kvlab.lab.widgets import CacheLab
    lab = CacheLab("toy", device="webgpu")
    lab                                   # shows the controls, a live chart and the table of runs
    lab.max_cache_len.value = 64          # every control can be driven from code (and from pytest)
    lab.run_button.click()                # the same callback as the Run button

Each run makes a fresh cache and disposes it at the end, so the lab holds no device memory between runs. That lets
it honour a change of WebGPU buffer cache mode: ONNX Runtime fixes the mode when it creates its WebGPU context, so
a new mode means closing the context and opening a fresh one, which kvlab refuses while any cache still holds
WebGPU tensors (and where the runtime keeps one context per process); the lab then says so and keeps the open one.
Its words and tables come from ``readouts``, its chart from ``liveplot``.
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
from ..core.records import StepRecord
from ..ort import Device, Model, close_device, generate, load, make_cache, open_device, opened
from ..ort.decode.caches.kinds import CACHE_KINDS
from ..presets import BUILTIN_NAMES
from .liveplot import LivePlot
from .readouts import Settings, browser_row, browser_titles, outcome, plan_html, run_titles, settings_row, table_html
from .show import error_html, with_plain_text
from .style import unit

# models too big to step through live on a software WebGPU adapter (docs/known-limits.md)
SLOW_ON_SOFTWARE = frozenset({"smollm2"})
MAX_CACHE_LEN_TOP = 1 << 16  # the largest max_cache_len the controls offer
# the CSS class of each setting widget, in the order of ``CacheLab.inputs``: "kvlab-" + this
CSS_CLASSES = ("model", "cache-type", "max-cache-len", "prompt-tokens", "new-tokens", "device", "buffer-cache-mode")

LAB_TEXT = (
    "A language model writes one token at a time. For every token it has already seen it keeps a key and a value "
    "vector in each attention layer: the KV cache. A dynamic cache grows by one position each step, which on many "
    "runtimes means a fresh, slightly longer buffer and a copy of everything so far. A static cache reserves "
    "max_cache_len positions once and writes each new token in place. "
)


def open_webgpu(mode: str) -> Device:
    """The WebGPU device with this buffer cache mode: the open one when its mode matches, else a fresh context.
    DeviceError (naming the live tensors) when the open context must be closed but some cache still holds WebGPU
    tensors."""
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


class CacheLab:
    """Controls for model, cache type, max_cache_len, prompt length, new tokens, device and WebGPU buffer cache mode
    (ipywidgets, each with its ``kvlab-...`` CSS class), set to the arguments; a Run button; a live chart; the plan
    and status lines; a table with one row per run. ``models``: the model control's other choices; ``allow_slow``:
    run a model too big for a software adapter anyway; ``browser``: a widget running jobs on the browser's GPU
    (anything with ``on_result(fn)`` whose result has ``measured`` generations, e.g. ``kvlab.web.widget.BrowserLab``),
    shown under the controls, each run it sends back joining the chart and the table. ConfigError for a bad choice,
    ValueError for an unknown model."""

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
        self._models: dict[str, Model] = {} if isinstance(model, str) else {first: model}
        names = list(dict.fromkeys([first, *(models or [])]))
        unknown = [n for n in names if n not in BUILTIN_NAMES and n not in self._models]
        if unknown:
            raise ValueError(f"models {unknown} are not valid; choose from {BUILTIN_NAMES}")

        style, layout = {"description_width": "110px"}, w.Layout(width="330px")
        kw = {"style": style, "layout": layout}
        self.model = w.Dropdown(options=names, value=first, description="model", **kw)
        self.cache_type = w.ToggleButtons(
            options=list(CACHE_KINDS), value=cache_type, description="cache", style={**style, "button_width": "104px"},
            layout=w.Layout(width="340px", display="flex", flex_flow="row"),
        )  # fmt: skip
        # a slider to sweep, and a text box beside it for an exact value; linked in the kernel, so setting either
        # from code moves both
        self.max_cache_len = w.IntSlider(
            value=max_cache_len, min=1, max=MAX_CACHE_LEN_TOP, description="max_cache_len", readout=False,
            continuous_update=False, style=style, layout=w.Layout(width="250px"),
        )  # fmt: skip
        self.max_cache_len_text = w.BoundedIntText(
            value=max_cache_len, min=1, max=MAX_CACHE_LEN_TOP, layout=w.Layout(width="80px")
        )
        w.link((self.max_cache_len, "value"), (self.max_cache_len_text, "value"))
        slider = {"min": 1, "continuous_update": False, **kw}
        self.prompt_tokens = w.IntSlider(value=prompt_tokens, max=2048, description="prompt tokens", **slider)
        self.new_tokens = w.IntSlider(value=new_tokens, max=256, description="new tokens", **slider)
        self.device = w.Dropdown(options=list(DEVICES), value=device, description="device", **kw)
        self.buffer_cache_mode = w.Dropdown(
            options=list(BUFFER_CACHE_MODES), value=buffer_cache_mode, description="buffer cache", **kw
        )
        button = {"button_style": "primary", "icon": "play", "layout": w.Layout(width="120px")}
        self.run_button = w.Button(description="Run", **button)
        # the dashboard's own progress bar: a widget in the layout, so it adds no cell output
        hidden = w.Layout(width="200px", visibility="hidden")
        self.progress_bar = w.IntProgress(max=1, description="tokens", layout=hidden)
        self.plan, self.status, self.table = w.HTML(), w.HTML(), w.HTML()
        classes = [*zip(self.inputs, CSS_CLASSES), (self.max_cache_len_text, "max-cache-len"), (self.run_button, "run")]
        for widget, cls in [*classes, (self.plan, "plan"), (self.status, "status"), (self.table, "results")]:
            widget.add_class(f"kvlab-{cls}")

        self.progress, self.allow_slow, self.browser = progress, allow_slow, browser
        self.plot = LivePlot(throttle_s, max_runs)
        self.runs: list[Generation] = []
        self.rows: list[dict[str, Any]] = []
        self.last_error: Exception | None = None
        self.running = False
        self._warmed: set[tuple[Any, ...]] = set()  # settings already warmed up (``_warm_up``)
        for control in self.inputs:
            control.observe(self._update_plan, names="value")
        self.run_button.on_click(lambda _: self.run())
        if browser is not None:
            browser.on_result(self.add_browser_result)
        self.widget = self._layout()
        self.table.value = table_html(self.rows)
        self._update_plan()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        text = "kvlab CacheLab dashboard (live widgets): run this cell to show it. Its controls, chart and table are "
        return with_plain_text(self.widget._repr_mimebundle_(**kwargs), text + "drawn by the running kernel.")

    @property
    def inputs(self) -> tuple[Any, ...]:
        """The seven setting widgets, in the order shown (that of ``Settings``' fields)."""
        return (self.model, self.cache_type, self.max_cache_len, self.prompt_tokens, self.new_tokens, self.device,
                self.buffer_cache_mode)  # fmt: skip

    def settings(self) -> Settings:
        """The settings the controls hold now."""
        return Settings(*(widget.value for widget in self.inputs))

    @property
    def figure(self) -> Any:
        """The live plotly FigureWidget."""
        return self.plot.figure

    @property
    def status_text(self) -> str:
        """The status line as plain text."""
        return html.unescape(re.sub(r"<[^>]+>", "", self.status.value)).strip()

    @property
    def results(self) -> Any:
        """One row per run (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def get_model(self) -> Model:
        """The model the model control names, loaded on first use and kept."""
        name = self.model.value
        if name not in self._models:
            self._models[name] = load(name)
        return self._models[name]

    def needed(self) -> int:
        """Positions the run needs: prompt + new tokens - 1 (the last token is never fed back)."""
        return self.settings().needed

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
                self.table.value = table_html(self.rows)
            self.running, self.run_button.disabled = False, False
            self._update_plan()

    def add_browser_result(self, result: Any) -> None:
        """The runs a browser sent back (``result.measured``: kvlab Generations) added to the chart and the table,
        each labelled with the browser host and its WebGPU adapter."""
        for g in result.measured:
            name, title = browser_titles(g, len(self.rows) + 1, getattr(result, "host", "browser"))
            self.plot.join(len(g.prompt_ids))
            self.plot.draw(name, self.plot.next_color(g.label.cache.kind), title, g.records)
            self.rows.append(browser_row(g, len(self.rows) + 1))
            self.runs.append(g)
        self.table.value = table_html(self.rows)
        host = html.escape(str(getattr(result, "host", "the browser")))
        self.status.value = f"<span style='color:#2ca02c'>{len(result.measured)} browser runs added</span> from {host}."

    def _run(self, row: dict[str, Any]) -> Generation:
        """The timed run on a fresh cache, disposed at its end, drawn live. Before it: the device opened (WebGPU in
        the chosen buffer cache mode), a model too slow for a software adapter refused, the first run of a setting
        warmed up. ``row`` gets the run's settings first, and what was allocated if it runs out of room."""
        model, s, number = self.get_model(), self.settings(), len(self.rows) + 1
        ids = model.tokens_of(LAB_TEXT, s.prompt_tokens)
        row.update(settings_row(number, model.name, s.device, s.mode, s.cache, s.max_cache_len, len(ids), s.new_tokens))
        dev = open_webgpu(s.mode) if s.device == "webgpu" else open_device("cpu")
        slow = dev.name == "webgpu" and dev.adapter.kind == "software" and model.name in SLOW_ON_SOFTWARE
        if slow and not self.allow_slow:
            raise ConfigError(
                f"model {model.name} on a software WebGPU adapter ({dev.adapter.name}) decodes too slowly to watch; "
                "choose device 'cpu' or the toy model here (CacheLab(..., allow_slow=True) to run it anyway)"
            )
        cache = make_cache(s.cache, s.size)
        before = dev.live_tensors
        label, title = run_titles(model, dev, s, number, len(ids))
        self._warm_up(model, ids, dev, s)
        scale, units = unit(max(s.needed, s.size or 0) * model.info.bytes_per_token)  # the largest reservation
        self.plot.set_units(*((scale, units) if units == "MiB" else (1024, "KiB")))
        self.plot.join(len(ids))  # the chart compares runs of one prompt length: one length axis
        self.plot.start(label, self.plot.next_color(s.cache), title)
        hooks = [self.plot.add, *([self._progress(s.new_tokens)] if self.progress else [])]
        try:
            with cache:
                try:
                    g = generate(model, ids, cache=cache, device=dev, max_new_tokens=s.new_tokens, stop_on_eos=False,
                                 on_step=hooks)  # fmt: skip
                except CapacityError as exc:  # say what was allocated: nothing
                    held, added = bool(getattr(cache, "allocated", False)), dev.live_tensors - before
                    row.update({"result": "CapacityError", "new buffers": added})
                    raise CapacityError(
                        f"{exc}. Nothing was allocated: the cache holds {'buffers' if held else 'no buffers'} and "
                        f"{added} tensors were added on {dev.name}."
                    ) from exc
        finally:
            self.plot.finish()
            self.progress_bar.layout.visibility = "hidden"
        row.update(outcome(g))
        self.runs.append(g)
        self.status.value = (
            f"<span style='color:#2ca02c'>run #{number} done</span> (after an untimed warm-up the first time these "
            f"settings ran): {len(g.token_ids)} tokens, median decode step {g.decode_ms():.1f} ms on "
            f"{html.escape(str(g.label.device))}; cache disposed ({dev.live_tensors - before} tensors left on "
            f"{dev.name})."
        )
        return g

    def _warm_up(self, model: Model, ids: np.ndarray, dev: Device, s: Settings) -> None:
        """One untimed two-token run the first time a setting is used (a fresh WebGPU context compiles its shaders in
        its first steps); skipped when the run would not fit, which the timed run reports."""
        key = (model.name, dev.name, s.mode, s.cache, s.size, len(ids))
        if key in self._warmed or (s.size is not None and positions_needed(len(ids), 2) > s.size):
            return
        self.status.value = "<i>warming up: one untimed run compiles the kernels for these shapes...</i>"
        # WebGPU compiles per shape, so its warm-up feeds the whole prompt; the CPU EP compiles nothing, and a few
        # tokens make its session's first-run costs without paying a long prompt's prefill twice
        prompt = ids if dev.name == "webgpu" else ids[:8]
        with make_cache(s.cache, s.size) as cache:
            generate(model, prompt, cache=cache, device=dev, max_new_tokens=2, stop_on_eos=False)
        self._warmed.add(key)

    def _progress(self, total: int) -> Any:
        """The progress bar shown, empty, for ``total`` tokens; returns the step hook that fills it (a token per
        step but a handoff)."""
        bar = self.progress_bar
        bar.max, bar.value, bar.layout.visibility = total, 0, "visible"

        def advance(record: StepRecord) -> None:
            if record.phase != "handoff":
                bar.value = min(bar.max, bar.value + 1)

        return advance

    def _update_plan(self, change: Any = None) -> None:
        """max_cache_len enabled only for a static cache, the buffer cache mode only on WebGPU; the plan redrawn."""
        self.max_cache_len.disabled = self.max_cache_len_text.disabled = self.cache_type.value != "static"
        self.buffer_cache_mode.disabled = self.device.value != "webgpu"
        self.plan.value = plan_html(self.get_model().info, self.settings())

    def _show_error(self, exc: Exception, row: dict[str, Any] | None = None) -> None:
        self.last_error = exc
        if row and "result" not in row:
            row["result"] = type(exc).__name__
        self.status.value = error_html(exc)

    def _layout(self) -> Any:
        """The controls stacked (max_cache_len's slider with its text box beside it) with the plan and status beside
        them, the Run button and progress bar under them; the browser widget (if any), the chart, the table."""
        import ipywidgets as w

        rows = [w.HBox([c, self.max_cache_len_text]) if c is self.max_cache_len else c for c in self.inputs]
        controls = w.VBox([*rows, w.HBox([self.run_button, self.progress_bar])], layout=w.Layout(min_width="360px"))
        right = w.VBox([self.plan, self.status], layout=w.Layout(flex="1 1 0", min_width="0", padding="0 0 0 12px"))
        browser = [self.browser] if self.browser is not None else []
        top = w.HBox([controls, right], layout=w.Layout(width="100%"))
        widget = w.VBox([top, *browser, self.plot.box, self.table], layout=w.Layout(width="100%", max_width="860px"))
        widget.add_class("kvlab-cachelab")
        return widget
