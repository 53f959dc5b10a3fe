"""Does the Colab recipe (docs/installation.md) work from a pip-only install on a headless NVIDIA Linux, and does the
setting doctor then advises show the difference? The advice's run after the recipe on an NVIDIA H200: phi4-kv fp32
on WebGPU, each cache's decode step at the advised contexts (``advice/results.json``; every step of the recipe:
``logs.txt``).

    python data/colab-recipe/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.bench.chart import bench_figure
from kvlab.lab import recorded


def figure(rec: Any) -> Any:
    """The advice's run as ``kvlab bench`` draws it."""
    return bench_figure(rec.read("advice/results.json"), "phi4-kv", "webgpu")


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
