"""Where a KV cache's memory goes: bytes per token predicted from a model's config, the bytes a cache layout holds
at a length under a KV precision and a sliding-window policy, how many tokens fit a budget, and the figures and the
widget that show them. Arithmetic on a ``CacheLayout`` (its ``report`` is the exact count a cache allocates on ONNX
Runtime) or on a config; nothing here runs a model. The quantized formats cost what transformers' QuantizedCache
(``kvlab.pytorch.quantized``) stores, without its residual window of unquantized positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.cache_layout import CacheLayout, SlidingWindow
from ..core.errors import ConfigError, check_choice, check_int
from .style import finish, go, title, unit

GiB = 2**30
GROUP = 64  # values per scale and zero point in kvlab's integer KV formats
# KV precision -> (bytes one key or value element costs, where it runs)
KV_FORMATS: dict[str, tuple[float, str]] = {
    "model": (0.0, "the model's own dtype (any backend)"),
    "float16": (2.0, "an fp16 build of the model (ONNX Runtime, PyTorch)"),
    "int8": (1 + 8 / GROUP, "PyTorch QuantizedCache, HQQ 8 bits"),
    "fp8": (1.0, "PyTorch QuantizedCache, float8_e4m3, one scale per tensor"),
    "int4": (0.5 + 8 / GROUP, "PyTorch QuantizedCache, optimum-quanto 4 bits"),
    "int2": (0.25 + 8 / GROUP, "PyTorch QuantizedCache, optimum-quanto 2 bits"),
}


def config_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int:
    """KV bytes one token adds, from a Hugging Face config alone: 2 (K and V) x kv heads x head_dim x
    ``dtype_bytes``, summed over the layers that keep their own KV (full or sliding attention; not linear-attention
    or conv layers, nor the last ``num_kv_shared_layers``). A layer's head_dim is its ``per_layer_config`` entry's,
    else ``head_dim``, else hidden_size / num_attention_heads."""
    config = config.get("text_config", config)
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    own = layers - (config.get("num_kv_shared_layers") or 0)
    default_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_layer = config.get("per_layer_config") or {}
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    total = 0
    for i, kind in enumerate(types[:own]):
        if kind in ("full_attention", "sliding_attention"):
            total += 2 * kv_heads * per_layer.get(str(i), {}).get("head_dim", default_dim) * dtype_bytes
    return total


def _scale(layout: CacheLayout, kv_precision: str) -> float:
    """A key or value element's bytes at ``kv_precision`` over its bytes in the model's dtype."""
    check_choice(kv_precision, KV_FORMATS, "kv_precision=")
    return (KV_FORMATS[kv_precision][0] or layout.dtype.itemsize) / layout.dtype.itemsize


def kv_bytes(layout: CacheLayout, length: int, kv_precision: str = "model", window: int | None = None) -> float:
    """Bytes a cache of ``layout`` holds at ``length`` positions: one copy of every fixed state (in the model's
    dtype) plus each growing layer's keys and values at ``kv_precision``. ``window``: None, a sliding layer holds
    every position (as a plain cache over the model's graph does); an int W, at most W (a ring buffer). With the
    model's precision and no window this is ``layout.report(length).total_bytes`` exactly. ConfigError for a negative
    ``length``, a ``window`` below 1, an unknown ``kv_precision``."""
    length, window, scale = check_int(length, "length", 0), _window(window), _scale(layout, kv_precision)
    grown = 0
    for layer in layout.layers:
        held = length if window is None or not isinstance(layer.kind, SlidingWindow) else min(length, window)
        grown += held * layer.bytes_per_token
    return layout.fixed_bytes + grown * scale


def _window(window: object) -> int | None:
    return None if window is None else check_int(window, "window", 1, note=" (positions a sliding layer holds)")


@dataclass(frozen=True)
class Fit:
    """How many tokens a budget holds: ``tokens`` (None: no limit, nothing grows past the window), the bytes
    those tokens need, and, for a ``max_cache_len``, whether a cache reserving that many positions fits."""

    tokens: int | None
    bytes_needed: float
    budget_bytes: int
    max_cache_len: int | None = None
    reserve_fits: bool | None = None

    def __str__(self) -> str:
        room = f"{self.budget_bytes / GiB:g} GiB"
        if self.tokens is None:
            text = f"no limit in {room}: nothing grows past the window ({self.bytes_needed:,.0f} bytes in all)"
        else:
            text = f"{self.tokens:,} tokens fit in {room} ({self.bytes_needed:,.0f} bytes)"
        if self.max_cache_len is not None:
            verdict = "fits" if self.reserve_fits else "does NOT fit"
            text += f"; a cache reserving max_cache_len={self.max_cache_len:,} {verdict}"
        return text


def tokens_that_fit(
    layout: CacheLayout,
    budget_bytes: int,
    *,
    kv_precision: str = "model",
    window: int | None = None,
    max_cache_len: int | None = None,
) -> Fit:
    """The most positions whose ``kv_bytes`` (same arguments) stay within ``budget_bytes``; 0 when the fixed
    states alone do not fit, None when no layer grows past ``window``. With ``max_cache_len``, also whether
    reserving that many positions fits (a StaticCache reserves all of them before the first token). ConfigError
    for a budget that is not a whole number of bytes >= 0, and as ``kv_bytes``."""
    budget_bytes = check_int(budget_bytes, "budget_bytes", 0, note=" (bytes; e.g. 4 * 2**30 for 4 GiB)")
    window = _window(window)
    if max_cache_len is not None:
        max_cache_len = check_int(max_cache_len, "max_cache_len", 1)
    scale = _scale(layout, kv_precision)
    room = budget_bytes - layout.fixed_bytes
    every = sum(layer.bytes_per_token for layer in layout.layers) * scale
    windowed = [isinstance(layer.kind, SlidingWindow) and window is not None for layer in layout.layers]
    unbounded = sum(layer.bytes_per_token for layer, w in zip(layout.layers, windowed) if not w) * scale
    if room < 0:
        tokens: int | None = 0
    elif every == 0 or (window is not None and room >= window * every and unbounded == 0):
        tokens = None
    elif window is None or room < window * every:
        tokens = int(room // every)
    else:  # past the window only the unbounded layers grow
        tokens = int((room - window * (every - unbounded)) // unbounded)
    held = kv_bytes(layout, (window if tokens is None else tokens) or 0, kv_precision, window)
    reserve = None if max_cache_len is None else kv_bytes(layout, max_cache_len, kv_precision, window) <= budget_bytes
    return Fit(tokens, held, budget_bytes, max_cache_len, reserve)


COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#d62728")


@dataclass(frozen=True)
class Line:
    """One curve of ``bytes_figure``: ``bytes_at`` per length, drawn solid when ``exact`` (a count) and dashed
    otherwise (a prediction); ``per_token`` is the bytes per token named beside it in the legend."""

    name: str
    bytes_at: Sequence[float]
    per_token: float
    exact: bool = True


def exact_lines(layouts: dict[str, CacheLayout], lengths: Sequence[int]) -> list[Line]:
    """A ``Line`` per layout (legend name -> layout): the bytes its cache holds at each of ``lengths``, exactly."""
    return [
        Line(name, [layout.report(n).total_bytes for n in lengths], layout.bytes_per_token)
        for name, layout in layouts.items()
    ]


def format_of(kv_precision: str) -> str:
    """The format a KV precision of ``KV_FORMATS`` stands for, without its runtime: 'HQQ 8 bits' for int8.
    ConfigError for an unknown one."""
    check_choice(kv_precision, KV_FORMATS, "kv_precision=")
    return KV_FORMATS[kv_precision][1].split(" (", 1)[0].split("PyTorch QuantizedCache, ", 1)[-1]


def precision_lines(
    exact: dict[str, CacheLayout], lengths: Sequence[int], base: CacheLayout, predicted: Sequence[str]
) -> list[Line]:
    """One model's curves across KV precisions: an exact ``Line`` per layout of ``exact`` (legend name -> layout),
    then a predicted one per precision of ``predicted`` (``kv_bytes`` of ``base``, named by its format), each at
    ``lengths``. ConfigError for an unknown precision."""
    lines = exact_lines(exact, lengths)
    for p in predicted:
        per_token = kv_bytes(base, 1, p) - kv_bytes(base, 0, p)
        lines.append(Line(f"{p} ({format_of(p)})", [kv_bytes(base, n, p) for n in lengths], per_token, exact=False))
    return lines


# the markers of point series, recorded (open, grey) or not (filled, red): (symbols in the order the series come,
# size, colour, outline width)
POINT_STYLES = {
    True: (("square-open", "circle-open", "triangle-up-open", "diamond-open"), 11, "#333", 2),
    False: (("diamond", "circle", "triangle-up", "square"), 9, "#d62728", 1),
}


def bytes_figure(
    lengths: Sequence[int],
    lines: Sequence[Line],
    *,
    what: str,
    common: str,
    note: str = "",
    points: Sequence[tuple[str, Sequence[tuple[int, float]]]] = (),
    log: bool = True,
) -> Any:
    """KV cache memory against the context (a plotly Figure), one trace per ``Line`` over ``lengths``, in the unit
    that fits the largest value. ``points``: (legend name, [(length, bytes), ...]) measured elsewhere, drawn as
    markers (open for a name ending in "(recorded)", filled otherwise). ``log``: both axes log, a tick at each
    length; else linear from 0. ``what``, ``common``, ``note``: the title's parts (``style.title``)."""
    values = [b for line in lines for b in line.bytes_at] + [b for _, pts in points for _, b in pts]
    scale, units = unit(max(values, default=0))
    hover = f"%{{x:,}} tokens<br>%{{y:,.3f}} {units}<extra>%{{fullData.name}}</extra>"
    fig = go().Figure()
    for line, color in zip(lines, COLORS * 4):
        fig.add_scatter(
            x=list(lengths),
            y=[b / scale for b in line.bytes_at],
            mode="lines+markers" if log else "lines",
            name=f"{line.name}: {line.per_token:,.0f} B/token{'' if line.exact else ' (predicted)'}",
            line={"color": color, "width": 2, "dash": "solid" if line.exact else "dash"},
            marker={"size": 5},
            hovertemplate=hover,
        )
    drawn = {True: 0, False: 0}  # point series drawn so far, recorded or not: each gets its own symbol
    for name, pts in points:
        recorded = name.endswith("(recorded)")
        symbols, size, color, width = POINT_STYLES[recorded]
        symbol = symbols[drawn[recorded] % len(symbols)]
        drawn[recorded] += 1
        marker = {"symbol": symbol, "size": size, "color": color, "line": {"width": width, "color": "#333"}}
        x, y = [p[0] for p in pts], [p[1] / scale for p in pts]
        fig.add_scatter(x=x, y=y, mode="markers", name=name, marker=marker, hovertemplate=hover)
    if log:
        xaxis = {"title": "tokens held (context)", "type": "log", "tickvals": list(lengths)}
        xaxis["ticktext"] = [f"{n:,}" for n in lengths]
        yaxis = {"title": f"KV cache memory ({units}, log scale)", "type": "log"}
    else:
        xaxis = {"title": "tokens held (cache length)", "rangemode": "tozero"}
        yaxis = {"title": f"KV cache memory ({units})", "rangemode": "tozero"}
    return finish(fig, title(what, common, note), legend_y=-0.2, xaxis=xaxis, yaxis=yaxis, height=520 if log else 480)


def memory_by_layout(
    layouts: dict[str, CacheLayout],
    *,
    max_length: int,
    points: Sequence[tuple[str, Sequence[tuple[int, float]]]] = (),
    common: str = "",
    note: str = "",
) -> Any:
    """``bytes_figure`` (linear axes) of the exact bytes (``layout.report(n)``) each layout's cache holds from 0 to
    ``max_length`` tokens, one line per ``{legend name: layout}``; ``points`` as ``bytes_figure`` takes them."""
    lengths = [round(max_length * i / 64) for i in range(65)]
    lines = exact_lines(layouts, lengths)
    what = "KV cache memory against the context, per architecture"
    return bytes_figure(lengths, lines, what=what, common=common, note=note, points=points, log=False)


def fit_widget(layouts: dict[str, CacheLayout], budget_gib: float = 4.0) -> Any:
    """An ipywidgets box: model (``{name: layout}``), KV precision, sliding-layer policy, budget (``budget_gib`` at
    first) and max_cache_len (0: none), with ``tokens_that_fit``'s answer (or a ConfigError's message) under them."""
    import ipywidgets as w

    windows = [("every position (a plain cache)", None)] + [
        (f"a ring buffer of {n} positions", n) for n in (15, 16, 1024, 4096)
    ]
    style = {"description_width": "initial"}  # every label in full, the field after it
    model = w.Dropdown(options=list(layouts), description="model", style=style)
    precision = w.Dropdown(options=list(KV_FORMATS), description="KV precision", style=style)
    window = w.Dropdown(options=windows, description="sliding layers keep", style=style)
    budget = w.FloatText(value=budget_gib, description="budget (GiB)", style=style, layout=w.Layout(width="170px"))
    reserve = w.IntText(value=0, description="max_cache_len", style=style, layout=w.Layout(width="170px"))
    out = w.HTML()

    def show(_: Any = None) -> None:
        try:
            fit = tokens_that_fit(
                layouts[model.value],
                int(budget.value * GiB),
                kv_precision=precision.value,
                window=window.value,
                max_cache_len=reserve.value or None,
            )
        except ConfigError as exc:  # a negative budget or max_cache_len typed in: say so under the controls
            out.value = f"<b>{model.value}</b>: {exc}"
            return
        out.value = f"<b>{model.value}</b>, {precision.value} KV ({KV_FORMATS[precision.value][1]}): {fit}"

    for control in (model, precision, window, budget, reserve):
        control.observe(show, names="value")
    show()
    wrap = w.Layout(flex_flow="row wrap")  # rows wrap at a narrow width instead of clipping a control
    return w.VBox([w.HBox([model, precision], layout=wrap), w.HBox([window, budget, reserve], layout=wrap), out])


def per_token_sources(models: dict[str, Any], architectures: dict[str, str]) -> Any:
    """The KV bytes per token of each model (preset name -> loaded ``kvlab.Model``) predicted from its checkpoint's
    ``config.json`` and read from its graph's layout, one row per preset with its architecture
    (``architectures[name]``), layers, KV heads, head_dim and dtype: a DataFrame indexed by preset. KeyError for a
    model ``architectures`` does not name, OSError where a checkpoint's config is missing."""
    import json

    import pandas as pd

    from ..presets.recipes import checkpoint_dir

    rows = []
    for name, m in models.items():
        config = json.loads((checkpoint_dir(name) / "config.json").read_text())
        c = config.get("text_config", config)
        layout = m.info.layout
        rows.append(
            {
                "preset": name,
                "architecture": architectures[name],
                "layers": len(layout.layers),
                "layers keeping KV": len([layer for layer in layout.layers if layer.bytes_per_token]),
                "KV heads": c["num_key_value_heads"],
                "head_dim": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                "dtype": m.info.dtype_name,
                "predicted B/token (config)": config_bytes_per_token(config, m.info.dtype.itemsize),
                "memory report B/token (graph)": layout.bytes_per_token,
                "fixed state bytes": layout.fixed_bytes,
            }
        )
    return pd.DataFrame(rows).set_index("preset")
