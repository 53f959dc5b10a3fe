"""Where does a static-cache decode step's time go on the CPU EP? ONNX Runtime's own profiler over SmolLM2-135M fp32
decode steps at 256 and 3,072 tokens of context (``kvlab profile``), each operator type's share of the step.

    python data/where-a-cpu-step-goes/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title

MAIN = ("MatMul", "GroupQueryAttention", "SkipSimplifiedLayerNormalization", "(between nodes)")


def figure(rec: Any) -> Any:
    """One bar per recorded context, split into the main operator types' shares and the rest."""
    fig = go().Figure()
    profiles = {f"{c:,} tokens": rec.read(f"ops_{c}.csv") for c in (256, 3072)}
    for part in (*MAIN, "other ops"):
        shares = [
            sum(
                r["share"] for r in rows if (r["op"] if r["op"] in MAIN else "other ops") == part and r["op"] != "(run)"
            )
            for rows in profiles.values()
        ]
        fig.add_bar(y=list(profiles), x=shares, name=part, orientation="h", text=[f"{s:.0%}" for s in shares])
    t = title(
        "One decode step's time by ONNX operator, recorded",
        "SmolLM2-135M fp32 · CPU EP · StaticCache · ONNX Runtime's profiler · 2-core AMD EPYC",
        "at 3,072 tokens the attention kernel reads the whole cache every step",
    )
    finish(fig, t, legend_y=-0.4, barmode="stack", height=360, xaxis_tickformat=".0%", xaxis_title="share of the step")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
