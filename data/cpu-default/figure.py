"""How much does kvlab's CPU EP step slow down when other processes compete for the cores, beside onnxruntime-genai?
kvlab's static cache and genai, quiet and loaded, paired by round, on a 2-core machine and a 16-core one, for the
default of the time (one thread fewer than the physical cores) and ONNX Runtime's (``kvlab bench --under-load``).
The default kvlab has since: ``record.py``.

    python data/cpu-default/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, SHADES, finish, go, title

SECOND_COLORS = {kind: shades[1] for kind, shades in SHADES.items() if len(shades) > 1}  # each kind's second shade

RUNS = {  # (machine, competing processes): recording
    ("2 cores", 1): "one-fewer-2-core/load1.json",
    ("2 cores", 2): "one-fewer-2-core/load2.json",
    ("16 cores", 1): "one-fewer-16-core/load1.json",
    ("16 cores", 16): "one-fewer-16-core/load16.json",
}
SETTINGS = {"default": "one thread fewer", "ort": "ONNX Runtime's default"}


def figure(rec: Any) -> Any:
    """Loaded over quiet step per run and setting: kvlab's static cache and genai side by side."""
    fig = go().Figure()
    x = [f"{machine}, {n} competing" for machine, n in RUNS]
    rows = [{r["setting"]: r for r in rec.read(f)["rows"]} for f in RUNS.values()]
    for setting, name in SETTINGS.items():
        for who, colors in (("kvlab static", KIND_COLORS), ("genai", SECOND_COLORS)):
            y = [r[setting]["variants"][who]["loaded_over_quiet"] for r in rows]
            fig.add_bar(x=x, y=y, name=f"{who}, {name}", text=[f"x{v:.2f}" for v in y],
                        marker_color=colors["static" if who == "kvlab static" else "genai"],
                        marker_pattern_shape="" if setting == "default" else "/")  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    t = title(
        "CPU EP under load: loaded / quiet decode step, recorded",
        "SmolLM2-135M fp32 · 1,024 tokens · paired by round · tokens equal",
        "2 cores: a quiet development VM; 16 cores: an NVIDIA H200 machine's CPU",
    )
    finish(fig, t, barmode="group", yaxis_title="loaded / quiet", legend_y=-0.25)
    return fig


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
