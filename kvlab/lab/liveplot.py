"""A live chart for notebook dashboards: decode latency and KV memory reserved vs used, growing while a run goes."""

from __future__ import annotations

import time
from typing import Any

from ..core.records import StepRecord
from .style import LOG_TICKS, run_color


class LivePlot:
    """A FigureWidget with two panels (decode latency; KV memory reserved vs used) that grows while a run goes,
    redrawn at most every ``throttle_s`` seconds, keeping the last ``max_runs`` runs. A FigureWidget's updates are
    transient messages, which a view still loading plotly.js (a "Run All") misses for good; so at the end of every
    run the widget is replaced, inside ``box``, by a fresh one holding the complete figure."""

    WIDTH = 840  # px: JupyterLab's output area is about 870 px wide beside the prompt column

    def __init__(self, throttle_s: float = 0.25, max_runs: int = 4):
        import ipywidgets as w
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        base = make_subplots(
            rows=1,
            cols=2,
            horizontal_spacing=0.12,
            subplot_titles=("decode step (ms, log scale)", "KV memory: reserved (solid) vs used (dashed)"),
        )
        self.figure = go.FigureWidget(base)
        self.figure.update_layout(
            height=420,
            width=self.WIDTH,
            template="plotly_white",
            margin={"t": 95, "b": 40, "l": 55, "r": 15},
            legend={"orientation": "h", "y": -0.2, "x": 0},
            title={"text": "<b>CacheLab</b><br><sup>press Run</sup>", "x": 0.01},
        )
        self.figure.update_xaxes(title_text="cache length (tokens)")
        # log: a fresh context's first steps compile shaders and take many times the rest; full tick labels
        self.figure.update_yaxes(type="log", tickvals=LOG_TICKS, row=1, col=1)
        self.figure.update_yaxes(rangemode="tozero", title_text="KiB", row=1, col=2)
        self.box = w.Box([self.figure], layout=w.Layout(width="100%", overflow="hidden"))
        self.throttle_s, self.max_runs = throttle_s, max_runs
        self.redraws = 0
        self.scale, self.units = 1024, "KiB"
        self._records: list[StepRecord] = []  # the live run's steps so far
        self._traces: tuple[Any, Any, Any] | None = None  # its latency, reserved and used lines
        self._last = 0.0
        self._shades: dict[str, int] = {}  # runs drawn so far per cache kind: each gets its own shade
        self.group: Any = None  # what the runs drawn share (``join``)

    def next_color(self, kind: str) -> str:
        """The colour of the next run of cache ``kind``: its kind's next shade."""
        index = self._shades.get(kind, 0)
        self._shades[kind] = index + 1
        return run_color(kind, index)

    def set_units(self, scale: int, units: str) -> None:
        """The memory panel's unit (bytes per unit, its name), the runs already drawn rescaled to it."""
        if (scale, units) == (self.scale, self.units):
            return
        with self.figure.batch_update():
            for trace in self.figure.data:
                if trace.xaxis == "x2" and trace.y is not None:
                    trace.y = [v * self.scale / scale for v in trace.y]
            self.figure.update_yaxes(title_text=units, row=1, col=2)
        self.scale, self.units = scale, units

    def join(self, group: Any) -> None:
        """The next run belongs to ``group`` (e.g. its prompt length); a group other than the drawn runs' clears them
        (and their shades), so that runs of different lengths never share the length axis. Call it before
        ``next_color``."""
        if group != self.group:
            self.figure.data, self._shades, self.group = (), {}, group

    def start(self, name: str, color: str, title: str) -> None:
        """A new run: its three lines (latency; memory reserved, used) named ``name`` in ``color``, empty, and the
        chart's ``title``; the oldest run leaves the chart when ``max_runs`` are drawn."""
        import plotly.graph_objects as go

        with self.figure.batch_update():
            if len(self.figure.data) >= 3 * self.max_runs:
                self.figure.data = self.figure.data[3:]
            for col, suffix, style in (
                (1, "", {"mode": "lines+markers", "line": {"color": color}, "marker": {"size": 4}}),
                (2, ": reserved", {"mode": "lines", "line": {"color": color, "width": 3}, "showlegend": False}),
                (2, ": used", {"mode": "lines", "line": {"color": color, "dash": "dash"}, "showlegend": False}),
            ):
                trace = go.Scatter(x=[], y=[], name=name + suffix, legendgroup=name, **style)
                self.figure.add_trace(trace, row=1, col=col)
            self.figure.layout.title.text = title
        self._traces = tuple(self.figure.data[-3:])  # type: ignore[assignment]
        self._records, self._last = [], 0.0

    def add(self, record: StepRecord) -> None:
        """A step hook: ``record`` joins the live run, drawn now unless the last redraw is under ``throttle_s`` old."""
        self._records.append(record)
        if time.perf_counter() - self._last >= self.throttle_s:
            self.flush()

    def flush(self) -> None:
        """The live run's lines redrawn with every step so far (decode steps only on the latency panel)."""
        if self._traces is None:
            return
        lat, res, used = self._traces
        decode = [r for r in self._records if r.phase == "decode"]
        lengths = [r.position + r.n_tokens for r in self._records]
        with self.figure.batch_update():
            lat.x, lat.y = [r.position + r.n_tokens for r in decode], [r.wall_ms for r in decode]
            res.x, res.y = lengths, [r.live_cache_bytes / self.scale for r in self._records]
            used.x, used.y = lengths, [r.used_cache_bytes / self.scale for r in self._records]
        self.redraws += 1
        self._last = time.perf_counter()

    def finish(self) -> None:
        """The live run drawn in full (one that made no step leaves the chart), and the chart replaced inside ``box``
        by a fresh widget holding the figure."""
        import plotly.graph_objects as go

        self.flush()
        if self._traces is not None and not self._records:
            self.figure.data = self.figure.data[:-3]
        self._traces, self._records = None, []
        old, self.figure = self.figure, go.FigureWidget(self.figure)
        self.box.children = (self.figure,)
        old.close()

    def draw(self, name: str, color: str, title: str, records: Any) -> None:
        """A finished run (its records) drawn as one more run, as if it had just gone live."""
        self.start(name, color, title)
        self._records = list(records)
        self.finish()
