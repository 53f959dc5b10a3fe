"""Does a static cache still pay where layers keep less than every position (sliding windows, linear attention,
convolutions)? The five toy presets beyond full attention on an NVIDIA H200's WebGPU, each cache's decode step
(``kvlab bench``).

    python data/beyond-full-attention/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvlab.bench.chart import paired
from kvlab.lab import recorded
from kvlab.lab.style import finish, go, title


def figure(rec: Any) -> Any:
    """Per preset and context, the static cache's step over the dynamic cache's (paired; below 1 the static one is
    shorter)."""
    rows = rec.results["rows"]
    by = {(r["model"], r["context"], r["cache_kind"]): r for r in rows if r["runner"] == "kvlab"}
    fig = go().Figure()
    for context in sorted({r["context"] for r in rows}):
        models = sorted({m for m, c, _ in by if c == context})
        ratios = [paired(by.get((m, context, "static")), by.get((m, context, "dynamic"))) for m in models]
        fig.add_bar(x=models, y=ratios, name=f"{context:,} tokens", text=[f"x{r:.2f}" for r in ratios])
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    t = title(
        "Beyond full attention: static over dynamic decode step, recorded",
        f"WebGPU on {rows[0]['adapter']} · {rows[0]['new_tokens']} new tokens · paired rounds",
        "below 1: the static cache's step is shorter",
    )
    finish(fig, t, barmode="group", yaxis_title="static / dynamic (paired)")
    return fig


def by_preset(rec: Any, presets: Sequence[str], growing: Any) -> Any:
    """The recorded decode steps as a table: one column per preset of ``presets`` (in that order), with its growing
    layers (``growing[preset]``), and per recorded context each cache's mean decode ms, the paired ratio static /
    dynamic (the median over rounds of each round's ratio) and the dynamic cache's new buffers per step. A pandas
    DataFrame (rows: the quantities); KeyError for a preset or context the recording lacks."""
    import numpy as np
    import pandas as pd

    by = {(r["model"], r["context"], r["cache_kind"]): r for r in rec.results["rows"]}
    rows = []
    for name in presets:
        row = {"preset": name, "growing layers": growing[name]}
        for context in sorted({c for _, c, _ in by}):
            d, s = by[(name, context, "dynamic")], by[(name, context, "static")]
            row[f"{context}: dynamic ms"] = round(d["decode_ms"], 2)
            row[f"{context}: static ms"] = round(s["decode_ms"], 2)
            ratio = np.median(np.array(s["decode_ms_runs"]) / np.array(d["decode_ms_runs"]))
            row[f"{context}: static / dynamic"] = round(float(ratio), 2)
            row[f"{context}: new buffers / step (dynamic)"] = int(d["new_buffers_per_step"])
        rows.append(row)
    return pd.DataFrame(rows).set_index("preset").T


def dynamic_points(rec: Any) -> list[tuple[int, int]]:
    """(length, bytes) per recorded dynamic-cache run: the KV bytes it allocated per decode step, at the mean length
    of its steps (its context plus half its new tokens)."""
    return [
        (r["context"] + r["new_tokens"] // 2, r["bytes_per_step"])
        for r in rec.results["rows"]
        if r["cache_kind"] == "dynamic"
    ]


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
