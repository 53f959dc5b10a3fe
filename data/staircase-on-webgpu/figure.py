"""Does a dynamic cache's step climb in stairs on a real GPU's WebGPU, and does the buffer pool's bucket table
predict them? The recorded ``kvlab bench`` sweep across the pool's bucket boundaries drawn with what the bucket
table (``kvlab.core.buckets``) predicts: every buffer cache mode and the buffer counts (``figure``), or the default
mode at a glance (``glance``); ``cost`` is the fitted cost of one fresh buffer.

    python data/staircase-on-webgpu/figure.py   # writes staircase.png and staircase-glance.png beside it
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from kvlab.bench.chart import error_bars, rows_of
from kvlab.core.buckets import bucket_positions, predict_churn
from kvlab.lab.style import KIND_COLORS, MODE_DASHES, MiB, finish, go, title


class FreshCost(NamedTuple):
    """What one buffer created afresh adds to a decode step, in ms: ``small_ms`` up to ``threshold`` bytes (Dawn
    sub-allocates such buffers from larger blocks), ``base_ms + per_mib_ms * MiB`` above it (each one its own
    device allocation). Fitted on runs where every buffer is fresh (the pool disabled); see ``fit_fresh_cost``."""

    threshold: int
    small_ms: float
    base_ms: float
    per_mib_ms: float

    def __call__(self, nbytes: int) -> float:
        return self.small_ms if nbytes <= self.threshold else self.base_ms + self.per_mib_ms * nbytes / MiB


def fit_fresh_cost(points: Iterable[tuple[int, int, float]], threshold: int = 4 * MiB) -> FreshCost:
    """A ``FreshCost`` from (fresh buffers per step, bytes per buffer, ms a step takes beyond a static cache's)
    measured with every buffer fresh: the mean per-buffer cost at or below ``threshold``, a least-squares line in
    MiB above it (ValueError without points at two sizes above the threshold)."""
    pts = [(nbytes, extra / fresh) for fresh, nbytes, extra in points if fresh > 0]
    small = [ms for nbytes, ms in pts if nbytes <= threshold]
    large = [(nbytes / MiB, ms) for nbytes, ms in pts if nbytes > threshold]
    if len({mib for mib, _ in large}) < 2:
        raise ValueError(f"fit_fresh_cost needs points at two or more sizes above {threshold / MiB:g} MiB")
    per_mib, base = np.polyfit([m for m, _ in large], [ms for _, ms in large], 1)
    return FreshCost(threshold, float(np.mean(small)) if small else 0.0, float(base), float(per_mib))


def cost(rec: Any, model: str = "kv-heavy", device: str = "webgpu") -> Any:
    """The cost of one fresh buffer fitted on the recording's pool-disabled rows (``_fit``); None without them."""
    return _fit(rows_of(rec.results, model, device))


def _fit(rows: Sequence[dict[str, Any]]) -> Any:
    """The cost of one fresh buffer (``FreshCost``) fitted on the pool-``disabled`` rows of a
    recorded sweep, where every KV tensor is created afresh each step: (dynamic - static) / tensors per size.
    None when the sweep has no disabled rows at two sizes above 4 MiB."""
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
    out = []
    for mib, pos in bucket_positions(per_token).items():
        i = next((i for i in range(len(contexts) - 1) if contexts[i] < pos <= contexts[i + 1]), None)
        if i is not None:
            out.append((i, mib, pos))
    return out


def _per_token(rows: Sequence[dict[str, Any]]) -> float:
    """Bytes per token of one KV tensor, from the first row's tensor size at its context."""
    return rows[0]["kv_tensor_mib"] * MiB / rows[0]["context"]


def _heading(r0: dict[str, Any], model: str, device: str) -> str:
    return f"The staircase, recorded: {model} ({r0['dtype']}) on {device} [{r0['adapter']}]"


def _add_predicted(
    fig: Any, static: Sequence[dict[str, Any]], tensors: int, per_token: float, cost: Any, name: str, **at: Any
) -> None:
    """The dynamic step the bucket table predicts at each static row's context: the static step plus the predicted
    fresh buffers times the fitted cost of one (``cost``), as a dotted black line (``at``: row, col)."""
    churn = [predict_churn(tensors, int(per_token), p["context"] + 1) for p in static]
    fig.add_scatter(
        x=[str(p["context"]) for p in static],
        y=[p["decode_ms"] + ch.fresh * cost(ch.bucket or ch.tensor_bytes) for p, ch in zip(static, churn)],
        mode="lines+markers",
        name=name,
        line={"color": "#000", "dash": "dot", "width": 1.5},
        marker={"symbol": "x", "size": 8},
        **at,
    )


def figure(rec: Any, model: str = "kv-heavy", device: str = "webgpu") -> Any:
    """A recorded bucket-boundary sweep (``kvlab bench --contexts 960,1088,... --buffer-cache-modes bucket,
    disabled``): the decode step of each cache per buffer cache mode, the dynamic/static ratio, and the fresh
    buffers per step: predicted from the bucket table (``kvlab.core.buckets.predict_churn``) and counted (new
    buffer handles, a lower bound)."""
    from plotly.subplots import make_subplots

    result = rec.results
    rows = rows_of(result, model, device)
    if not rows:
        raise ValueError(f"the recorded results have no rows for model {model!r} on device {device!r}")
    modes = sorted({r.get("buffer_cache_mode", "") for r in rows}, key=lambda m: (m != "bucket", m))
    by = {(r["cache_kind"], r.get("buffer_cache_mode", ""), r["context"]): r for r in rows if r["runner"] == "kvlab"}
    contexts = sorted({r["context"] for r in rows})
    per_token, cost = _per_token(rows), _fit(rows)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=[1.0, 0.6, 0.8],
        subplot_titles=("median decode step (ms)", "dynamic / static", "fresh buffers per decode step (dynamic)"),
    )
    for mode in modes:
        _draw_steps(fig, by, contexts, mode)
        _draw_buffers(fig, by, contexts, mode, per_token, cost)
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
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=[str(c) for c in contexts])
    fig.update_xaxes(title_text="context when decoding starts (tokens; evenly spaced)", row=3, col=1)
    t = _staircase_title(result, model, device, cost)
    finish(fig, t, legend_y=-0.1, top_extra=20, height=820, barmode="group")
    return fig


def _draw_steps(fig: Any, by: dict[tuple[str, str, int], dict[str, Any]], contexts: Sequence[int], mode: str) -> None:
    """One buffer cache mode's decode step per cache (top panel) and its dynamic/static ratio (middle panel), the
    contexts evenly spaced as categories."""
    dash = MODE_DASHES.get(mode, "solid")
    for kind in ("dynamic", "static"):
        pts = [by[(kind, mode, c)] for c in contexts if (kind, mode, c) in by]
        fig.add_scatter(
            x=[str(p["context"]) for p in pts],
            y=[p["decode_ms"] for p in pts],
            mode="lines+markers",
            name=f"{kind}, pool {mode}",
            line={"color": KIND_COLORS[kind], "dash": dash},
            error_y=error_bars(pts),
            legendgroup=f"{kind}{mode}",
            row=1,
            col=1,
        )
    both = [c for c in contexts if ("dynamic", mode, c) in by and ("static", mode, c) in by]
    fig.add_scatter(
        x=[str(c) for c in both],
        y=[by[("dynamic", mode, c)]["decode_ms"] / by[("static", mode, c)]["decode_ms"] for c in both],
        mode="lines+markers",
        name=f"dynamic/static, pool {mode}",
        line={"color": "#444", "dash": dash},
        row=2,
        col=1,
    )


def _draw_buffers(
    fig: Any,
    by: dict[tuple[str, str, int], dict[str, Any]],
    contexts: Sequence[int],
    mode: str,
    per_token: float,
    cost: Any,
) -> None:
    """One buffer cache mode's fresh buffers per step: counted (bars, bottom panel) and, for the ``bucket`` and
    ``disabled`` modes, predicted (marks); in ``bucket`` mode also the dynamic step predicted from them (top)."""
    dyn = [by[("dynamic", mode, c)] for c in contexts if ("dynamic", mode, c) in by]
    fig.add_bar(
        x=[str(p["context"]) for p in dyn],
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
        tensors = int(dyn[0]["tensors_per_step"])
        _add_predicted(fig, stat, tensors, per_token, cost, "dynamic, pool bucket: predicted", row=1, col=1)
    if mode in ("bucket", "disabled"):
        tensors = int(dyn[0]["tensors_per_step"]) if dyn else 0
        predicted = [
            tensors if mode == "disabled" else predict_churn(tensors, int(per_token), c + 1).fresh for c in contexts
        ]
        fig.add_scatter(
            x=[str(c) for c in contexts],
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


def _staircase_title(result: dict[str, Any], model: str, device: str, cost: Any) -> dict[str, Any]:
    r0, env = rows_of(result, model, device)[0], result["environment"]
    fit = (
        ""
        if cost is None
        else f"<br>predicted = static + predicted fresh x cost per fresh buffer, that cost "
        f"fitted on the disabled runs: {cost.small_ms:.2f} ms up to 4 MiB, {cost.base_ms:.2f} + "
        f"{cost.per_mib_ms:.3f} ms/MiB above"
    )
    return title(
        _heading(r0, model, device),
        f"WebGPU EP of {env['backend_package']} {env['backend_version']}, {r0['new_tokens']} new tokens per "
        f"run, median of {r0['reps']} paired runs (bars: min-max); recorded {env['date']}",
        "pool disabled: every KV tensor is created afresh each step (24 predicted); counted = new buffer "
        "handles, a lower bound (Dawn reuses addresses)" + fit,
    )


def glance(rec: Any, model: str = "kv-heavy", device: str = "webgpu") -> Any:
    """The staircase at a glance, from the same recorded sweep as ``figure``: one panel, three lines: the
    dynamic and the static cache's decode step in the pool's default ``bucket`` mode, and the dynamic step the
    bucket table predicts (static + predicted fresh buffers x the cost of one, fitted on the ``disabled`` runs);
    a dotted line where a KV tensor reaches a bucket size. ``figure`` has every mode and the buffer counts."""
    result = rec.results
    rows = [r for r in rows_of(result, model, device) if r.get("buffer_cache_mode", "bucket") == "bucket"]
    if not rows:
        raise ValueError(f"the recorded results have no bucket-mode rows for model {model!r} on device {device!r}")
    by = {(r["cache_kind"], r["context"]): r for r in rows if r["runner"] == "kvlab"}
    contexts = sorted({r["context"] for r in rows})
    per_token, cost = _per_token(rows), _fit(rows_of(result, model, device))
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
            error_y=error_bars(pts),
        )
    if cost is not None:
        stat = [by[("static", c)] for c in contexts if ("static", c) in by and ("dynamic", c) in by]
        tensors = int(by[("dynamic", contexts[0])]["tensors_per_step"])
        _add_predicted(fig, stat, tensors, per_token, cost, "dynamic, predicted from the bucket table")
    for i, mib, _ in _boundaries(per_token, contexts):
        fig.add_vline(
            x=i + 0.5,
            line={"dash": "dot", "color": "#aaa", "width": 1},
            annotation={"text": f"{mib} MiB", "font": {"size": 10, "color": "#666"}},
            annotation_position="top",
        )
    fig.update_xaxes(
        type="category",
        categoryorder="array",
        categoryarray=[str(c) for c in contexts],
        title_text="context when decoding starts (tokens; evenly spaced)",
    )
    fig.update_yaxes(rangemode="tozero", title_text="median decode step (ms)")
    t = _glance_title(result, rows[0], model, device)
    finish(fig, t, legend_y=-0.2, height=460)
    return fig


def _glance_title(result: dict[str, Any], r0: dict[str, Any], model: str, device: str) -> dict[str, Any]:
    env = result["environment"]
    return title(
        _heading(r0, model, device),
        f"WebGPU EP of {env['backend_package']} {env['backend_version']}, buffer pool in its default bucket mode, "
        f"{r0['new_tokens']} new tokens per run, median of {r0['reps']} paired runs (bars: min-max)",
        "dotted verticals: where one KV tensor reaches a bucket size; recorded " + env["date"],
    )


if __name__ == "__main__":
    from pathlib import Path

    from kvlab.lab import recorded

    here = recorded.load(Path(__file__).parent.name)
    for name, draw in (("staircase.png", figure), ("staircase-glance.png", glance)):
        draw(here).write_image(here.folder / name, width=1100, height=820 if draw is figure else 460)
