"""Graph capture, recorded: ``kvlab bench --graph-capture`` runs as a table (``capture_table``) and as the captured
/ uncaptured ratio against the context per package (``capture_figure``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..style import KIND_COLORS, finish, go, title
from .rows import paired


def capture_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded ``kvlab bench --graph-capture`` run, one row per context and static cache size: the decode step
    (median ms) of kvlab's static cache uncaptured and captured and of onnxruntime-genai plain and captured, the
    paired ratios (median over rounds of each round's ratio; the rounds are interleaved) and the loop thread's CPU
    time per step."""
    by: dict[tuple[int, str], dict[str, Any]] = {}
    for r in result["rows"]:
        key = "genai" if r["runner"] != "kvlab" else r["variant"].removesuffix(" graph")
        by.setdefault((r["context"], key), {})[r.get("cache_variant") or r["runner"]] = r

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
    finish(
        fig, t, legend_y=-0.2, yaxis_title="captured / uncaptured", xaxis_title="context (tokens already in the cache)"
    )
    fig.update_xaxes(tickvals=sorted({r["context"] for r in rows}), tickformat="d")
    return fig
