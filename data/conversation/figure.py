"""How much sooner does a chat that keeps its cache answer than one that re-prefills its history every turn? The
time to first token of a 32-token message after a growing history: kept (only the message's positions fed),
re-prefilled, and onnxruntime-genai's ``append_tokens`` beside them; phi4-kv fp32 on an NVIDIA H200's WebGPU
(``kvlab chat --bench``: ``h200-phi4-kv/``), and SmolLM2 on a 2-core CPU (``ttft-*.json``).

    python data/conversation/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, finish, go, title

SERIES = {"reuse_ttft_ms": ("kept cache", "static"), "reprefill_ttft_ms": ("re-prefill", "dynamic"),
          "genai_ttft_ms": ("onnxruntime-genai append_tokens", "genai")}  # fmt: skip


def figure(rec: Any, run: str = "h200-phi4-kv/results.json") -> Any:
    """One recorded run (``run``): time to first token against the history's length, per way of answering."""
    result = rec.read(run)
    rows = result["rows"]
    fig = go().Figure()
    for key, (name, color) in SERIES.items():
        if key in rows[0]:
            fig.add_scatter(x=[r["history_tokens"] for r in rows], y=[_median(r[key]) for r in rows], name=name,
                            mode="lines+markers", line={"color": KIND_COLORS[color]})  # fmt: skip
    env = result["environment"]
    t = title(
        f"Time to first token against the history, recorded: {result['model']}, cache {result.get('cache', '?')}",
        f"{env.get('backend_package')} {env.get('backend_version')} · {rows[0].get('adapter', env.get('cpu'))} · "
        f"{env.get('date', '')[:10]}",
        "kept: only the new message's positions are fed; re-prefill: the whole history again",
    )
    finish(fig, t, xaxis_title="history before the message (positions)", yaxis_title="time to first token (ms)",
           yaxis_type="log")  # fmt: skip
    return fig


def _median(v: Any) -> float:
    return sorted(v)[len(v) // 2] if isinstance(v, list) else v


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
