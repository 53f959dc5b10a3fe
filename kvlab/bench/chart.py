"""The chart ``kvlab bench`` writes beside its results (``bench_figure``), and how a bench result's rows make its
lines: a row names its cache as fields (``runner``, ``cache_kind``, ``max_cache_len``, ``fitted``: sized to its own
context, ``cache_variant``), so one line can follow a static cache sized to fit every context. The recorded
experiments' figures (``data/<question>/figure.py``) draw bench results with the same helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..lab.style import MODE_DASHES, MiB, add_bucket_lines, go, kind_colors


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
    """The rows of a bench result for ``model`` on ``device`` (None: any), in the result's order."""
    return [
        r
        for r in result.get("rows", [])
        if (model is None or r["model"] == model) and (device is None or r["device"] == device)
    ]


def error_bars(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Plotly error bars from each row's median decode step to its min and max."""
    return {
        "type": "data",
        "symmetric": False,
        "array": [r["decode_ms_max"] - r["decode_ms"] for r in rows],
        "arrayminus": [r["decode_ms"] - r["decode_ms_min"] for r in rows],
    }


def series_lines(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(line name, buffer cache mode, rows by context) per line of a bench result."""
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["context"]):
        lines.setdefault((series_name(r), r.get("buffer_cache_mode", "")), []).append(r)
    return [(name, mode, pts) for (name, mode), pts in sorted(lines.items())]


def paired(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """The paired ratio of two rows measured in the same interleaved rounds: the median over rounds of each round's
    ``a / b`` decode step; None when either row is missing."""
    if a is None or b is None:
        return None
    return float(np.median(np.array(a["decode_ms_runs"]) / np.array(b["decode_ms_runs"])))


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
