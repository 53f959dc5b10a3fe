"""Recorded ``kvlab bench`` results drawn beside live runs: median decode step vs context, one line per cache, with
the environment they were measured in. A bench row names its cache as fields (``runner``, ``cache_kind``,
``max_cache_len``, ``fitted``: sized to its own context, ``cache_variant``), so one line can follow a static cache
sized to fit every context."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError, check_choice
from .plots import bucket_note
from .runs import Run, as_runs, common_and_labels
from .style import (
    KIND_COLORS,
    MODE_DASHES,
    RATIO_TICKS,
    MiB,
    add_bucket_lines,
    go,
    kind_colors,
    legend_below,
    title,
    top_margin,
)


def data_dir() -> Path:
    """The checkout's ``data/`` folder, where recorded results live: found from the working directory up, else
    beside kvlab's own source (an editable install), so a notebook run from a copy elsewhere still finds it."""
    here = Path.cwd()
    source = Path(__file__).resolve().parents[2]
    for root in (here, *here.parents, source):
        if (root / "data" / "gpu").is_dir():
            return root / "data"
    raise ConfigError(
        f"no data/ folder with recorded results (data/gpu/) in {here}, its parents or {source}: run "
        "this from a kvlab checkout"
    )


def recorded_environment(result: dict[str, Any]) -> str:
    """One line naming where recorded benchmark results were measured."""
    env = result.get("environment", {})
    return (
        f"{env.get('date', 'undated')}, {env.get('cpu', 'unknown CPU')}, {env.get('backend_package', '?')} "
        f"{env.get('backend_version', '?')}, commit {env.get('commit', '?')}"
    )


def series_key(row: dict[str, Any]) -> tuple[str, Any]:
    """(kind, size) of a bench row: what its colour and its line follow ("fit" for a static cache sized to fit)."""
    if row["runner"] != "kvlab":
        return row["runner"], None
    return row["cache_kind"], ("fit" if row["fitted"] else row["max_cache_len"], row.get("cache_variant", ""))


def series_name(row: dict[str, Any]) -> str:
    """A bench row's line name: "dynamic", "static@4160", "static@fit", "static@fit 4KiB-pages", "genai", ..."""
    kind, size = series_key(row)
    if size is None:
        return kind
    length, variant = size
    return f"{kind}{'@' + str(length) if length is not None else ''}" + (f" {variant}" if variant else "")


def rows_of(result: dict[str, Any], model: str | None, device: str | None) -> list[dict[str, Any]]:
    return [
        r
        for r in result.get("rows", [])
        if (model is None or r["model"] == model) and (device is None or r["device"] == device)
    ]


def _where(row: dict[str, Any]) -> str:
    mode = f", buffer cache {row['buffer_cache_mode']}" if row.get("buffer_cache_mode") else ""
    return f"{row['model']} ({row['dtype']}) on {row['device']} [{row['adapter']}]{mode}"


def _error_bars(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "data",
        "symmetric": False,
        "array": [r["decode_ms_max"] - r["decode_ms"] for r in rows],
        "arrayminus": [r["decode_ms"] - r["decode_ms_min"] for r in rows],
    }


def _series(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(line name, buffer cache mode, rows by context) per line of a bench result."""
    keys = sorted({(series_name(r), r.get("buffer_cache_mode", "")) for r in rows})
    return [
        (
            name,
            mode,
            sorted(
                (r for r in rows if (series_name(r), r.get("buffer_cache_mode", "")) == (name, mode)),
                key=lambda r: r["context"],
            ),
        )
        for name, mode in keys
    ]


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
    rows = []
    if recorded is not None:
        model = recorded_model or (runs[0].label.model if runs else None)
        device = recorded_device or (runs[0].label.device.name if runs else None)
        rows = rows_of(recorded, model, device)
        if not rows:
            raise ValueError(f"the recorded results have no rows for model {model!r} on device {device!r}")
        rows = [
            r
            for r in rows
            if (series is None or series_name(r) in series)
            and (modes is None or r.get("buffer_cache_mode", "") in modes)
        ]
    lines = _series(rows)
    if group == "kind":  # the kind's own colour for the live line and for the first recorded line of that kind
        colors = [KIND_COLORS.get(p[0][2].label.cache.kind, "#444") for p in groups.values()]
        colors += kind_colors(series_key(s[2][0]) for s in lines)
    else:
        colors = kind_colors(
            [
                (p[0][2].label.cache.kind, (p[0][2].label.cache.max_cache_len, p[0][2].label.cache.variant))
                for p in groups.values()
            ]
            + [series_key(s[2][0]) for s in lines]
        )
    fig = go().Figure()
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
    for (name, mode, pts), color in zip(lines, colors[len(groups) :]):
        fig.add_trace(
            go().Scatter(
                x=[r["context"] for r in pts],
                y=[r["decode_ms"] for r in pts],
                mode="lines+markers",
                name=f"{name}{' ' + mode if mode else ''} (recorded)",
                line={"dash": "dot" if mode in ("", "bucket") else MODE_DASHES[mode], "color": color},
                marker={"symbol": "square", "size": 7, "color": color},
                error_y=_error_bars(pts),
                hovertemplate="context %{x}<br>median %{y:.1f} ms (recorded)<extra>%{fullData.name}</extra>",
            )
        )
        xmax = max(xmax, pts[-1]["context"])
    notes = [n for n in {r.recorded for r in runs if r.recorded}] + ([live_note] if live_note else [])
    if rows:
        r0 = rows[0]
        notes.append(f"dotted: RECORDED, not live: {_where(r0)}<br>measured {recorded_environment(recorded)}")
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
    fig.update_layout(
        title=t,
        xaxis_title="context when decoding starts (tokens)",
        yaxis_title=f"median {y} (ms)",
        yaxis_rangemode="tozero",
        xaxis_rangemode="tozero",
        legend=legend_below(),
        template="plotly_white",
        margin=top_margin(t),
    )
    return fig


def bench_figure(result: dict[str, Any], model: str, device: str) -> Any:
    """Decode ms per step vs context for each variant of a bench result (median, min-max bars), with the bucket
    boundaries the per-tensor KV size crosses on WebGPU; labelled with runtime, adapter, model, dtype, machine."""
    rows = rows_of(result, model, device)
    env = result["environment"]
    contexts = sorted({r["context"] for r in rows})
    series = _series(rows)
    fig = go().Figure()
    for (name, mode, pts), color in zip(series, kind_colors(series_key(s[2][0]) for s in series)):
        label = name.replace("@fit", "@fit (context + new tokens)") + (f" ({mode})" if mode else "")
        if len(contexts) == 1:  # one context: a bar per variant reads better than points stacked on one x
            fig.add_bar(
                x=[label], y=[r["decode_ms"] for r in pts], name=label, error_y=_error_bars(pts), marker_color=color
            )
        else:
            fig.add_scatter(
                x=[r["context"] for r in pts],
                y=[r["decode_ms"] for r in pts],
                mode="lines+markers",
                name=label,
                error_y=_error_bars(pts),
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


def staircase_cost(rows: Sequence[dict[str, Any]]) -> Any:
    """The cost of one fresh buffer (``kvlab.core.buckets.FreshCost``) fitted on the pool-``disabled`` rows of a
    recorded sweep, where every KV tensor is created afresh each step: (dynamic - static) / tensors per size.
    None when the sweep has no disabled rows at two sizes above 4 MiB."""
    from ..core.buckets import fit_fresh_cost

    by = {
        (r["cache_kind"], r["context"]): r
        for r in rows
        if r.get("buffer_cache_mode") == "disabled" and r["runner"] == "kvlab"
    }
    points = [
        (
            int(d["tensors_per_step"]),
            int(round(d["kv_tensor_mib"] * MiB)),
            d["decode_ms"] - by[("static", c)]["decode_ms"],
        )
        for (kind, c), d in by.items()
        if kind == "dynamic" and ("static", c) in by
    ]
    try:
        return fit_fresh_cost(points)
    except ValueError:
        return None


def _boundaries(per_token: float, contexts: Sequence[int]) -> list[tuple[int, int, int]]:
    """(index i, bucket MiB, tokens) of each bucket boundary that lies between measured contexts i and i + 1."""
    from ..core.buckets import bucket_positions

    out = []
    for mib, pos in bucket_positions(per_token).items():
        i = next((i for i in range(len(contexts) - 1) if contexts[i] < pos <= contexts[i + 1]), None)
        if i is not None:
            out.append((i, mib, pos))
    return out


def staircase(result: dict[str, Any], model: str = "kv-heavy", device: str = "webgpu") -> Any:
    """A recorded bucket-boundary sweep (``kvlab bench --contexts 960,1088,... --buffer-cache-modes bucket,
    disabled``): the decode step of each cache per buffer cache mode, the dynamic/static ratio, and the fresh
    buffers per step: predicted from the bucket table (``kvlab.core.buckets.predict_churn``) and counted (new
    buffer handles, a lower bound)."""
    from plotly.subplots import make_subplots

    from ..core.buckets import predict_churn

    rows = rows_of(result, model, device)
    if not rows:
        raise ValueError(f"the recorded results have no rows for model {model!r} on device {device!r}")
    modes = sorted({r.get("buffer_cache_mode", "") for r in rows}, key=lambda m: (m != "bucket", m))
    by = {(r["cache_kind"], r.get("buffer_cache_mode", ""), r["context"]): r for r in rows if r["runner"] == "kvlab"}
    contexts = sorted({r["context"] for r in rows})
    r0 = rows[0]
    per_token = r0["kv_tensor_mib"] * MiB / r0["context"]
    cat = {c: str(c) for c in contexts}  # evenly spaced: the pairs around each bucket boundary stay readable
    cost = staircase_cost(rows)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=[1.0, 0.6, 0.8],
        subplot_titles=("median decode step (ms)", "dynamic / static", "fresh buffers per decode step (dynamic)"),
    )
    for mode in modes:
        dash = MODE_DASHES.get(mode, "solid")
        for kind in ("dynamic", "static"):
            pts = [by[(kind, mode, c)] for c in contexts if (kind, mode, c) in by]
            fig.add_scatter(
                x=[cat[p["context"]] for p in pts],
                y=[p["decode_ms"] for p in pts],
                mode="lines+markers",
                name=f"{kind}, pool {mode}",
                line={"color": KIND_COLORS[kind], "dash": dash},
                error_y=_error_bars(pts),
                legendgroup=f"{kind}{mode}",
                row=1,
                col=1,
            )
        both = [c for c in contexts if ("dynamic", mode, c) in by and ("static", mode, c) in by]
        fig.add_scatter(
            x=[cat[c] for c in both],
            y=[by[("dynamic", mode, c)]["decode_ms"] / by[("static", mode, c)]["decode_ms"] for c in both],
            mode="lines+markers",
            name=f"dynamic/static, pool {mode}",
            line={"color": "#444", "dash": dash},
            row=2,
            col=1,
        )
        dyn = [by[("dynamic", mode, c)] for c in contexts if ("dynamic", mode, c) in by]
        fig.add_bar(
            x=[cat[p["context"]] for p in dyn],
            y=[p["new_buffers_per_step"] for p in dyn],
            name=f"counted, pool {mode}",
            marker_color=KIND_COLORS["dynamic"],
            marker_pattern_shape="" if mode == "bucket" else "/",
            opacity=0.8,
            row=3,
            col=1,
        )
        if mode == "bucket" and cost is not None:  # the staircase predicted: static + fresh x cost(bucket size)
            stat = [by[("static", mode, c)] for c in contexts if ("static", mode, c) in by]
            churn = [predict_churn(int(dyn[0]["tensors_per_step"]), int(per_token), p["context"] + 1) for p in stat]
            fig.add_scatter(
                x=[cat[p["context"]] for p in stat],
                y=[p["decode_ms"] + ch.fresh * cost(ch.bucket or ch.tensor_bytes) for p, ch in zip(stat, churn)],
                mode="lines+markers",
                name="dynamic, pool bucket: predicted",
                line={"color": "#000", "dash": "dot", "width": 1.5},
                marker={"symbol": "x", "size": 8},
                row=1,
                col=1,
            )
        if mode in ("bucket", "disabled"):
            tensors = int(dyn[0]["tensors_per_step"]) if dyn else 0
            predicted = [
                tensors if mode == "disabled" else predict_churn(tensors, int(per_token), c + 1).fresh for c in contexts
            ]
            fig.add_scatter(
                x=[cat[c] for c in contexts],
                y=predicted,
                mode="markers",
                name=f"predicted, pool {mode}",
                marker={
                    "symbol": "line-ew-open",
                    "size": 18,
                    "line": {"width": 3},
                    "color": "#000" if mode == "bucket" else "#888",
                },
                row=3,
                col=1,
            )
    for i, mib, pos in _boundaries(per_token, contexts):
        fig.add_vline(
            x=i + 0.5,
            line={"dash": "dot", "color": "#888", "width": 1},
            annotation={"text": f"KV tensor {mib} MiB at {pos:,}", "font": {"size": 10}},
            annotation_position="bottom right",
            row=1,
            col=1,
        )
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", ticksuffix="x", row=2, col=1)
    fig.update_yaxes(tickformat="d", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[cat[c] for c in contexts])
    fig.update_xaxes(title_text="context when decoding starts (tokens; evenly spaced)", row=3, col=1)
    env = result["environment"]
    fit = (
        ""
        if cost is None
        else f"<br>predicted = static + predicted fresh x cost per fresh buffer, that cost "
        f"fitted on the disabled runs: {cost.small_ms:.2f} ms up to 4 MiB, {cost.base_ms:.2f} + "
        f"{cost.per_mib_ms:.3f} ms/MiB above"
    )
    t = title(
        f"The staircase, recorded: {model} ({r0['dtype']}) on {device} [{r0['adapter']}]",
        f"WebGPU EP of {env['backend_package']} {env['backend_version']}, {r0['new_tokens']} new tokens per "
        f"run, median of {r0['reps']} paired runs (bars: min-max); recorded {env['date']}",
        "pool disabled: every KV tensor is created afresh each step (24 predicted); counted = new buffer "
        "handles, a lower bound (Dawn reuses addresses)" + fit,
    )
    fig.update_layout(
        title=t,
        height=820,
        legend=legend_below(-0.1),
        template="plotly_white",
        barmode="group",
        margin=top_margin(t, extra=20),
    )
    return fig


def staircase_glance(result: dict[str, Any], model: str = "kv-heavy", device: str = "webgpu") -> Any:
    """The staircase at a glance, from the same recorded sweep as ``staircase``: one panel, three lines: the
    dynamic and the static cache's decode step in the pool's default ``bucket`` mode, and the dynamic step the
    bucket table predicts (static + predicted fresh buffers x the cost of one, fitted on the ``disabled`` runs);
    a dotted line where a KV tensor reaches a bucket size. ``staircase`` has every mode and the buffer counts."""
    from ..core.buckets import predict_churn

    rows = [r for r in rows_of(result, model, device) if r.get("buffer_cache_mode", "bucket") == "bucket"]
    if not rows:
        raise ValueError(f"the recorded results have no bucket-mode rows for model {model!r} on device {device!r}")
    by = {(r["cache_kind"], r["context"]): r for r in rows if r["runner"] == "kvlab"}
    contexts = sorted({r["context"] for r in rows})
    r0 = rows[0]
    per_token = r0["kv_tensor_mib"] * MiB / r0["context"]
    cost = staircase_cost(rows_of(result, model, device))
    fig = go().Figure()
    for kind in ("dynamic", "static"):
        pts = [by[(kind, c)] for c in contexts if (kind, c) in by]
        fig.add_scatter(
            x=[str(p["context"]) for p in pts],
            y=[p["decode_ms"] for p in pts],
            mode="lines+markers",
            name=f"{kind} cache (recorded)",
            line={"color": KIND_COLORS[kind], "width": 3},
            marker={"size": 8},
            error_y=_error_bars(pts),
        )
    if cost is not None:
        stat = [by[("static", c)] for c in contexts if ("static", c) in by and ("dynamic", c) in by]
        tensors = int(by[("dynamic", contexts[0])]["tensors_per_step"])
        churn = [predict_churn(tensors, int(per_token), p["context"] + 1) for p in stat]
        fig.add_scatter(
            x=[str(p["context"]) for p in stat],
            y=[p["decode_ms"] + ch.fresh * cost(ch.bucket or ch.tensor_bytes) for p, ch in zip(stat, churn)],
            mode="lines+markers",
            name="dynamic, predicted from the bucket table",
            line={"color": "#000", "dash": "dot", "width": 1.5},
            marker={"symbol": "x", "size": 8},
        )
    for i, mib, _ in _boundaries(per_token, contexts):
        fig.add_vline(
            x=i + 0.5,
            line={"dash": "dot", "color": "#aaa", "width": 1},
            annotation={"text": f"{mib} MiB", "font": {"size": 10, "color": "#666"}},
            annotation_position="top",
        )
    env = result["environment"]
    t = title(
        f"The staircase, recorded: {model} ({r0['dtype']}) on {device} [{r0['adapter']}]",
        f"WebGPU EP of {env['backend_package']} {env['backend_version']}, buffer pool in its default bucket mode, "
        f"{r0['new_tokens']} new tokens per run, median of {r0['reps']} paired runs (bars: min-max)",
        "dotted verticals: where one KV tensor reaches a bucket size; recorded " + env["date"],
    )
    fig.update_xaxes(
        type="category",
        categoryorder="array",
        categoryarray=[str(c) for c in contexts],
        title_text="context when decoding starts (tokens; evenly spaced)",
    )
    fig.update_yaxes(rangemode="tozero", title_text="median decode step (ms)")
    fig.update_layout(title=t, height=460, legend=legend_below(-0.2), template="plotly_white", margin=top_margin(t))
    return fig


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
        xs, ys = [], []
        for dynamic, static in pairs:
            d, s = as_runs([dynamic, static])
            dec = d.frame[d.frame["phase"] == "decode"]
            xs.append(int(dec["position"].iloc[0]))
            ys.append(float(dec["wall_ms"].median()) / float(s.frame.query("phase == 'decode'")["wall_ms"].median()))
        if not xs:
            continue
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
    fig.update_layout(title=t, height=500, legend=legend_below(-0.22), template="plotly_white", margin=top_margin(t))
    return fig


def capture_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded ``kvlab bench --graph-capture`` run, one row per context and static cache size: the decode step
    (median ms) of kvlab's static cache uncaptured and captured and of onnxruntime-genai plain and captured, the
    paired ratios (median over rounds of each round's ratio; the rounds are interleaved) and the loop thread's CPU
    time per step."""
    by: dict[tuple[int, str], dict[str, Any]] = {}
    for r in result["rows"]:
        key = "genai" if r["runner"] != "kvlab" else r["variant"].removesuffix(" graph")
        by.setdefault((r["context"], key), {})[r.get("cache_variant") or r["runner"]] = r

    def paired(a: dict[str, Any], b: dict[str, Any]) -> float:
        return float(np.median(np.array(a["decode_ms_runs"]) / np.array(b["decode_ms_runs"])))

    out = []
    for (context, key), v in sorted(by.items()):
        if key in ("genai", "dynamic") or "graph" not in v:
            continue
        plain, graph = next(r for k, r in v.items() if k != "graph"), v["graph"]
        g = by.get((context, "genai"), {})
        row = {
            "package": f"{result['environment']['backend_package']} {result['environment']['backend_version']}",
            "precision": plain["precision"],
            "context": context,
            "cache": key,
            "static ms": plain["decode_ms"],
            "static + graph ms": graph["decode_ms"],
            "graph / static (paired)": paired(graph, plain),
            "loop CPU ms: static": plain["thread_cpu_ms"],
            "loop CPU ms: static + graph": graph["thread_cpu_ms"],
        }
        if "genai" in g and "genai graph" in g:
            row.update(
                {
                    "genai ms": g["genai"]["decode_ms"],
                    "genai graph ms": g["genai graph"]["decode_ms"],
                    "genai graph / genai (paired)": paired(g["genai graph"], g["genai"]),
                    "kvlab graph / genai graph (paired)": paired(graph, g["genai graph"]),
                }
            )
        row["tokens equal"] = all(r.get("tokens_equal", True) for r in (plain, graph, *g.values()))
        out.append(row)
    return out


def capture_figure(results: Sequence[dict[str, Any]]) -> Any:
    """What graph capture does to a decode step, per package: the paired captured / uncaptured ratio of kvlab's
    static cache and of onnxruntime-genai against the context, from recorded ``kvlab bench --graph-capture`` runs
    (``capture_table``); below 1 capture helps."""
    fig = go().Figure()
    rows = [r for result in results for r in capture_table(result)]
    packages = list(dict.fromkeys(r["package"] for r in rows))
    for package, dash in zip(packages, ("solid", "dash", "dot")):
        mine = [r for r in rows if r["package"] == package]
        for who, column, color in (
            ("kvlab static cache", "graph / static (paired)", KIND_COLORS["static"]),
            ("onnxruntime-genai", "genai graph / genai (paired)", KIND_COLORS["genai"]),
        ):
            fig.add_scatter(
                x=[r["context"] for r in mine],
                y=[r.get(column) for r in mine],
                mode="lines+markers",
                name=f"{who}, {package}",
                line={"color": color, "dash": dash},
            )
    fig.add_hline(
        y=1.0, line={"color": "#7f7f7f", "width": 1}, annotation_text="no change", annotation_position="bottom right"
    )
    r0 = results[0]["rows"][0]
    t = title(
        "Graph capture: captured / uncaptured decode step (paired)",
        f"{r0['model']} ({r0['dtype']}) · webgpu on {r0['adapter']} · {r0['new_tokens']} new tokens, "
        f"median of {r0['reps']} paired rounds",
        "below 1: capture makes the step shorter",
    )
    fig.update_layout(
        title=t,
        margin=top_margin(t),
        template="plotly_white",
        yaxis_title="captured / uncaptured",
        xaxis_title="context (tokens already in the cache)",
        legend=legend_below(-0.2),
    )
    fig.update_xaxes(tickvals=sorted({r["context"] for r in rows}), tickformat="d")
    return fig


def modes_table(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded WebGPU ``kvlab bench`` runs across buffer cache modes, one row per model, precision, mode and
    context: the median decode step of the dynamic cache, of the static cache (the token chosen on the host, and on
    the device where that twin ran) and of onnxruntime-genai; dynamic/static; static/genai paired (median over
    rounds of each round's ratio); what the dynamic cache allocated per step (tensors: an exact count; buffer
    handles never seen before: a lower bound) and the process's GPU memory growth over its run (NVML); whether all
    of them produced the same tokens. A later result's rows replace an earlier one's for the same model, precision,
    mode and context (a re-measured row)."""
    by: dict[tuple[str, str, str, int], dict[str, dict[str, Any]]] = {}
    for result in results:
        for r in result["rows"]:
            if r["device"] != "webgpu" or r["runner"] not in ("kvlab", "genai") or r.get("cache_variant"):
                continue  # captured, 4 KiB-page and check-every twins are other tables' rows
            who = "genai" if r["runner"] == "genai" else "token" if r.get("token_on_device") else r["cache_kind"]
            key = (r["model"], r["precision"], r["buffer_cache_mode"], r["context"])
            by.setdefault(key, {})[who] = r

    def paired(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
        if a is None or b is None:
            return None
        return float(np.median(np.array(a["decode_ms_runs"]) / np.array(b["decode_ms_runs"])))

    def ms(r: dict[str, Any] | None) -> float | None:
        return None if r is None else r["decode_ms"]

    order = {m: i for i, m in enumerate(("bucket", "simple", "lazyRelease", "disabled"))}
    out = []
    for (model, precision, mode, context), v in sorted(
        by.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 9), kv[0][3])
    ):
        dyn, st, tok, genai = (v.get(k) for k in ("dynamic", "static", "token", "genai"))
        if dyn is None or st is None:
            continue
        out.append(
            {
                "model": model,
                "precision": precision,
                "mode": mode,
                "context": context,
                "rounds": st["reps"],
                "dynamic ms": ms(dyn),
                "static ms": ms(st),
                "static, token on the device ms": ms(tok),
                "genai ms": ms(genai),
                "dynamic / static": dyn["decode_ms"] / st["decode_ms"],
                "static / genai (paired)": paired(st, genai),
                "token on the device / genai (paired)": paired(tok, genai),
                "dynamic tensors per step": dyn["tensors_per_step"],
                "dynamic new buffers per step": dyn["new_buffers_per_step"],
                "static new buffers per step": st["new_buffers_per_step"],
                "dynamic GPU memory growth MiB": (dyn.get("gpu_memory_growth_bytes") or 0) / MiB,
                "tokens equal": all(r.get("tokens_equal", True) for r in v.values()),
            }
        )
    return out


MODE_COLORS = {"bucket": "#1f77b4", "simple": "#2ca02c", "lazyRelease": "#ff7f0e", "disabled": "#7f7f7f"}


def modes_figure(results: Sequence[dict[str, Any]], models: Sequence[str] | None = None, genai: bool = True) -> Any:
    """The buffer cache modes side by side (``modes_table``), one column per model (``models``: those to draw, by
    their rows' name; default all): on top dynamic/static against the context (what a static cache buys in each
    mode), below kvlab's static step over onnxruntime-genai's, paired, with the greedy token chosen on the host
    (solid) and on the device (dotted); one colour per mode. ``genai=False``: the top row only (one idea: what a
    static cache buys in each mode; ``modes_table`` has the genai ratios)."""
    from plotly.subplots import make_subplots

    rows = [r for r in modes_table(results) if models is None or r["model"] in models]
    columns = list(dict.fromkeys((r["model"], r["precision"]) for r in rows))
    fig = make_subplots(
        rows=2 if genai else 1,
        cols=len(columns),
        vertical_spacing=0.14,
        horizontal_spacing=0.06,
        subplot_titles=[f"{m} ({p})" for m, p in columns],
    )
    for col, (model, precision) in enumerate(columns, start=1):
        for mode, color in MODE_COLORS.items():
            pts = [r for r in rows if (r["model"], r["precision"], r["mode"]) == (model, precision, mode)]
            tok = [r for r in pts if r["token on the device / genai (paired)"] is not None]
            for row, y, pick, dash, name in (
                (1, "dynamic / static", pts, "solid", f"pool {mode}"),
                (2, "static / genai (paired)", pts, "solid", f"pool {mode}"),
                (2, "token on the device / genai (paired)", tok, "dot", f"pool {mode}, token on the device"),
            ):
                if pick and (genai or row == 1):
                    fig.add_scatter(
                        x=[r["context"] for r in pick],
                        y=[r[y] for r in pick],
                        mode="lines+markers",
                        name=name,
                        line={"color": color, "dash": dash},
                        legendgroup=mode,
                        showlegend=col == 1 and row == 1,
                        row=row,
                        col=col,
                    )
        fig.add_hline(y=1.0, line={"color": "#999", "width": 1}, row=2 if genai else 1, col=col)
        fig.update_xaxes(
            type="log",
            tickvals=sorted({r["context"] for r in rows if r["model"] == model}),
            tickformat="d",
            tickangle=-45,
            col=col,
        )
    fig.update_yaxes(ticksuffix="x", rangemode="tozero", row=1)
    fig.update_yaxes(title_text="dynamic / static", row=1, col=1)
    if genai:
        fig.update_yaxes(title_text="kvlab static / genai", row=2, col=1)
    fig.update_xaxes(title_text="context (tokens)", row=2 if genai else 1)
    r0 = results[0]["rows"][0]
    packages = sorted({f"{r['environment']['backend_package']} {r['environment']['backend_version']}" for r in results})
    new = sorted({r["new_tokens"] for result in results for r in result["rows"]})
    t = title(
        "The WebGPU buffer cache modes, recorded",
        f"webgpu on {r0['adapter']}, WebGPU EP of {', '.join(packages)}, "
        f"{'-'.join(map(str, (new[0], new[-1]) if len(new) > 1 else new))} new tokens per run, paired rounds "
        "(how many: the table)",
        "bottom: kvlab's static step / genai's, paired (below 1: kvlab's is shorter); solid: greedy token "
        "chosen on the host, dotted: on the device"
        if genai
        else "dynamic / static per buffer cache mode (1x: no gain); kvlab against genai: the table below",
    )
    fig.update_layout(
        title=t,
        height=640 if genai else 430,
        template="plotly_white",
        legend=legend_below(-0.2 if genai else -0.3),
        margin=top_margin(t),
    )
    return fig


def trace_figure(trace: dict[str, Any]) -> Any:
    """A recorded ``kvlab trace`` (one long generation per cache from the same prompt): per decode step its wall
    time, and the GPU memory the process holds after it (NVML: the driver's per-process accounting, a measurement
    of the whole process), with the KV tensors the runtime allocated per step (kvlab's exact count) in the legend."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("decode step (ms)", "GPU memory the process holds (MiB, NVML)"),
    )
    top, first = 0.0, []
    for kind, run in trace["runs"].items():
        rec, mem = run["records"], run["gpu_memory"]
        steps = [s for s, p in zip(rec["step"], rec["phase"]) if p == "decode"]
        ms = [w for w, p in zip(rec["wall_ms"], rec["phase"]) if p == "decode"]
        name = f"{kind}: {run['tensors_allocated_per_step']:.0f} KV tensors allocated per step"
        color = KIND_COLORS.get(kind, "#444")
        fig.add_scatter(
            x=steps, y=ms, mode="lines", name=name, line={"color": color, "width": 1}, legendgroup=kind, row=1, col=1
        )
        top = max(top, float(np.percentile(ms, 99)))
        first.append(f"{kind} {ms[0]:.0f} ms")
        fig.add_scatter(
            x=[s for s in mem["steps"] if s > 0],
            y=[b / MiB for s, b in zip(mem["steps"], mem["bytes"]) if s > 0],
            mode="lines",
            name=name,
            line={"color": color},
            legendgroup=kind,
            showlegend=False,
            row=2,
            col=1,
        )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(range=[0, 1.3 * top], row=1, col=1)  # the first step (shader compilation) is off the scale
    fig.update_xaxes(title_text="decode step", row=2, col=1)
    env = trace["environment"]
    package = next(
        (
            f"{p} {v}"
            for p, v in env.get("versions", {}).items()
            if p.startswith("onnxruntime-") and p != "onnxruntime-genai" and v != "missing"
        ),
        env["backend"],
    )
    t = title(
        f"{trace['steps']:,} decode steps from {trace['context']:,} tokens, recorded",
        f"{trace['model']} on {trace['device']}, {package}",
        f"recorded {env['date']}; tokens equal: {trace['tokens_equal']}; first step (off the scale): "
        f"{', '.join(first)}<br>GPU memory: NVML's per-process figure (the driver's accounting); tensors "
        "allocated: kvlab's exact count",
    )
    fig.update_layout(title=t, height=560, template="plotly_white", legend=legend_below(-0.15), margin=top_margin(t))
    return fig
