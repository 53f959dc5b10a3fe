"""What a static cache buys, recorded and live: the dynamic cache's decode step over the static cache's against the
context, one line per machine (``gain_rows``, ``static_gain``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..runs import as_runs
from ..style import RATIO_TICKS, finish, go, title
from .rows import rows_of


def gain_rows(
    result: dict[str, Any],
    model: str | None = None,
    device: str | None = None,
    precision: str | None = None,
    mode: str | None = "bucket",
) -> list[tuple[int, float]]:
    """(context, dynamic / static decode step) per context of a recorded bench result: kvlab's dynamic cache
    against its static cache sized to fit that context (the host-side token, no variant), in buffer cache ``mode``
    where the rows have one (``None``: any)."""
    by: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows_of(result, model, device):
        if r["runner"] != "kvlab" or r.get("cache_variant") or r.get("token_on_device"):
            continue
        if precision is not None and r.get("precision") != precision:
            continue
        if mode is not None and r.get("buffer_cache_mode") not in ("", None, mode):
            continue
        if r["cache_kind"] == "static" and not r["fitted"]:
            continue
        by[(r["context"], r["cache_kind"])] = r
    contexts = sorted({c for c, _ in by})
    return [
        (c, by[(c, "dynamic")]["decode_ms"] / by[(c, "static")]["decode_ms"])
        for c in contexts
        if (c, "dynamic") in by and (c, "static") in by
    ]


GAIN_COLORS = ("#7f7f7f", "#9467bd", "#8c564b", "#bcbd22")  # recorded machines
LIVE_COLORS = ("#d62728", "#ff7f0e", "#e377c2")  # this machine, this browser


def static_gain(
    curves: Sequence[tuple[str, dict[str, Any], dict[str, Any]]] = (),
    live: Sequence[tuple[str, Sequence[tuple[Any, Any]]]] = (),
    note: str = "",
) -> Any:
    """What a static cache buys on each machine: the dynamic cache's decode step over the static cache's, against
    the context, on log axes (1x: no gain). ``curves``: (name, recorded bench result, ``gain_rows`` filters) per
    recorded line; ``live``: (name, [(dynamic run, static run), ...]) per live line, one point per pair at the
    dynamic run's context: its median decode step over the static run's (one unpaired run each, so noisier than
    the recorded lines, which are paired medians). ``note``: a line under the title."""
    fig = go().Figure()
    contexts: set[int] = set()
    for (name, result, filters), color in zip(curves, GAIN_COLORS * 4):
        pts = gain_rows(result, **filters)
        contexts.update(c for c, _ in pts)
        fig.add_scatter(
            x=[c for c, _ in pts],
            y=[g for _, g in pts],
            mode="lines+markers",
            name=f"{name} (recorded)",
            line={"color": color, "dash": "dot", "width": 2},
            marker={"symbol": "square", "size": 7, "color": color},
            hovertemplate="context %{x}<br>dynamic / static %{y:.2f}x<extra>%{fullData.name}</extra>",
        )
    for (name, pairs), color in zip(live, LIVE_COLORS * 4):
        points = [_live_gain(dynamic, static) for dynamic, static in pairs]
        if not points:
            continue
        xs, ys = [x for x, _ in points], [y for _, y in points]
        contexts.update(xs)
        fig.add_scatter(
            x=xs,
            y=ys,
            mode="lines+markers+text",
            name=f"{name} (live)",
            text=[f"{y:.1f}x" for y in ys],
            textposition="middle right",
            line={"color": color, "width": 2},
            marker={"symbol": "diamond", "size": 13, "color": color, "line": {"width": 1, "color": "#333"}},
            hovertemplate="context %{x}<br>dynamic / static %{y:.2f}x<extra>%{fullData.name}</extra>",
        )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    t = title(
        "What a static cache buys: the dynamic cache's decode step over the static cache's",
        "recorded: kvlab bench, paired medians; live: this notebook's runs, not paired (see the note)",
        note,
    )
    lo, hi = (min(contexts), max(contexts)) if contexts else (256, 16384)
    ticks = [2**k for k in range(6, 16) if lo / 1.5 <= 2**k <= hi * 1.5]
    fig.update_xaxes(
        type="log", title_text="context when decoding starts (tokens, log scale)", tickvals=ticks, tickformat=",d"
    )
    fig.update_yaxes(
        type="log",
        tickvals=RATIO_TICKS,
        ticktext=[f"{v:g}x" for v in RATIO_TICKS],
        title_text="dynamic / static (log scale; 1x: no gain)",
    )
    finish(fig, t, legend_y=-0.22, height=500)
    return fig


def _live_gain(dynamic: Any, static: Any) -> tuple[int, float]:
    """(context, dynamic / static median decode step) of one pair of live runs, at the dynamic run's context."""
    d, s = as_runs([dynamic, static])
    dec = d.frame[d.frame["phase"] == "decode"]
    return int(dec["position"].iloc[0]), float(dec["wall_ms"].median()) / float(
        s.frame.query("phase == 'decode'")["wall_ms"].median()
    )
