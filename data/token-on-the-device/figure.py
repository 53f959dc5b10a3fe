"""Does keeping the greedy token on the GPU make kvlab's step shorter than onnxruntime-genai's? ``kvlab profile
--phases`` on an NVIDIA H200, phi4-kv (a 1,024-token vocabulary) fp32 and fp16, both ONNX Runtime packages: kvlab's
static step over genai's, paired, with the token chosen on the host and on the device (``phases-h200.json``). The
reductions for a large vocabulary (``argmax-h200.json``, ``rows-*``, ``short-step-h200.json``, ``today-h200.json``):
the README.

    python data/token-on-the-device/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, SHADES, finish, go, title

SECOND_COLORS = {kind: shades[1] for kind, shades in SHADES.items() if len(shades) > 1}  # each kind's second shade

PACKAGES = {"builtin": "onnxruntime-webgpu 1.27", "plugin": "plugin EP 0.4.0"}


def figure(rec: Any) -> Any:
    """kvlab / genai step against the context, one line per package, precision and token path."""
    runs = rec.read("phases-h200.json")["recordings"]
    fig = go().Figure()
    for package, name in PACKAGES.items():
        for precision, model in (("fp32", "phi4-kv"), ("fp16", "phi4-kv-fp16")):
            for token, colors in ((False, KIND_COLORS), (True, SECOND_COLORS)):
                mine = sorted(
                    (r for k, r in runs.items() if k.split("/")[0] == package and r["model"] == model
                     and r["token_on_device"] == token),
                    key=lambda r: r["context"],
                )  # fmt: skip
                fig.add_scatter(
                    x=[r["context"] for r in mine],
                    y=[r["step_ratio"] for r in mine],
                    name=f"{name}, {precision}, token on the {'device' if token else 'host'}",
                    line={"color": colors["static"], "dash": "solid" if precision == "fp32" else "dot"},
                    marker={"symbol": "circle" if package == "builtin" else "diamond"},
                )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    t = title(
        "kvlab's static step over genai's, the token on the host or on the GPU, recorded",
        "phi4-kv on an NVIDIA H200 · kvlab profile --phases · 32 new tokens x 3 paired rounds · tokens equal",
        "below 1: kvlab's step is shorter; one plugin process read x1.136 at fp16 1,024 (again: x0.947, x0.960)",
    )
    finish(fig, t, xaxis_type="log", xaxis_title="context (tokens)", yaxis_title="kvlab / genai", legend_y=-0.3,
           height=560)  # fmt: skip
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
