"""Recorded ``kvlab bench`` sweeps drawn: the median decode step against the context, one line per cache, live runs
beside the recorded lines (``sweep``), and a bench result on its own (``bench_figure``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.errors import check_choice
from ..plots import bucket_note
from ..runs import Run, as_runs, common_and_labels
from ..style import (
    KIND_COLORS,
    MODE_DASHES,
    MiB,
    add_bucket_lines,
    finish,
    go,
    kind_colors,
    title,
)
from .rows import error_bars, recorded_environment, rows_of, series_key, series_lines, series_name, where_measured

Line = tuple[str, str, list[dict[str, Any]]]  # a recorded line: (name, buffer cache mode, rows by context)


def sweep(
    runs: Any = (),
    *,
    y: str = "wall_ms",
    buckets: bool | None = None,
    bytes_per_tensor_token: float | None = None,
    recorded: dict[str, Any] | None = None,
    recorded_model: str | None = None,
    recorded_device: str | None = None,
    series: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    group: str = "cache",
    live_note: str = "",
) -> Any:
    """Median decode-step latency of each run vs its context, one line per cache (and device, when they differ),
    for short runs at several contexts; with ``recorded`` (a ``kvlab bench`` result, its JSON loaded) drawn as
    dotted lines labelled "recorded" for ``recorded_model``/``recorded_device`` (default: those of the live
    runs), with its environment in the subtitle. ``series`` keeps only the recorded lines of those names
    (``series_name``: "dynamic", "static@fit", "genai", ...), ``modes`` only those buffer cache modes. ``group``:
    "cache" draws one line per cache spec (static@512 and static@4096 apart), "kind" one per cache kind (a
    static cache sized to each context is one line). ``live_note``: a line under the title about the live points
    (e.g. how noisy they can be). Bucket lines as in ``plots.latency``."""
    check_choice(group, ("cache", "kind"), "group=")
    runs = as_runs(list(runs))
    common, _ = common_and_labels(runs, context=False)
    groups = _live_points(runs, y, group)
    rows = [] if recorded is None else _recorded_rows(recorded, runs, recorded_model, recorded_device, series, modes)
    lines = series_lines(rows)
    fig = go().Figure()
    colors = _line_colors(groups, lines, group)
    xmax = max([0, _draw_live(fig, groups, colors), _draw_recorded(fig, lines, colors[len(groups) :])])
    notes = [n for n in {r.recorded for r in runs if r.recorded}] + ([live_note] if live_note else [])
    if rows:
        r0 = rows[0]
        notes.append(f"dotted: RECORDED, not live: {where_measured(r0)}<br>measured {recorded_environment(recorded)}")
        if not runs:
            common = (
                f"kvlab bench results, {r0.get('new_tokens', '?')} new tokens per run, median over paired "
                "runs (bars: min-max)"
            )
        if bytes_per_tensor_token is None and r0.get("kv_tensor_mib") and r0.get("context"):
            bytes_per_tensor_token = r0["kv_tensor_mib"] * MiB / r0["context"]
    if buckets is None:
        buckets = any(r.label.device.name == "webgpu" for r in runs) or any(r["device"] == "webgpu" for r in rows)
    if buckets and (runs or bytes_per_tensor_token):
        notes.append(bucket_note(fig, runs, xmax, bytes_per_tensor_token))
    t = title(f"median decode step ({y}) vs context", common, "<br>".join(n for n in notes if n))
    finish(
        fig,
        t,
        xaxis_title="context when decoding starts (tokens)",
        yaxis_title=f"median {y} (ms)",
        yaxis_rangemode="tozero",
        xaxis_rangemode="tozero",
    )
    return fig


def _live_points(runs: Sequence[Run], y: str, group: str) -> dict[str, list[tuple[int, float, Run]]]:
    """Legend name -> (context, median decode ``y``, run) per live run with decode steps, grouped by cache spec or
    kind (``group``), and by device when the runs' devices differ."""
    groups: dict[str, list[tuple[int, float, Run]]] = {}
    for r in runs:
        dec = r.frame[r.frame["phase"] == "decode"]
        if dec.empty:
            continue
        what = str(r.label.cache) if group == "cache" else r.label.cache.kind
        key = r.name or (what + (" (recorded)" if r.recorded else " (live)"))
        if len({x.label.device for x in runs}) > 1:
            key += f" \u00b7 {r.label.device}"
        groups.setdefault(key, []).append((int(dec["position"].iloc[0]), float(dec[y].median()), r))
    return groups


def _recorded_rows(
    recorded: dict[str, Any],
    runs: Sequence[Run],
    model: str | None,
    device: str | None,
    series: Sequence[str] | None,
    modes: Sequence[str] | None,
) -> list[dict[str, Any]]:
    """The recorded rows ``sweep`` draws: those of ``model`` on ``device`` (default: the first live run's), kept to
    the ``series`` names and buffer cache ``modes`` asked for. ValueError when the result has none for them."""
    model = model or (runs[0].label.model if runs else None)
    device = device or (runs[0].label.device.name if runs else None)
    rows = rows_of(recorded, model, device)
    if not rows:
        raise ValueError(f"the recorded results have no rows for model {model!r} on device {device!r}")
    return [
        r
        for r in rows
        if (series is None or series_name(r) in series) and (modes is None or r.get("buffer_cache_mode", "") in modes)
    ]


def _line_colors(groups: dict[str, list[tuple[int, float, Run]]], lines: Sequence[Line], group: str) -> list[str]:
    """One colour per live group, then per recorded line. By kind: the kind's own colour for the live line and
    for the first recorded line of that kind; by cache: one shade per cache kind and size."""
    firsts = [points[0][2].label.cache for points in groups.values()]
    if group == "kind":
        return [KIND_COLORS.get(c.kind, "#444") for c in firsts] + kind_colors(series_key(s[2][0]) for s in lines)
    return kind_colors([(c.kind, (c.max_cache_len, c.variant)) for c in firsts] + [series_key(s[2][0]) for s in lines])


def _draw_live(fig: Any, groups: dict[str, list[tuple[int, float, Run]]], colors: Sequence[str]) -> int:
    """The live lines (solid, diamonds), each sorted by context; returns the largest context drawn (0: none)."""
    xmax = 0
    for (name, points), color in zip(groups.items(), colors):
        points.sort(key=lambda p: p[0])
        xmax = max(xmax, points[-1][0])
        fig.add_trace(
            go().Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                name=name,
                mode="lines+markers",
                line={"color": color, "dash": "solid"},
                marker={"size": 11, "color": color, "symbol": "diamond", "line": {"width": 1, "color": "#333"}},
                hovertemplate="context %{x}<br>median %{y:.1f} ms<extra>%{fullData.name}</extra>",
            )
        )
    return xmax


def _draw_recorded(fig: Any, lines: Sequence[Line], colors: Sequence[str]) -> int:
    """The recorded lines (dotted or their buffer cache mode's dash, squares, min-max bars); returns the largest
    context drawn (0: none)."""
    xmax = 0
    for (name, mode, pts), color in zip(lines, colors):
        fig.add_trace(
            go().Scatter(
                x=[r["context"] for r in pts],
                y=[r["decode_ms"] for r in pts],
                mode="lines+markers",
                name=f"{name}{' ' + mode if mode else ''} (recorded)",
                line={"dash": "dot" if mode in ("", "bucket") else MODE_DASHES[mode], "color": color},
                marker={"symbol": "square", "size": 7, "color": color},
                error_y=error_bars(pts),
                hovertemplate="context %{x}<br>median %{y:.1f} ms (recorded)<extra>%{fullData.name}</extra>",
            )
        )
        xmax = max(xmax, pts[-1]["context"])
    return xmax


def bench_figure(result: dict[str, Any], model: str, device: str) -> Any:
    """Decode ms per step vs context for each variant of a bench result (median, min-max bars), with the bucket
    boundaries the per-tensor KV size crosses on WebGPU; labelled with runtime, adapter, model, dtype, machine."""
    rows = rows_of(result, model, device)
    env = result["environment"]
    contexts = sorted({r["context"] for r in rows})
    series = series_lines(rows)
    fig = go().Figure()
    for (name, mode, pts), color in zip(series, kind_colors(series_key(s[2][0]) for s in series)):
        label = name.replace("@fit", "@fit (context + new tokens)") + (f" ({mode})" if mode else "")
        if len(contexts) == 1:  # one context: a bar per variant reads better than points stacked on one x
            fig.add_bar(
                x=[label], y=[r["decode_ms"] for r in pts], name=label, error_y=error_bars(pts), marker_color=color
            )
        else:
            fig.add_scatter(
                x=[r["context"] for r in pts],
                y=[r["decode_ms"] for r in pts],
                mode="lines+markers",
                name=label,
                error_y=error_bars(pts),
                line={"color": color, "dash": MODE_DASHES[mode]},
            )
    r0 = rows[0]
    if device == "webgpu" and len(contexts) > 1:
        add_bucket_lines(fig, r0["kv_tensor_mib"] * MiB / r0["context"], max(contexts))
    ep = {"cpu": "CPU EP", "webgpu": "WebGPU EP"}.get(device, device)
    fig.update_layout(
        title=(
            f"{model} ({r0['dtype']}) decode step vs context: {device} on {r0['adapter']}<br>"
            f"<sup>{ep} of {env['backend_package']} {env['backend_version']}, {r0['new_tokens']} new tokens, median of "
            f"{r0['reps']} paired runs (bars: min-max); {env['cpu']}; {env['date']}</sup>"
        ),
        xaxis_title="context (tokens already in the cache)",
        yaxis_title="ms per decode step",
        template="plotly_white",
        legend_title="cache",
    )
    if len(contexts) == 1:
        fig.update_layout(xaxis_title=f"cache, at a context of {contexts[0]} tokens", showlegend=False)
    else:
        fig.update_xaxes(
            tickvals=contexts, tickformat="d", tickangle=-45 if len(contexts) > 6 else 0
        )  # ticks where measured
    return fig
