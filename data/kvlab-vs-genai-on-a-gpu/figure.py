"""Is kvlab's default static decode step at or below onnxruntime-genai's on a GPU? ``kvlab profile --lockstep``: both
loops in one process, in turns of 32-step blocks, the order swapped every pair, each pair of blocks a ratio; the
target cells (phi4-kv fp32 / fp16 / int4 at 1k-16k tokens, smollm2-shape at 1k-8k) on NVIDIA H200 and H100
machines, both ONNX Runtime packages (``lockstep-*.json``; ``gpu_bar.py`` counts every group).

    python data/kvlab-vs-genai-on-a-gpu/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, title

RUNS = {  # recording: (machine, package)
    "lockstep-h200-onnxruntime-webgpu.json": ("NVIDIA H200", "onnxruntime-webgpu 1.27"),
    "lockstep-h200-plugin-ep.json": ("NVIDIA H200", "plugin EP 0.4.0"),
    "lockstep-h100-onnxruntime-webgpu.json": ("NVIDIA H100", "onnxruntime-webgpu 1.27"),
    "lockstep-h100-plugin-ep.json": ("NVIDIA H100", "plugin EP 0.4.0"),
}
MODELS = {("phi4-kv", "float32"): "phi4-kv fp32", ("phi4-kv", "float16"): "phi4-kv fp16",
          ("phi4-kv", "int4"): "phi4-kv int4", ("smollm2-shape", "float32"): "smollm2-shape fp32"}  # fmt: skip


def cells(rec: Any) -> list[dict[str, Any]]:
    """kvlab's default against genai in the default buffer cache mode, one row per cell (machine, package, model,
    context): its newest recording's median ratio and quartiles, and how kvlab's tokens were read back."""
    newest: dict[tuple, dict[str, Any]] = {}
    for file, (machine, package) in RUNS.items():
        for run in rec.read(file)["recordings"].values():
            weights = "int4" if run.get("weights") == "int4" else run["precision"]
            model = MODELS.get((run["model"].split("-fp")[0].split("-int4")[0], weights))
            if (
                model is None
                or run.get("sides", ["kvlab", "genai"]) != ["kvlab", "genai"]
                or run.get("block", 1) < 2
                or run.get("graph_capture")
                or run.get("check_every") not in (None,)
                or (run.get("buffer_cache_mode") or "bucket") != "bucket"
                or run.get("genai_options")
            ):
                continue  # fmt: skip
            key = (machine, package, model, run["context"])
            if key not in newest or run["environment"]["date"] >= newest[key]["date"]:
                newest[key] = {
                    **dict(zip(("machine", "package", "model", "context"), key)),
                    "ratio": run["ratio_median"],
                    "quartiles": run["ratio_quartiles"],
                    "tokens per read": run.get("tokens_per_read") or 1,
                    "date": run["environment"]["date"],
                }
    return sorted(newest.values(), key=lambda r: (r["machine"], r["package"], r["model"], r["context"]))


def figure(rec: Any) -> Any:
    """Each target cell's newest ratio against the context, one panel per machine, a line per package and model."""
    import plotly.express as px

    rows = cells(rec)
    fig = px.line(rows, x="context", y="ratio", color="model", line_dash="package", facet_col="machine",
                  markers=True, log_x=True, hover_data=["tokens per read", "date"])  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    t = title(
        "kvlab's default static step over onnxruntime-genai's, taken in turns, recorded",
        "kvlab profile --lockstep · blocks of 32 steps, the first 8 left out · tokens equal in every cell",
        "below 1: kvlab's step is shorter · H100: the tokens read back in bursts of 8 (generate's default); "
        "H200: one at a time",
    )
    finish(fig, t, yaxis_title="kvlab / genai (median over pairs)", legend_y=-0.25, height=520)
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1100)
