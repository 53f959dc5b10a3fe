"""What does packed int8 / int4 KV (the WebGPU plugin EP's ``kvCacheQuantizationBits``) do to a decode step? kv-heavy
on SwiftShader with the plugin EP, each cache with fp32, int8 and int4 KV at 256 tokens (``kvlab bench``). On an
NVIDIA H200's hardware adapter the EP asks for unpacked KV on every model tried (``probe_h200.json``,
``refusals-h200.txt``), so it could not be measured there.

    python data/packed-kv-on-webgpu/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, finish, go, title


def figure(rec: Any) -> Any:
    """Per cache kind, the decode step with each KV precision (ms, median)."""
    result = rec.read("swiftshader/results.json")
    rows = [r for r in result["rows"] if r["context"] == 256]
    fig = go().Figure()
    for kind in ("dynamic", "static"):
        mine = [r for r in rows if r["cache_kind"] == kind]
        names = [r["cache_variant"].removeprefix("kv-") or "fp32" for r in mine]
        fig.add_bar(x=names, y=[r["decode_ms"] for r in mine], name=f"{kind} cache", marker_color=KIND_COLORS[kind])
    env = result["environment"]
    t = title(
        "Packed KV on the WebGPU plugin EP, recorded",
        f"kv-heavy · {rows[0]['adapter']} · {env['backend_package']} {env['backend_version']} · 256 tokens · paired",
        "the static cache's step barely moves; the dynamic cache's grows 3.6-4x (repacking every step)",
    )
    finish(fig, t, barmode="group", xaxis_title="KV precision", yaxis_title="decode step (ms)")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
