"""What does a static cache buy in PyTorch on a GPU, eager and as a CUDA graph? ms per decode token of SmolLM2-135M
fp16 and Llama-3.2-1B's shape in bf16 on an NVIDIA H200: eager DynamicCache, eager StaticCache, transformers'
compiled static cache and kvlab's CUDA-graph runner (``python -m kvlab.bench.pytorch``; record: see ``record*.py``
where present, the exact commands in the README).

    python data/pytorch-cuda-graphs/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title

RUNS = {"SmolLM2-135M fp16": "smollm2-135m_float16", "Llama-1B bf16": "llama-1b_bfloat16"}  # the full runs
MODES = {
    "eager-dynamic": "eager DynamicCache",
    "eager-static": "eager StaticCache",
    "hf-static-compile": "transformers, static + compile",
    "graph-capture": "kvlab CUDA graph, capture-only",
    "graph-compile": "kvlab CUDA graph, compiled",
}


def figure(rec: Any) -> Any:
    """ms per token per mode (log scale), one group of bars per model."""
    fig = go().Figure()
    results = {name: rec.read(f"{stem}.json")["results"] for name, stem in RUNS.items()}
    for mode, name in MODES.items():
        y = [results[m].get(mode, {}).get("ms_per_token") for m in RUNS]
        fig.add_bar(x=list(RUNS), y=y, name=name, text=[f"{v:.2f}" if v else "" for v in y])
    env = rec.read(f"{RUNS['SmolLM2-135M fp16']}.json")["environment"]
    t = title(
        "PyTorch decode on an NVIDIA H200: ms per token, recorded",
        f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']} · random weights · 512-token "
        "prompt, 256 new tokens",
        "a static cache is what lets the step be captured as one CUDA graph",
    )
    finish(fig, t, barmode="group", yaxis_type="log", yaxis_title="ms per token (log)", legend_y=-0.22)
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
