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

The dashboard is made of ``controls`` (the widgets and the settings they hold), ``readouts`` (the plan and status
lines, the table of runs), ``liveplot`` (the chart) and the ``Runner`` here (one timed run and what precedes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.devices import BUFFER_CACHE_MODES, DEVICES
from ..core.errors import CapacityError, ConfigError, DeviceError, KvlabError, check_choice
from ..core.generation import Generation, positions_needed
from ..ort import Device, Model, close_device, generate, load, make_cache, open_device, opened
from ..ort.decode.caches.kinds import CACHE_KINDS
from ..presets import BUILTIN_NAMES
from .controls import Controls, Settings
from .liveplot import LivePlot
from .readouts import Readouts, browser_row, browser_titles, outcome, run_titles, settings_row
from .show import with_plain_text
from .style import unit

# models too big to step through live on a software WebGPU adapter (docs/known-limits.md)
SLOW_ON_SOFTWARE = frozenset({"smollm2"})

LAB_TEXT = (
    "A language model writes one token at a time. For every token it has already seen it keeps a key and a value "
    "vector in each attention layer: the KV cache. A dynamic cache grows by one position each step, which on many "
    "runtimes means a fresh, slightly longer buffer and a copy of everything so far. A static cache reserves "
    "max_cache_len positions once and writes each new token in place. "
)


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
        name = model if isinstance(model, str) else model.name
        first = Settings(name, cache_type, max_cache_len, prompt_tokens, new_tokens, device, buffer_cache_mode)
        self._models: dict[str, Model] = {} if isinstance(model, str) else {model.name: model}
        names = _checked(first, models, self._models)
        self.progress, self.allow_slow = progress, allow_slow
        self.controls = c = Controls(names, first)
        self.model, self.cache_type, self.max_cache_len, self.prompt_tokens = c.inputs[:4]
        self.new_tokens, self.device, self.buffer_cache_mode = c.inputs[4:]
        self.run_button, self.progress_bar = c.run_button, c.progress_bar
        self.readouts = Readouts()
        self.plan, self.status, self.table = self.readouts.plan, self.readouts.status, self.readouts.table
        self.plot = LivePlot(throttle_s, max_runs)
        self.runs: list[Generation] = []
        self.rows: list[dict[str, Any]] = []
        self.last_error: Exception | None = None
        self.running = False
        self._runner = Runner(c, self.plot, self.status)
        for control in c.inputs:
            control.observe(self._update_plan, names="value")
        self.run_button.on_click(lambda _: self.run())
        self.browser = browser
        if browser is not None:
            browser.on_result(self.add_browser_result)
        self.widget = _layout(c, self.readouts, self.plot, browser)
        self.readouts.show_table(self.rows)
        self._update_plan()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        text = "kvlab CacheLab dashboard (live widgets): run this cell to show it. Its controls, chart and table are "
        return with_plain_text(self.widget._repr_mimebundle_(**kwargs), text + "drawn by the running kernel.")

    @property
    def figure(self) -> Any:
        """The live plotly FigureWidget."""
        return self.plot.figure

    @property
    def status_text(self) -> str:
        """The status line as plain text."""
        return self.readouts.status_text

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
        return self.controls.read().needed

    def _update_plan(self, change: Any = None) -> None:
        self.controls.enable()
        self.readouts.show_plan(self.get_model().info, self.controls.read())

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
                self.readouts.show_table(self.rows)
            self.running, self.run_button.disabled = False, False
            self._update_plan()

    def _run(self, row: dict[str, Any]) -> Generation:
        model, s, number = self.get_model(), self.controls.read(), len(self.rows) + 1
        g, dev, before = self._runner.run(model, s, number, row, self.allow_slow, self.progress)
        row.update(outcome(g))
        self.runs.append(g)
        self.readouts.show_done(number, g, dev, before)
        return g

    def add_browser_result(self, result: Any) -> None:
        """The runs a browser sent back (``result.measured``: kvlab Generations) added to the chart and the table,
        each labelled with the browser host and its WebGPU adapter."""
        for g in result.measured:
            name, title = browser_titles(g, len(self.rows) + 1, getattr(result, "host", "browser"))
            self.plot.join(len(g.prompt_ids))
            self.plot.draw(name, self.plot.next_color(g.label.cache.kind), title, g.records)
            self.rows.append(browser_row(g, len(self.rows) + 1))
            self.runs.append(g)
        self.readouts.show_table(self.rows)
        self.readouts.show_added(len(result.measured), getattr(result, "host", "the browser"))

    def _show_error(self, exc: Exception, row: dict[str, Any] | None = None) -> None:
        self.last_error = exc
        if row is not None and row and "result" not in row:
            row["result"] = type(exc).__name__
        self.readouts.show_error(exc)


def _checked(first: Settings, models: Sequence[str] | None, loaded: dict[str, Model]) -> list[str]:
    """The model control's choices (``first.model``, then ``models``), once each, after checking the first values:
    ConfigError for a bad choice, ValueError for a model neither built in nor in ``loaded``."""
    check_choice(first.cache, CACHE_KINDS, "cache_type=")
    check_choice(first.device, DEVICES, "device=")
    check_choice(first.buffer_cache_mode, BUFFER_CACHE_MODES, "buffer_cache_mode=")
    names = list(dict.fromkeys([first.model, *(models or [])]))
    unknown = [n for n in names if n not in BUILTIN_NAMES and n not in loaded]
    if unknown:
        raise ValueError(f"models {unknown} are not valid; choose from {BUILTIN_NAMES}")
    return names


def _layout(controls: Controls, readouts: Readouts, plot: LivePlot, browser: Any) -> Any:
    """The dashboard: the controls with the plan and status beside them, the browser widget (if any), the live
    chart and the table of runs."""
    import ipywidgets as w

    right = w.VBox([readouts.plan, readouts.status], layout=w.Layout(flex="1 1 0", min_width="0", padding="0 0 0 12px"))
    parts = [
        w.HBox([controls.box(), right], layout=w.Layout(width="100%")),
        *([browser] if browser is not None else []),
    ]
    widget = w.VBox([*parts, plot.box, readouts.table], layout=w.Layout(width="100%", max_width="860px"))
    widget.add_class("kvlab-cachelab")
    return widget


class Runner:
    """The dashboard's timed runs, each on a fresh cache disposed at its end, drawn live on ``plot``. Before one:
    the device opened (WebGPU in the chosen buffer cache mode), a model too slow for a software adapter refused,
    the first run of a setting warmed up untimed (said in ``status``)."""

    def __init__(self, controls: Controls, plot: LivePlot, status: Any):
        self.controls, self.plot, self.status = controls, plot, status
        self.warmed: set[tuple[Any, ...]] = set()  # settings already warmed up (see warm_up)

    def run(
        self, model: Model, s: Settings, number: int, row: dict[str, Any], allow_slow: bool, progress: bool
    ) -> tuple[Generation, Device, int]:
        """Run ``number`` of ``model`` with settings ``s``: (its generation, the device, the device's live tensors
        before it). ``row`` gets the run's settings first, and what was allocated if it runs out of room;
        ``progress``: show the progress bar while it runs."""
        ids = model.tokens_of(LAB_TEXT, s.prompt_tokens)
        row.update(settings_row(number, model.name, s.device, s.mode, s.cache, s.max_cache_len, len(ids), s.new_tokens))
        dev = open_webgpu(s.mode) if s.device == "webgpu" else open_device("cpu")
        refuse_slow(model, dev, allow_slow)
        cache = make_cache(s.cache, s.size)
        before = dev.live_tensors
        label, title = run_titles(model, dev, s, number, len(ids))
        warm_up(model, ids, dev, s, self.warmed, self.status)
        scale, units = unit(max(s.needed, s.size or 0) * model.info.bytes_per_token)  # the largest reservation
        self.plot.set_units(*((scale, units) if units == "MiB" else (1024, "KiB")))
        self.plot.join(len(ids))  # the chart compares runs of one prompt length: one length axis
        self.plot.start(label, self.plot.next_color(s.cache), title)
        hooks = [self.plot.add, *([self.controls.progress(s.new_tokens)] if progress else [])]
        try:
            with cache:
                g = timed_run(model, ids, cache, dev, s.new_tokens, hooks, row, before)
        finally:
            self.plot.finish()
            self.controls.hide_progress()
        return g, dev, before


def refuse_slow(model: Model, dev: Device, allow_slow: bool) -> None:
    """ConfigError for a model too big for a software WebGPU adapter (``SLOW_ON_SOFTWARE``) unless ``allow_slow``."""
    if dev.name == "webgpu" and dev.adapter.kind == "software" and model.name in SLOW_ON_SOFTWARE and not allow_slow:
        raise ConfigError(
            f"model {model.name} on a software WebGPU adapter ({dev.adapter.name}) decodes too slowly to watch; "
            "choose device 'cpu' or the toy model here "
            "(CacheLab(..., allow_slow=True) to run it anyway)"
        )


def warm_up(model: Model, ids: np.ndarray, dev: Device, s: Settings, warmed: set[tuple[Any, ...]], status: Any) -> None:
    """One untimed two-token run the first time a setting is used (``warmed``: the settings done, updated): a fresh
    WebGPU context compiles its shaders in its first steps, which would make the first timed run look slower than
    the next. Says so in ``status`` while it runs. Skipped when the run would not fit: the timed run reports that."""
    key = (model.name, dev.name, s.mode, s.cache, s.size, len(ids))
    if key in warmed or (s.size is not None and positions_needed(len(ids), 2) > s.size):
        return
    status.value = "<i>warming up: one untimed run compiles the kernels for these shapes...</i>"
    # WebGPU compiles per shape, so its warm-up feeds the whole prompt; the CPU EP compiles nothing, and a few
    # tokens make its session's first-run costs without paying a long prompt's prefill twice
    prompt = ids if dev.name == "webgpu" else ids[:8]
    with make_cache(s.cache, s.size) as cache:
        generate(model, prompt, cache=cache, device=dev, max_new_tokens=2, stop_on_eos=False)
    warmed.add(key)


def timed_run(
    model: Model, ids: np.ndarray, cache: Any, dev: Device, new: int, hooks: list[Any], row: dict[str, Any], before: int
) -> Generation:
    """The timed generation of ``new`` tokens. A CapacityError is raised again saying what was allocated: whether
    the cache holds buffers and the tensors added on ``dev`` since ``before`` (also put in ``row``)."""
    try:
        return generate(model, ids, cache=cache, device=dev, max_new_tokens=new, stop_on_eos=False, on_step=hooks)
    except CapacityError as exc:
        held = bool(getattr(cache, "allocated", False))
        added = dev.live_tensors - before
        row.update({"result": "CapacityError", "new buffers": added})
        raise CapacityError(
            f"{exc}. Nothing was allocated: the cache holds "
            f"{'buffers' if held else 'no buffers'} and {added} tensors were added on "
            f"{dev.name}."
        ) from exc
