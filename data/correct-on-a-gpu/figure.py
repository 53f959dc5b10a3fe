"""Does kvlab decode correctly on a real GPU's WebGPU? ``kvlab conformance`` on an NVIDIA H200: each model's WebGPU
logits against the CPU EP's, prefill and decode, in fp32, fp16 and int4 (``conformance.txt``).

    python data/correct-on-a-gpu/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title

LINE = re.compile(r"^(\S+)\s+(prefill|decode)\s+max \|diff\| (\S+) \(atol (\S+)\).*argmax differs at (\d+)/(\d+)", re.M)


TITLE = (  # the figure's title, subtitle and note
    "WebGPU logits against the CPU EP's on an NVIDIA H200, recorded",
    "kvlab conformance · onnxruntime-webgpu 1.27.0 · random-weight presets",
    "fp32 agrees to 1e-6-3e-4; fp16 and int4 run float16 activations against a CPU EP that computes in float32",
)


def table(rec: Any) -> list[dict[str, Any]]:
    """One row per model and phase: the largest logit difference, the tolerance, the positions whose argmax differs."""
    return [
        {"model": m, "phase": phase, "max diff": float(d), "atol": float(a), "argmax differs": f"{n}/{of}"}
        for m, phase, d, a, n, of in LINE.findall(rec.read("conformance.txt"))
    ]


def figure(rec: Any) -> Any:
    """The largest logit difference against the CPU EP per model, prefill and decode (log scale)."""
    rows = table(rec)
    fig = go().Figure()
    for phase in ("prefill", "decode"):
        mine = [r for r in rows if r["phase"] == phase]
        fig.add_bar(x=[r["model"] for r in mine], y=[r["max diff"] for r in mine], name=phase,
                    text=[f"argmax {r['argmax differs']}" for r in mine])  # fmt: skip
    finish(fig, title(*TITLE), barmode="group", yaxis_type="log", yaxis_title="max |logit difference|")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
