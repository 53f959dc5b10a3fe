"""How much sooner does a chat that keeps its cache answer than one that re-prefills its history every turn? The
time to first token of a 32-token message after a growing history: kept (only the message's positions fed),
re-prefilled, and onnxruntime-genai's ``append_tokens`` beside them; phi4-kv fp32 on an NVIDIA H200's WebGPU
(``kvlab chat --bench``: ``h200-phi4-kv/``), and SmolLM2 on a 2-core CPU (``ttft-*.json``). Notebook 09 draws every
run (``runs``), each as a table (``table``) and a figure (``figure``).

    python data/conversation/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, OTHER_COLORS, finish, go, title

TTFT_COLUMNS = {"history_tokens", "reuse_ttft_ms", "reprefill_ttft_ms"}  # what a recorded TTFT row holds
# genai's line lies on the kept cache's (the same cost): drawn first, wider and dashed, so both show
SERIES = (
    ("genai_ttft_ms", "onnxruntime-genai append_tokens", {"color": KIND_COLORS["genai"], "width": 6, "dash": "dash"},
     "square"),
    ("reuse_ttft_ms", "kept cache", {"color": KIND_COLORS["static"], "width": 2}, "circle"),
    ("reprefill_ttft_ms", "re-prefill", {"color": OTHER_COLORS[0], "width": 2}, "diamond"),
)  # fmt: skip


def runs(rec: Any, min_turns: int = 0) -> list[str]:
    """The recorded time-to-first-token runs in the folder (``ttft-*.json`` and ``*/results.json`` of ``kvlab
    chat --bench``: rows of kept against re-prefilled turns) of at least ``min_turns`` rows, by file name; other
    recordings there (a held-out check, a profile) are left out."""
    out = []
    for name in sorted(rec.files("ttft-*.json") + rec.files("*/results.json")):
        rows = rec.read(name).get("rows")
        if rows and len(rows) >= min_turns and all(isinstance(r, dict) and r.keys() >= TTFT_COLUMNS for r in rows):
            out.append(name)
    return out


def table(rec: Any, run: str) -> Any:
    """One run as a pandas frame: history, the kept and the re-prefilled time to first token (medians, ms), their
    ratio."""
    import pandas as pd

    rows = rec.read(run)["rows"]
    out = pd.DataFrame([{"history": r["history_tokens"], "kept ms": _median(r["reuse_ttft_ms"]),
                         "re-prefill ms": _median(r["reprefill_ttft_ms"])} for r in rows])  # fmt: skip
    out["ratio"] = out["kept ms"] / out["re-prefill ms"]
    return out


def figure(rec: Any, run: str = "h200-phi4-kv/results.json") -> Any:
    """One recorded run: time to first token against the history's length, kept, re-prefilled (and genai's
    append_tokens where it was measured, under the kept cache's line it lies on), on a log scale."""
    result = rec.read(run)
    rows, env = result["rows"], result.get("environment", {})
    fig = go().Figure()
    for key, name, line, symbol in SERIES:
        if key in rows[0]:
            marker = {"symbol": symbol, "size": 10 if key == "genai_ttft_ms" else 7}
            fig.add_scatter(x=[r["history_tokens"] for r in rows], y=[_median(r[key]) for r in rows], name=name,
                            mode="lines+markers", line=line, marker=marker)  # fmt: skip
    where = rows[0].get("adapter") or env.get("cpu", "?")
    t = title(
        f"RECORDED: time to first token vs history, {result['model']} ({rows[0].get('dtype', 'float32')}), cache "
        f"{result.get('cache', '?')}",
        f"{env.get('backend_package', '?')} {env.get('backend_version', '?')} · "
        f"{rows[0].get('device', result.get('device'))} [{where}] · {env.get('date', 'undated')} · commit "
        f"{env.get('commit', '?')}",
        f"file data/{rec.question}/{run}",
    )
    finish(fig, t, xaxis_title="history before the message (positions)", yaxis_title="time to first token (ms)",
           yaxis_type="log", height=440)  # fmt: skip
    return fig


def _median(v: Any) -> float:
    return statistics.median(v) if isinstance(v, list) else v


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
