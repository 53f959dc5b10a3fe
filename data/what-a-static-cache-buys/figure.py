"""What does a static KV cache buy, machine by machine? kvlab's dynamic cache's decode step over its static cache's,
recorded by ``kvlab bench`` on each machine (one folder a recording), against the context (``figure``, with live
points beside it when given), and a recording's decode step against the context, one line per cache (``sweep``,
with live runs beside it when given).

    python data/what-a-static-cache-buys/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.bench.chart import error_bars, rows_of, series_key, series_lines, series_name
from kvlab.core.errors import check_choice
from kvlab.lab.plots import bucket_note
from kvlab.lab.recorded import recorded_environment
from kvlab.lab.runs import Run, as_runs, common_and_labels
from kvlab.lab.style import (
    KIND_COLORS,
    MODE_DASHES,
    MiB,
    finish,
    go,
    kind_colors,
    title,
)

RATIO_TICKS = (1, 1.5, 2, 3, 5, 10, 20, 30, 50, 100)  # the ratio axis' ticks, labelled in full
# the recorded lines of ``figure``: (name, folder here, which rows: ``gains``'s filters)
CURVES = (
    ("phi4-kv fp32, NVIDIA H200, onnxruntime-webgpu 1.27", "phi4-kv-webgpu", {"precision": "fp32"}),
    ("phi4-kv fp32, NVIDIA H200, onnxruntime-web 1.30 (Node + Dawn)", "browser-node", {}),
    ("SmolLM2, 2-core CPU, CPU EP", "smollm2-cpu", {"model": "smollm2"}),
)
Line = tuple[str, str, list[dict[str, Any]]]  # a recorded line: (name, buffer cache mode, rows by context)


def _gain_rows(
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


def rates(rec: Any) -> tuple[Any, str]:
    """Tokens per second and memory on the H200, per precision and context (``phi4-kv-webgpu/`` with 32 new tokens,
    ``phi4-kv-int4-seed/`` with 256): each cache's decode rate, the static cache's gain over the dynamic one, the KV
    the static cache reserves and the GPU memory growth of the dynamic cache's run (NVML). Returns (a pandas frame,
    where it was recorded)."""
    import pandas as pd

    bench, seed = rec.read("phi4-kv-webgpu/results.json"), rec.read("phi4-kv-int4-seed/results.json")
    rows = []
    for result, new in ((bench, 32), (seed, 256)):
        by = {(r["precision"], r["context"], r["cache_kind"] if r["runner"] == "kvlab" else "genai"): r
              for r in result["rows"] if r["runner"] in ("kvlab", "genai") and not r.get("cache_variant")
              and not r.get("token_on_device")}  # fmt: skip
        for (precision, context, who), r in sorted(by.items()):
            if who != "static":
                continue
            dyn, genai = by[(precision, context, "dynamic")], by.get((precision, context, "genai"))
            rows.append({
                "precision": precision, "context": context, "new tokens": new,
                "dynamic tok/s": round(1000 / dyn["decode_ms"]), "static tok/s": round(1000 / r["decode_ms"]),
                "genai tok/s": round(1000 / genai["decode_ms"]) if genai else None,
                "static gain": f"+{dyn['decode_ms'] / r['decode_ms'] - 1:.0%}",
                "KV the static cache reserves (MiB)": round(r["kv_tensor_mib"] / context * 64 * r["max_cache_len"]),
                "dynamic: GPU memory growth over the run (MiB, NVML)": round(dyn["gpu_memory_growth_bytes"] / 2**20),
            })  # fmt: skip
    return pd.DataFrame(rows), f"{recorded_environment(bench)} | {recorded_environment(seed)}"


def gains(rec: Any, folder: str, **filters: Any) -> list[tuple[int, float]]:
    """``_gain_rows`` of the recording in ``folder`` (its results.json): (context, dynamic / static) per context."""
    return _gain_rows(rec.read(f"{folder}/results.json"), **filters)


GAIN_COLORS = ("#7f7f7f", "#9467bd", "#8c564b", "#bcbd22")  # recorded machines
LIVE_COLORS = ("#d62728", "#ff7f0e", "#e377c2")  # this machine, this browser


def figure(
    rec: Any,
    live: Sequence[tuple[str, Sequence[tuple[Any, Any]]]] = (),
    note: str = "",
    curves: Sequence[tuple[str, str, dict[str, Any]]] = CURVES,
) -> Any:
    """What a static cache buys on each machine: the dynamic cache's decode step over the static cache's, against
    the context, on log axes (1x: no gain). ``curves``: (name, recording's folder here, ``gains`` filters) per
    recorded line (default ``CURVES``); ``live``: (name, [(dynamic run, static run), ...]) per live line, one point
    per pair at the dynamic run's context: its median decode step over the static run's (one unpaired run each, so
    noisier than the recorded lines, which are paired medians). ``note``: a line under the title."""
    fig = go().Figure()
    contexts: set[int] = set()
    for (name, folder, filters), color in zip(curves, GAIN_COLORS * 4):
        pts = gains(rec, folder, **filters)
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


def sweep(
    rec: Any,
    runs: Any = (),
    *,
    file: str = "smollm2-cpu/results.json",
    y: str = "wall_ms",
    buckets: bool | None = None,
    bytes_per_tensor_token: float | None = None,
    recorded_model: str | None = None,
    recorded_device: str | None = None,
    series: Sequence[str] | None = None,
    modes: Sequence[str] | None = None,
    group: str = "cache",
    live_note: str = "",
) -> Any:
    """Median decode-step latency of each run vs its context, one line per cache (and device, when they differ),
    for short runs at several contexts, beside the recorded ``kvlab bench`` result ``file`` of this folder, drawn as
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
    recorded = rec.read(file)
    rows = _recorded_rows(recorded, runs, recorded_model, recorded_device, series, modes)
    lines = series_lines(rows)
    fig = go().Figure()
    colors = _line_colors(groups, lines, group)
    xmax = max([0, _draw_live(fig, groups, colors), _draw_recorded(fig, lines, colors[len(groups) :])])
    notes = [n for n in {r.recorded for r in runs if r.recorded}] + ([live_note] if live_note else [])
    if rows:
        r0 = rows[0]
        mode = f", buffer cache {r0['buffer_cache_mode']}" if r0.get("buffer_cache_mode") else ""
        where = f"{r0['model']} ({r0['dtype']}) on {r0['device']} [{r0['adapter']}]{mode}"
        notes.append(f"dotted: RECORDED, not live: {where}<br>measured {recorded_environment(recorded)}")
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


if __name__ == "__main__":
    from pathlib import Path

    from kvlab.lab import recorded

    here = recorded.load(Path(__file__).parent.name)
    figure(here).write_image(here.folder / "figure.png", width=1000, height=500)
