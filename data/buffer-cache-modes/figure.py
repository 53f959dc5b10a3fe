"""Does a static cache buy as much in every WebGPU buffer cache mode? kvlab's caches and onnxruntime-genai recorded
by ``kvlab bench`` in each of the pool's modes (``bucket``, ``simple``, ``lazyRelease``, ``disabled``), one folder
a mode and model; the ``bucket`` rows of phi4-kv and smollm2-shape are ``what-a-static-cache-buys``' recordings.
``results`` reads them all in order (a later one's rows replace an earlier one's: ``again/`` re-measured the
noisiest groups), ``table`` gives one row per model, precision, mode and context, ``figure`` draws them side by side.

    python data/buffer-cache-modes/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.bench.chart import paired
from kvlab.lab import recorded
from kvlab.lab.style import MiB, finish, title

BUCKET_ELSEWHERE = ("phi4-kv-webgpu/results.json", "smollm2-shape-webgpu/results.json")  # in what-a-static-cache-buys


def results(rec: Any, again: bool = True) -> list[dict[str, Any]]:
    """Every recorded run, in the order their rows replace each other: the bucket-mode runs recorded for
    ``what-a-static-cache-buys``, each mode's first run here, then (``again``) the re-measured ones."""
    buys = recorded.load("what-a-static-cache-buys")
    runs = [buys.read(f) for f in BUCKET_ELSEWHERE] + [rec.read(f) for f in rec.files("*/*/results.json")]
    return runs + ([rec.read(f) for f in rec.files("again/*/*/results.json")] if again else [])


def table(rec: Any, again: bool = True) -> list[dict[str, Any]]:
    """``_mode_rows`` of the recorded runs (``results``)."""
    return _mode_rows(results(rec, again))


def figure(rec: Any, models: Sequence[str] | None = None, genai: bool = True) -> Any:
    """``_draw`` of every recorded run (``results``)."""
    return _draw(results(rec), models, genai)


def _mode_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
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


def _draw(results: Sequence[dict[str, Any]], models: Sequence[str] | None = None, genai: bool = True) -> Any:
    """The buffer cache modes side by side (``_mode_rows``), one column per model (``models``: those to draw, by
    their rows' name; default all): on top dynamic/static against the context (what a static cache buys in each
    mode), below kvlab's static step over onnxruntime-genai's, paired, with the greedy token chosen on the host
    (solid) and on the device (dotted); one colour per mode. ``genai=False``: the top row only (one idea: what a
    static cache buys in each mode; ``table`` has the genai ratios)."""
    from plotly.subplots import make_subplots

    rows = [r for r in _mode_rows(results) if models is None or r["model"] in models]
    columns = list(dict.fromkeys((r["model"], r["precision"]) for r in rows))
    fig = make_subplots(
        rows=2 if genai else 1,
        cols=len(columns),
        vertical_spacing=0.14,
        horizontal_spacing=0.06,
        subplot_titles=[f"{m} ({p})" for m, p in columns],
    )
    for col, (model, precision) in enumerate(columns, start=1):
        _draw_model(fig, rows, col, model, precision, genai)
    fig.update_yaxes(ticksuffix="x", rangemode="tozero", row=1)
    fig.update_yaxes(title_text="dynamic / static", row=1, col=1)
    if genai:
        fig.update_yaxes(title_text="kvlab static / genai", row=2, col=1)
    fig.update_xaxes(title_text="context (tokens)", row=2 if genai else 1)
    t = _modes_title(results, genai)
    finish(fig, t, legend_y=-0.2 if genai else -0.3, height=640 if genai else 430)
    return fig


def _draw_model(fig: Any, rows: Sequence[dict[str, Any]], col: int, model: str, precision: str, genai: bool) -> None:
    """One model's column of ``modes_figure``: per buffer cache mode its dynamic/static line (top) and, with
    ``genai``, its static/genai lines (bottom: the token chosen on the host, solid; on the device, dotted)."""
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


def _modes_title(results: Sequence[dict[str, Any]], genai: bool) -> dict[str, Any]:
    r0 = results[0]["rows"][0]
    packages = sorted({f"{r['environment']['backend_package']} {r['environment']['backend_version']}" for r in results})
    new = sorted({r["new_tokens"] for result in results for r in result["rows"]})
    return title(
        "The WebGPU buffer cache modes, recorded",
        f"webgpu on {r0['adapter']}, WebGPU EP of {', '.join(packages)}, "
        f"{'-'.join(map(str, (new[0], new[-1]) if len(new) > 1 else new))} new tokens per run, paired rounds "
        "(how many: the table)",
        "bottom: kvlab's static step / genai's, paired (below 1: kvlab's is shorter); solid: greedy token "
        "chosen on the host, dotted: on the device"
        if genai
        else "dynamic / static per buffer cache mode (1x: no gain); kvlab against genai: the table below",
    )


if __name__ == "__main__":
    from pathlib import Path

    here = recorded.load(Path(__file__).parent.name)
    figure(here, models=("kv-heavy", "phi4-kv-fp16", "smollm2-shape"), genai=False).write_image(
        here.folder / "figure.png", width=1100, height=430
    )
