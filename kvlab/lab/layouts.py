"""KV cache memory per cache layout, drawn: the exact bytes each architecture's cache needs against the context,
computed from its layout (``kvlab.core.cache_layout``), with measured points beside. It reads layouts, not records; it
never runs a model. ``kvlab.lab.plots`` re-exports ``memory_by_layout``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .style import finish, go, title, unit

ARCH_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")


def memory_by_layout(
    layouts: dict[str, Any],
    *,
    max_length: int,
    points: Sequence[tuple[str, Sequence[tuple[int, float]]]] = (),
    common: str = "",
    note: str = "",
) -> Any:
    """KV cache memory against the context, one line per cache layout (``{legend name: model.info.layout}``): the
    exact bytes a cache holding ``n`` tokens needs (``layout.report(n)``: the growing entries at ``n`` positions
    plus one copy of every fixed-size state), from 0 to ``max_length`` tokens. ``points``: (legend name, [(length,
    bytes), ...]) measured elsewhere, drawn as markers on the same axes (a name ending in "(recorded)" gets open
    squares, any other filled diamonds)."""
    fig = go().Figure()
    lengths = np.linspace(0, max_length, 65).astype(int)
    top = max(layout.report(max_length).total_bytes for layout in layouts.values()) if layouts else 0
    scale, units = unit(top)
    for (name, layout), color in zip(layouts.items(), ARCH_COLORS * 4):
        fig.add_scatter(
            x=lengths,
            y=[layout.report(int(n)).total_bytes / scale for n in lengths],
            mode="lines",
            name=name,
            line={"color": color, "width": 2},
            hovertemplate=f"%{{x}} tokens<br>%{{y:.3f}} {units}<extra>%{{fullData.name}}</extra>",
        )
    for name, pts in points:
        recorded = name.endswith("(recorded)")
        fig.add_scatter(
            x=[p[0] for p in pts],
            y=[p[1] / scale for p in pts],
            mode="markers",
            name=name,
            marker={
                "symbol": "square-open" if recorded else "diamond",
                "size": 11 if recorded else 9,
                "color": "#333" if recorded else "#d62728",
                "line": {"width": 2 if recorded else 1, "color": "#333"},
            },
            hovertemplate=f"%{{x}} tokens<br>%{{y:.3f}} {units}<extra>%{{fullData.name}}</extra>",
        )
    t = title("KV cache memory against the context, per architecture", common, note)
    finish(
        fig,
        t,
        legend_y=-0.2,
        xaxis_title="tokens held (cache length)",
        yaxis_title=f"KV cache memory ({units})",
        yaxis_rangemode="tozero",
        xaxis_rangemode="tozero",
        height=480,
    )
    return fig
