"""Does prompt lookup (drafting the next tokens from the prompt and verifying them in one step) make decoding faster
on a real GPU? Why not on onnxruntime-webgpu 1.27: a step of 1, 2 or 5 tokens on phi4-kv on an NVIDIA H200, against
the past it attends to (``conversation_bench.py steps``, in ``../conversation/``): the multi-token steps grow with
the past, the one-token step does not.

    python data/prompt-lookup/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title

TITLE = (  # the figure's title, subtitle and note
    "A step of 1, 2 or 5 tokens against the past, recorded",
    "phi4-kv · WebGPU on an NVIDIA H200 · onnxruntime-webgpu 1.27.0 · StaticCache",
    "a verify step of 2-5 tokens grows with the past (0.035 ms a position in fp32); a one-token step stays flat",
)


def figure(rec: Any) -> Any:
    """Step time against the context per step width (1, 2, 5 tokens), fp32 and fp16."""
    fig = go().Figure()
    for precision, dash in (("fp32", "solid"), ("fp16", "dot")):
        rows = rec.read(f"h200/steps-{precision}-phi4-kv-webgpu.json")["rows"]
        for width in (1, 2, 5):
            fig.add_scatter(x=[r["context"] for r in rows], y=[r[f"step_ms_{width}"] for r in rows],
                            name=f"{precision}, {width} token{'s' if width > 1 else ''} a step",
                            line={"dash": dash}, mode="lines+markers")  # fmt: skip
    finish(fig, title(*TITLE), xaxis_type="log", xaxis_title="past (positions)", yaxis_title="step (ms)")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
