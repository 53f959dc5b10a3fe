"""Does a sliding layer's ring buffer keep its cache flat past the window? kvlab's RingStaticCache against a
StaticCache holding every position, on sliding-toy (CPU EP of onnxruntime 1.31.1): the exact cache bytes the held
tokens need after every step (``record_ring.py``).

    python data/ring-buffer/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, SHADES, finish, go, title

SECOND_COLORS = {kind: shades[1] for kind, shades in SHADES.items() if len(shades) > 1}  # each kind's second shade


def figure(rec: Any) -> Any:
    """The bytes each cache's held tokens need, against the cache length, step by step."""
    run = rec.results
    fig = go().Figure()
    for key, name, color in (("static", "StaticCache", KIND_COLORS["static"]), ("ring", "RingStaticCache",
                                                                               SECOND_COLORS["static"])):  # fmt: skip
        fig.add_scatter(x=run[key]["length"], y=run[key]["used_cache_bytes"], name=name, line={"color": color})
    env = run["environment"]
    t = title(
        "A ring buffer for the sliding layers, recorded",
        f"{run['model']} · CPU EP of onnxruntime {env['versions']['onnxruntime']} · {run['prompt_tokens']} prompt + "
        f"{run['new_tokens']} new tokens · tokens equal: {run['tokens_equal']}",
        f"recorded {env['date'][:10]}; bytes the held tokens need (exact)",
    )
    finish(fig, t, xaxis_title="cache length (positions)", yaxis_title="bytes", yaxis_rangemode="tozero")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
