"""Plotly figures of kvlab's per-step records (``kvlab.Generation``s, ``Run``s or labelled DataFrames) and of the
buffers a ``BufferWatch`` saw; they read records and labels, never run a model. Every figure says what produced its
numbers (model, dtype, device and adapter, runtime, cache, context): in the title when all runs share it, in the
legend otherwise; recorded results are marked "recorded", with their environment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..core.generation import first_divergence
from .runs import Run, as_runs, common_and_labels, kv_bytes_per_tensor_token
from .style import add_bucket_lines, cache_colors, finish, go, title, unit


def _recorded_note(runs: Sequence[Run]) -> str:
    notes = sorted({r.recorded for r in runs if r.recorded})
    return ("recorded: " + "; ".join(notes)) if notes else ""


def lines(runs: Sequence[Run], labels: Sequence[str], phases: Sequence[str] | None = None) -> Iterator[tuple]:
    """Per run: (run, its records (of ``phases``), cache length after each step, legend name, colour)."""
    for r, name, color in zip(runs, labels, cache_colors(r.label.cache for r in runs)):
        f = r.frame if phases is None else r.frame[r.frame["phase"].isin(phases)]
        yield r, f, f["position"] + f["n_tokens"], name, color


def _scaled(runs: Any, top: Callable[[Any], float]) -> tuple[list[Run], str, list[str], float, str]:
    """The runs, their shared title and legend labels, and the byte unit that fits ``top`` of every run's frame."""
    runs = as_runs(runs)
    common, labels = common_and_labels(runs)
    scale, units = unit(max((float(top(r.frame)) for r in runs if not r.frame.empty), default=0.0))
    return runs, common, labels, scale, units


def bucket_note(fig: Any, runs: Sequence[Run], xmax: float, bytes_per_tensor_token: float | None) -> str:
    """``style.add_bucket_lines`` for ``runs``: at ``bytes_per_tensor_token``, else what their records say."""
    bpt = bytes_per_tensor_token or next((b for b in map(kv_bytes_per_tensor_token, runs) if b), None)
    return add_bucket_lines(fig, bpt, xmax)


def latency(runs: Any) -> Any:
    """Decode step wall time vs cache length, one line per run; where any run is on WebGPU (the CPU EP has no bucket
    pool), dotted lines where a KV tensor reaches a bucket size of the WebGPU buffer pool."""
    runs = as_runs(runs)
    common, labels = common_and_labels(runs)
    fig = go().Figure()
    xmax = 0
    for r, f, x, name, color in lines(runs, labels, ("decode",)):
        xmax = max(xmax, int(x.max()) if len(x) else 0)
        fig.add_trace(
            go().Scatter(
                x=x,
                y=f["wall_ms"],
                name=name,
                mode="lines+markers",
                marker={"size": 4, "color": color},
                line={"dash": "dot" if r.recorded else "solid", "color": color},
                customdata=np.stack([f["step"], f["phase"], f["cache_tensors_allocated"], f["new_buffers"]], axis=-1),
                hovertemplate=(
                    "cache length %{x}<br>%{y:.1f} ms<br>step %{customdata[0]} (%{customdata[1]})<br>"
                    "KV tensors allocated %{customdata[2]}, new buffers %{customdata[3]}<extra>%{fullData.name}"
                    "</extra>"
                ),
            )
        )
    note = _recorded_note(runs)
    if any(r.label.device.name == "webgpu" for r in runs):
        note = "<br>".join(n for n in (note, bucket_note(fig, runs, xmax, None)) if n)
    t = title("decode step latency (wall_ms)", common, note)
    xaxis_title = "cache length after the step (tokens)"
    return finish(fig, t, xaxis_title=xaxis_title, yaxis_title="wall_ms (ms)", yaxis_rangemode="tozero")


def allocations(runs: Any) -> Any:
    """Three panels vs cache length: KV tensors allocated per step, bytes allocated per step, cumulative bytes."""
    from plotly.subplots import make_subplots

    runs, common, labels, scale, units = _scaled(runs, lambda f: f["cache_bytes_allocated"].sum())
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=(
            "KV tensors allocated in the step",
            f"KV {units} allocated in the step",
            f"cumulative KV {units} allocated",
        ),
    )
    for r, f, x, name, color in lines(runs, labels):
        kw = {"legendgroup": name, "line": {"color": color, "dash": "dot" if r.recorded else "solid"}}
        panels = (
            f["cache_tensors_allocated"],
            f["cache_bytes_allocated"] / scale,
            f["cache_bytes_allocated"].cumsum() / scale,
        )
        for row, y in enumerate(panels, start=1):
            mode = "lines" if row == 3 else "lines+markers"
            trace = go().Scatter(
                x=x, y=y, name=name, mode=mode, showlegend=row == 1, marker={"size": 4, "color": color}, **kw
            )
            fig.add_trace(trace, row=row, col=1)
    fig.update_xaxes(title_text="cache length after the step (tokens)", row=3, col=1)
    fig.update_yaxes(tickformat="d", rangemode="tozero", row=1, col=1)  # counts: no decimals
    t = title("KV cache allocations per step", common, _recorded_note(runs))
    finish(fig, t, legend_y=-0.1, top_extra=20, height=660)
    return fig


def memory(runs: Any) -> Any:
    """KV memory reserved (live cache tensors) vs used (tokens held x bytes per token) vs cache length."""
    runs, common, labels, scale, units = _scaled(runs, lambda f: f["live_cache_bytes"].max())
    fig = go().Figure()
    for _, f, x, name, color in lines(runs, labels):
        for column, what, line in (
            ("live_cache_bytes", "reserved", {"width": 3}),
            ("used_cache_bytes", "used", {"dash": "dash"}),
        ):
            y = f[column] / scale
            fig.add_scatter(
                x=x, y=y, name=f"{name}: {what}", mode="lines", line={"color": color, **line}, legendgroup=name
            )
    t = title("KV memory: reserved vs used", common, _recorded_note(runs))
    finish(fig, t, xaxis_title="cache length after the step (tokens)", yaxis_title=units, yaxis_rangemode="tozero")
    return fig


def conformance(result: Any) -> Any:
    """Per-position max |logit difference| of a ``kvlab.ort.checks.conformance.Conformance``; argmax changes in red."""
    f = result.frame()
    ok, bad = f[f["argmax_equal"]], f[~f["argmax_equal"]]
    fig = go().Figure()
    fig.add_trace(go().Bar(x=ok["position"], y=ok["max_abs_diff"], name="same argmax", marker_color="#1f77b4"))
    fig.add_trace(go().Bar(x=bad["position"], y=bad["max_abs_diff"], name="argmax differs", marker_color="#d62728"))
    fig.add_hline(
        y=result.atol,
        line={"dash": "dot", "color": "#888"},
        annotation_text=f"atol {result.atol:g}",
        annotation_position="bottom right",
    )
    first = result.first_divergence
    note = "all positions agree" if first is None else f"first divergence at position {first}"
    t = title(
        f"{result.mode} logits, position by position: is {result.device.name} the same as {result.reference.name}?",
        f"model {result.model} \u00b7 {result.device} vs {result.reference}",
        note,
    )
    finish(fig, t, xaxis_title="position", yaxis_title="max |logit difference|", yaxis_type="log", barmode="overlay")
    return fig


def token_diff(a: Sequence[int], b: Sequence[int], names: tuple[str, str] = ("a", "b"), decode: Any = None) -> Any:
    """Token-by-token comparison as a styled table; the first divergence is highlighted in red."""
    import pandas as pd

    n = max(len(a), len(b))
    col = lambda seq: [int(seq[i]) if i < len(seq) else None for i in range(n)]  # noqa: E731
    df = pd.DataFrame({f"{names[0]} id": col(a), f"{names[1]} id": col(b)})
    if decode is not None:
        df.insert(1, f"{names[0]} text", [repr(decode([t])) if t is not None else "" for t in col(a)])
        df[f"{names[1]} text"] = [repr(decode([t])) if t is not None else "" for t in col(b)]
    df["same"] = [x == y for x, y in zip(col(a), col(b))]
    first = first_divergence(a, b)

    def paint(row: Any) -> list[str]:
        if first is not None and row.name == first:
            return ["background-color: #f8c9c9; font-weight: bold"] * len(row)
        if not row["same"]:
            return ["background-color: #fdeaea"] * len(row)
        return [""] * len(row)

    caption = "identical" if first is None else f"first divergence at generated token {first}"
    return df.style.apply(paint, axis=1).set_caption(f"{names[0]} vs {names[1]}: {caption}")


STATE_COLORS = {"in place": "#c7e9c0", "recycled": "#9ecae1", "fresh": "#e6550d"}


def buffer_map(watches: Sequence[Any], common: str = "") -> Any:
    """The buffers drawn: per watched cache (``kvlab.lab.buffers.BufferWatch``), a map of its KV tensors (rows)
    after every step (columns: cache length), each cell the buffer's state (in place / recycled from the pool /
    fresh); below, the fresh buffers per step and each step's wall time, so the two can be read together."""
    from plotly.subplots import make_subplots

    from .buffers import STATES

    n = len(watches)
    titles = [f"{w.name}: the buffer of each KV tensor after each step" for w in watches]
    fig = make_subplots(
        rows=n + 2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        row_heights=[1.0] * n + [0.6, 0.6],
        subplot_titles=(*titles, "fresh buffers per step (a handle never held before)", "wall time per step (ms)"),
    )
    code = {s: i for i, s in enumerate(STATES)}
    scale = [[i / (len(STATES) - 1), STATE_COLORS[s]] for i, s in enumerate(STATES)]
    for row, (w, color) in enumerate(zip(watches, cache_colors(w.cache.spec for w in watches)), start=1):
        z = np.array([[code[s] for s in states] for states in w.states]).T  # [tensor, step]
        heatmap = go().Heatmap(
            x=w.lengths, y=list(range(z.shape[0])), z=z, zmin=0, zmax=len(STATES) - 1, colorscale=scale,
            showscale=False, xgap=1, ygap=1, customdata=np.array(w.states).T,
            hovertemplate=f"length %{{x}}, KV tensor %{{y}}: %{{customdata}}<extra>{w.name}</extra>",
        )  # fmt: skip
        fig.add_trace(heatmap, row=row, col=1)
        fig.update_yaxes(title_text="KV tensor", autorange="reversed", row=row, col=1)
        kw = {"x": w.lengths, "name": w.name, "legendgroup": w.name}
        fig.add_trace(go().Bar(y=w.counts("fresh"), marker_color=color, **kw), row=n + 1, col=1)
        line = go().Scatter(y=w.wall_ms, mode="lines+markers", showlegend=False, line={"color": color}, **kw)
        fig.add_trace(line, row=n + 2, col=1)
    for state in STATES:  # a legend for the map's colours
        fig.add_trace(
            go().Bar(x=[None], y=[None], name=f"buffer {state}", marker_color=STATE_COLORS[state]), row=1, col=1
        )
    fig.update_yaxes(tickformat="d", rangemode="tozero", row=n + 1, col=1)
    fig.update_yaxes(rangemode="tozero", row=n + 2, col=1)
    fig.update_xaxes(title_text="cache length after the step (tokens)", row=n + 2, col=1)
    t = title(
        "GPU buffer churn, drawn",
        common,
        "fresh = a buffer handle this run never held before (a proxy for "
        "CreateBuffer: a lower bound if Dawn reuses an address)",
    )
    return finish(fig, t, legend_y=-0.08, top_extra=20, height=260 * n + 420, barmode="group")


def op_share_bars(share: Any, what: str, common: str, note: str = "") -> Any:
    """One horizontal bar per profile, split by part, of ``share`` (``kvlab.lab.tables.op_shares``: columns profile,
    part, share), each segment labelled with its percentage, 'other ops' last; the title says ``what``, ``common``
    (what produced every profile) and ``note``."""
    import plotly.express as px

    parts = [p for p in dict.fromkeys(share["part"]) if p != "other ops"] + ["other ops"]
    fig = px.bar(share, x="share", y="profile", color="part", orientation="h", height=340,
                 category_orders={"part": parts}, text=share["share"].map("{:.0%}".format))  # fmt: skip
    fig.update_traces(textangle=0)
    fig.update_xaxes(tickformat=".0%", title="share of the step")
    return finish(fig, title(what, common, note), legend_y=-0.35)
