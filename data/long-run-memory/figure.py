"""Over a long generation on a real GPU, does a static cache's device memory stay flat while a dynamic cache's grows?
A recorded ``kvlab trace`` (one long generation per cache from the same prompt): per decode step its wall time and
the GPU memory the process holds after it (NVML).

    python data/long-run-memory/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvlab.lab.style import KIND_COLORS, MiB, finish, title


def figure(rec: Any, file: str = "trace_phi4-kv_fp16.json") -> Any:
    """A recorded ``kvlab trace`` (one long generation per cache from the same prompt): per decode step its wall
    time, and the GPU memory the process holds after it (NVML: the driver's per-process accounting, a measurement
    of the whole process), with the KV tensors the runtime allocated per step (kvlab's exact count) in the legend."""
    from plotly.subplots import make_subplots

    trace = rec.read(file)

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
    finish(fig, t, legend_y=-0.15, height=560)
    return fig


if __name__ == "__main__":
    from pathlib import Path

    from kvlab.lab import recorded

    here = recorded.load(Path(__file__).parent.name)
    figure(here).write_image(here.folder / "figure.png", width=1000, height=560)
