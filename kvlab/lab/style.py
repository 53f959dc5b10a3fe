"""kvlab's one visual language: a fixed colour per cache kind, titles that say what produced the numbers, legends
below the plot, units that fit the values, and the WebGPU bucket lines. It formats labels; nothing parses them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.buckets import MiB, bucket_positions
from ..core.labels import CacheSpec, DeviceLabel

# the shades of each cache kind, in the order runs of that kind get them; the first is the kind's colour everywhere
# (notebooks, charts, the CacheLab dashboard), the second marks a second size of the same kind
SHADES = {
    "dynamic": ("#1f77b4", "#17becf", "#0b3d6b", "#6f9fd8"),
    "static": ("#d62728", "#ff7f0e", "#8c1d18", "#e377c2"),
    "genai": ("#2ca02c", "#98df8a"),
    "matmuls only": ("#7f7f7f",),
}
KIND_COLORS = {kind: shades[0] for kind, shades in SHADES.items()}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22")
MODE_DASHES = {"": "solid", "bucket": "solid", "disabled": "dash", "simple": "dot", "lazyRelease": "dashdot"}
# ticks of a log axis, labelled in full (plotly's own "D2" ticks label 20 and 50 as "2" and "5")
LOG_TICKS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
PNG_RENDERER, PNG_ATTEMPTS = "kvlab_png", 3


def run_color(kind: str, index: int) -> str:
    """The colour of the ``index``-th run (0-based) of a cache kind: the kind's shades in turn."""
    shades = SHADES.get(kind) or OTHER_COLORS[:1]
    return shades[index % len(shades)]


def kind_colors(kinds: Iterable[tuple[str, Any]]) -> list[str]:
    """A colour per (kind, size), in order: the kind's colour for its first size, its second shade for the next
    one, then other colours."""
    out, seen = [], {}
    for kind, size in kinds:
        sizes = seen.setdefault(kind, {})  # size -> its index among the kind's sizes
        i = sizes.setdefault(size, len(sizes))
        palette = SHADES.get(kind, ())[:2]
        out.append(palette[i] if i < len(palette) else OTHER_COLORS[(len(out) + i) % len(OTHER_COLORS)])
    return out


def cache_colors(specs: Iterable[CacheSpec]) -> list[str]:
    """``kind_colors`` of caches: a size is the cache's (max_cache_len, variant)."""
    return kind_colors((s.kind, (s.max_cache_len, s.variant)) for s in specs)


def runtime_text(device: DeviceLabel) -> str:
    """Which runtime ran a device, e.g. 'CPU EP of onnxruntime-webgpu 1.27.0' or 'torch 2.13.0 (cuda)'."""
    if device.backend.startswith("onnxruntime"):
        ep = {"cpu": "CPU EP", "webgpu": "WebGPU EP"}.get(device.name, device.name)
        return f"{ep} of {device.runtime}"
    return f"{device.runtime} ({device.name})" if device.runtime else device.name


def device_text(device: DeviceLabel, prefill: DeviceLabel | None = None) -> str:
    """The device's label, plus the prefill's device when a run began on another one."""
    text = str(device)
    if prefill is not None and prefill.name != device.name:
        text += f", prefill on {prefill.name} + handoff"
    return text


def title(what: str, common: str, note: str = "") -> dict[str, Any]:
    """A plotly title: ``what`` in bold, then ``common`` (what every trace shares) and ``note`` in small type."""
    text = f"<b>{what}</b><br><sup>{common}{'<br>' + note if note else ''}</sup>"
    return {"text": text, "x": 0.01, "xanchor": "left", "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 30}}


def top_margin(t: dict[str, Any], extra: int = 0) -> dict[str, int]:
    """A top margin that fits the title's lines (and ``extra`` pixels, e.g. for subplot titles)."""
    return {"t": 75 + 17 * t["text"].count("<br>") + extra}


def legend_below(y: float = -0.18) -> dict[str, Any]:
    """A horizontal legend under the plot, its top at ``y`` (in plot fractions)."""
    return {"orientation": "h", "yanchor": "top", "y": y, "xanchor": "left", "x": 0}


def finish(fig: Any, t: dict[str, Any], *, legend_y: float = -0.18, top_extra: int = 0, **layout: Any) -> Any:
    """What every kvlab figure ends with: the title ``t`` (from ``title``) with a top margin that fits its lines
    (plus ``top_extra`` pixels; ``layout``'s ``margin`` adds the other sides), the legend below the plot at
    ``legend_y``, the white template, and ``layout``, the figure's own settings (axes, height, barmode), all in one
    ``fig.update_layout``. Returns ``fig``."""
    margin = {**top_margin(t, top_extra), **layout.pop("margin", {})}
    fig.update_layout(title=t, legend=legend_below(legend_y), template="plotly_white", margin=margin, **layout)
    return fig


def unit(max_bytes: float) -> tuple[float, str]:
    """(bytes per unit, unit name) that reads ``max_bytes`` best: MiB from 4 MiB, KiB from 4 KiB, else bytes."""
    if max_bytes >= 4 * MiB:
        return MiB, "MiB"
    if max_bytes >= 4 * 1024:
        return 1024, "KiB"
    return 1, "bytes"


def add_bucket_lines(fig: Any, bytes_per_tensor_token: float | None, xmax: float) -> str:
    """Dotted lines where one KV tensor reaches each WebGPU bucket size, inside the x range; returns a note for
    the title naming those beyond it ("" without ``bytes_per_tensor_token``)."""
    if not bytes_per_tensor_token:
        return ""
    beyond = []
    for mib, pos in bucket_positions(bytes_per_tensor_token).items():
        if pos <= xmax * 1.02:
            fig.add_vline(
                x=pos,
                line={"dash": "dot", "color": "#888", "width": 1},
                annotation={"text": f"KV tensor {mib} MiB", "textangle": -90, "font": {"size": 10, "color": "#666"}},
                annotation_position="top left",
            )
        else:
            beyond.append(f"{mib} MiB at {pos:,}")
    per = f"{bytes_per_tensor_token:,.0f} bytes/token per KV tensor"
    if beyond:
        return f"WebGPU buckets: {per}; beyond this range: {', '.join(beyond)} tokens"
    return f"WebGPU buckets drawn ({per})"


def go() -> Any:
    """``plotly.graph_objects``, imported on first use (importing kvlab.lab does not import plotly)."""
    import plotly.graph_objects as graph_objects

    return graph_objects


def static_images() -> str:
    """From now on every plotly figure a notebook shows also carries a PNG of itself (900 px wide, rendered by
    ``retrying_png``), for static viewers; without kaleido and a Chromium figures stay interactive only. Returns a
    sentence saying which, for the notebook to print."""
    import logging

    import plotly.io as pio

    # kaleido's browser driver logs a traceback into the cell when it skips a message it could not decode (it goes
    # on, and the PNG is made); a lesson's output is no place for it
    logging.getLogger("choreographer").setLevel(logging.CRITICAL)
    try:
        pio.to_image(go().Figure(), format="png", width=16, height=16)
    except Exception as exc:  # kaleido missing or no browser: keep the interactive charts only
        return f"static PNG copies off ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
    pio.renderers[PNG_RENDERER] = retrying_png(pio.renderers["png"], 900)
    pio.renderers.default = f"plotly_mimetype+{PNG_RENDERER}"
    return "each chart also saved as a PNG (for static viewers)"


def retrying_png(base: Any, width: int) -> Any:
    """A copy of plotly's PNG renderer ``base`` at ``width`` px (the figure's own height) that tries
    ``PNG_ATTEMPTS`` times, then adds nothing (the interactive figure still shows)."""

    class RetryingPng(type(base)):
        def to_mimebundle(self, fig_dict: Any) -> dict[str, Any]:
            for _ in range(PNG_ATTEMPTS):
                try:
                    return super().to_mimebundle(fig_dict)
                except Exception:  # kaleido's error types vary with its version; a PNG is optional
                    continue
            return {}

    renderer = RetryingPng()
    renderer.width, renderer.height = width, None
    return renderer
