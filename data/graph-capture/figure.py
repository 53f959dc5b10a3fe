"""What does graph capture do to a decode step, per ONNX Runtime package? ``kvlab bench --graph-capture`` runs:
kvlab's static cache uncaptured and captured beside onnxruntime-genai plain and captured, paired, on an NVIDIA H200
(``h200-*``) and on SwiftShader (``swiftshader-*``); ``table`` gives a run's rows, ``span`` what a longer
``max_cache_len`` costs, ``figure`` the captured / uncaptured ratio against the context on the H200, one line per
loop and package.

    python data/graph-capture/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.bench.chart import paired
from kvlab.lab.style import KIND_COLORS, finish, go, title

H200 = ("h200-onnxruntime-webgpu/results.json", "h200-plugin-ep/results.json")  # one run per package


def table(rec: Any, run: str) -> list[dict[str, Any]]:
    """``_rows`` of the run ``run`` (a results file of this folder, e.g. ``H200[1]``)."""
    return _rows(rec.read(run))


def span(rec: Any) -> tuple[Any, str]:
    """What a larger ``max_cache_len`` costs on the H200 (``h200-span/``): per package, the fitted static cache
    against one eight times longer at 1,024 tokens, with the KV each reserves and the paired ratio of their steps.
    Returns (a pandas frame, where it was recorded)."""
    import pandas as pd

    from kvlab.lab.recorded import recorded_environment

    results, rows = [rec.read(f) for f in rec.files("h200-span/*.json")], []
    for result in results:
        env, by = result["environment"], {r["variant"]: r for r in result["rows"]}
        for name in ("static@1055", "static@8224"):
            r = by[name]
            kv_per_token = r["kv_tensor_mib"] / r["context"] * 64  # MiB per token: 64 KV tensors (32 layers x K, V)
            paired = float(pd.Series(r["decode_ms_runs"]).div(by["static@1055"]["decode_ms_runs"]).median())
            rows.append({
                "package": f"{env['backend_package']} {env['backend_version']}", "context": r["context"],
                "max_cache_len": r["max_cache_len"], "KV reserved (MiB)": round(kv_per_token * r["max_cache_len"]),
                "decode step (ms)": round(r["decode_ms"], 2), "vs the fitted one (paired)": round(paired, 3),
            })  # fmt: skip
    return pd.DataFrame(rows), "; ".join(recorded_environment(r) for r in results)


def figure(rec: Any) -> Any:
    """``_draw`` of the two H200 runs."""
    return _draw([rec.read(run) for run in H200])


def swiftshader_runs(rec: Any) -> Any:
    """The SwiftShader runs of both packages (``swiftshader-*``), one row per package, context and variant: package
    ("name version"), context, variant, the medians per decode step (wall ms, process CPU ms, loop thread CPU ms),
    whether its tokens equal the reference, and each round's wall ms ("runs") and loop-thread CPU ms ("thread
    runs"), for paired ratios. A pandas DataFrame; ConfigError where a package's run is missing."""
    import pandas as pd

    rows = []
    for package in ("onnxruntime-webgpu", "plugin-ep"):
        result = rec.read(f"swiftshader-{package}/results.json")
        runtime = f"{result['environment']['backend_package']} {result['environment']['backend_version']}"
        for r in result["rows"]:
            rows.append(
                {
                    "package": runtime,
                    "context": r["context"],
                    "variant": r["variant"],
                    "wall ms": r["decode_ms"],
                    "process CPU ms": r["cpu_ms"],
                    "loop thread CPU ms": r["thread_cpu_ms"],
                    "tokens equal": r["tokens_equal"],
                    "runs": r["decode_ms_runs"],
                    "thread runs": r["thread_cpu_ms_runs"],
                }
            )
    return pd.DataFrame(rows)


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
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


def _draw(results: Sequence[dict[str, Any]]) -> Any:
    """What graph capture does to a decode step, per package: the paired captured / uncaptured ratio of kvlab's
    static cache and of onnxruntime-genai against the context, from recorded ``kvlab bench --graph-capture`` runs
    (``_rows``); below 1 capture helps."""
    fig = go().Figure()
    lines = [r for result in results for r in _rows(result)]
    packages = list(dict.fromkeys(r["package"] for r in lines))
    for package, dash in zip(packages, ("solid", "dash", "dot")):
        mine = [r for r in lines if r["package"] == package]
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
    fig.update_xaxes(tickvals=sorted({r["context"] for r in lines}), tickformat="d")
    return fig


if __name__ == "__main__":
    from pathlib import Path

    from kvlab.lab import recorded

    here = recorded.load(Path(__file__).parent.name)
    figure(here).write_image(here.folder / "figure.png", width=1000, height=500)
