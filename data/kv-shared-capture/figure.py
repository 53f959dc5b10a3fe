"""Can a KV-shared decoder (Gemma 4's layers that borrow an earlier layer's K, V) run as a captured graph, and what
does capture buy it? kv-shared-toy on an NVIDIA H200's WebGPU, per ONNX Runtime package: the uncaptured
StaticCache's step and the captured one's (``kvshared_ratio.py``); onnxruntime-webgpu 1.27 refuses capture.

    python data/kv-shared-capture/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, finish, go, title

PACKAGES = {"onnxruntime-webgpu": "onnxruntime-webgpu 1.27.0", "plugin-ep": "onnxruntime-ep-webgpu 0.4.0"}


def figure(rec: Any) -> Any:
    """Per package, the uncaptured and the captured decode step (ms); a refusal is named under the title."""
    runs = {p: rec.read(f"{p}/kvshared_ratio.json") for p in PACKAGES}
    fig = go().Figure()
    for key, name in (("static_ms", "StaticCache"), ("captured_ms", "CapturedStaticCache")):
        y = [runs[p].get(key) for p in PACKAGES]
        fig.add_bar(x=list(PACKAGES.values()), y=y, name=name, marker_color=KIND_COLORS["static" if key ==
                    "static_ms" else "genai"], text=[f"{v:.2f} ms" if v else "refused" for v in y])  # fmt: skip
    t = title(
        "kv-shared-toy on an NVIDIA H200: captured or not, recorded",
        f"{runs['plugin-ep']['new_tokens']} new tokens within the 16-position window · {runs['plugin-ep']['reps']} "
        "paired rounds · tokens identical where both ran",
        "onnxruntime-webgpu 1.27 refuses capture by name: its GroupQueryAttention dispatches an empty grid",
    )
    finish(fig, t, barmode="group", yaxis_title="decode step (ms)")
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
