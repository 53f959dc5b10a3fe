"""What does quantizing the KV cache cost in quality, per byte saved? SmolLM2-135M over 4,096 tokens of real text in
PyTorch, teacher-forced: each KV precision's bytes per token against how often its next-token choice agrees with
float32's (``python data/kv-quality/kv_quality.py``).

    python data/kv-quality/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title


def figure(rec: Any) -> Any:
    """One point per KV precision: bytes per token against top-1 agreement with float32, its perplexity beside it."""
    q = rec.read("kv-quality.json")
    rows = q["rows"]
    fig = go().Figure()
    fig.add_scatter(
        x=[r["kv_bytes_per_token"] for r in rows],
        y=[r["top1_agreement"] for r in rows],
        mode="markers+text",
        text=[f"{r['kv_precision']} ({r['backend']}): ppl {r['perplexity']:.1f}" for r in rows],
        textposition="middle right",
        marker={"size": 11},
        showlegend=False,
    )
    t = title(
        "Quantized KV: bytes per token against agreement with float32, recorded",
        f"{q['model']} · {q['n_tokens']:,} tokens of real text, teacher-forced · PyTorch",
        f"recorded {q['environment']['date'][:10]}",
    )
    finish(fig, t, xaxis_type="log", xaxis_title="KV bytes per token (log)", yaxis_title="top-1 agreement",
           yaxis_tickformat=".0%", xaxis_range=[3.5, 5.0])  # fmt: skip
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
