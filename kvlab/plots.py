"""Plotly figures of kvlab's per-step records. This module reads records only; it never runs a model.

Every figure says what produced its numbers: model, dtype, device (backend, adapter hardware/software, WebGPU
buffer cache mode), cache and context, in the title when all runs share them and in the legend otherwise.
Recorded results (e.g. from data/bench/) are marked "recorded" in the legend, with their environment.

The WebGPU buffer pool rounds each request up to a bucket (4, 8, 12, 16 MiB, ...) and keeps only a few freed
buffers per bucket; a DynamicCache whose KV tensors cross those sizes shows a latency staircase.
``latency`` draws a dotted line where each KV tensor reaches a bucket size, so you can see whether the
staircase appears where it should.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

MiB = 2**20
BUCKETS_MIB: tuple[int, ...] = (4, 8, 12, 16)
PHASE_SYMBOLS = {"prefill": "diamond", "handoff": "square", "decode": "circle"}
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass
class Run:
    """One run's records plus what produced them (what a figure needs to label its numbers)."""

    frame: Any  # pandas DataFrame with the columns of kvlab.instrument.COLUMNS
    model: str
    device: str  # device label: backend, adapter (hardware/software), buffer cache mode
    cache: str  # "dynamic" or "static(max_cache_len=N)"
    dtype: str
    label: str = ""  # legend name; derived from the fields that differ between runs when empty
    recorded: str = ""  # non-empty for recorded results: where and on what they were measured
    backend: str = ""  # the runtime that produced the records, e.g. "onnxruntime-webgpu 1.27.0"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def context(self) -> str:
        """'prompt P + N new' and the final cache length."""
        f = self.frame
        if f.empty:
            return "no steps"
        prompt = int(f["n_tokens"].iloc[0]) if f["phase"].iloc[0] == "prefill" else int(f["position"].iloc[0])
        end = int((f["position"] + f["n_tokens"]).max())
        return f"context {prompt}\u2192{end} tokens"


def as_run(obj: Any, label: str = "") -> Run:
    """A ``Run`` from a ``kvlab.Generation``, a ``Run``, or a DataFrame whose ``attrs`` name model, device,
    cache and dtype."""
    if isinstance(obj, Run):
        if label:
            obj.label = label
        return obj
    if hasattr(obj, "records") and hasattr(obj, "frame") and hasattr(obj, "cache"):  # a kvlab.Generation
        device = obj.device
        if getattr(obj, "prefill_device", ""):
            device += f", prefill on {obj.prefill_device.split(' [')[0]} + handoff"
        return Run(obj.frame(), obj.model, device, obj.cache, obj.dtype, label, backend=_backend_of(obj))
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a kvlab dependency
        pd = None
    if pd is not None and isinstance(obj, pd.DataFrame):
        a = obj.attrs
        missing = [k for k in ("model", "device", "cache", "dtype") if k not in a]
        if missing:
            raise ValueError(f"a DataFrame passed to kvlab.plots needs attrs {missing} (what produced it); "
                             "or pass the kvlab.Generation itself")
        return Run(obj, a["model"], a["device"], a["cache"], a["dtype"], label or a.get("label", ""),
                   a.get("recorded", ""))
    raise TypeError(f"cannot plot {type(obj).__name__}; pass kvlab.Generation objects, kvlab.plots.Run objects "
                    "or DataFrames with attrs model/device/cache/dtype")


def ort_backend_label() -> str:
    """This process's ONNX Runtime backend with its version, e.g. 'onnxruntime-webgpu 1.27.0 (built-in WebGPU EP)'."""
    from .runtime import backend, versions

    vers = versions()
    package = next((p for p in ("onnxruntime-webgpu", "onnxruntime") if vers.get(p, "missing") != "missing"), "")
    name = backend().name
    return name.replace(package, f"{package} {vers[package]}", 1) if package and package in name else name


def _backend_of(generation: Any) -> str:
    """The runtime behind a live Generation: its own ``backend`` attribute if it has one, else this process's
    ONNX Runtime backend for kvlab's ORT device labels ("cpu [...]", "webgpu [...]")."""
    own = getattr(generation, "backend", "")
    if isinstance(own, str) and own:
        return own
    return ort_backend_label() if " [" in str(generation.device) else ""


def as_runs(objs: Any) -> list[Run]:
    if isinstance(objs, dict):
        return [as_run(v, str(k)) for k, v in objs.items()]
    if isinstance(objs, (list, tuple)):
        return [as_run(o) for o in objs]
    return [as_run(objs)]


def _color_for(name: str, index: int) -> str:
    """One colour per kind of cache, live or recorded: dynamic blue, static red (a second static size orange)."""
    if name.startswith("dynamic"):
        return "#1f77b4"
    if name.startswith(("static@fit", "static(")):
        return "#d62728"
    if name.startswith("static"):
        return "#ff7f0e"
    if name.startswith("genai"):
        return "#2ca02c"
    return _COLORS[index % len(_COLORS)]


def _common_and_labels(runs: Sequence[Run], context: bool = True) -> tuple[str, list[str]]:
    """Title part shared by all runs, and one legend label per run naming what differs (the cache always).
    The runtime backend, when known, goes on its own line of the title (or into the labels when it differs)."""
    fields = [lambda r: f"model {r.model} ({r.dtype})", lambda r: r.device] + ([lambda r: r.context] if context else [])
    if any(r.backend for r in runs):
        fields.append(lambda r: r.backend or "backend not recorded")
    common = [get for get in fields if len({get(r) for r in runs}) == 1]
    differing = [get for get in fields if get not in common]
    labels = []
    for r in runs:
        if r.label:
            labels.append(r.label + (" (recorded)" if r.recorded and "recorded" not in r.label else ""))
            continue
        parts = [r.cache] + [get(r) for get in differing]
        labels.append(" \u00b7 ".join(parts) + (" (recorded)" if r.recorded else ""))
    if not runs:
        return "", labels
    shared = [get(runs[0]) for get in common]
    if any(r.backend for r in runs) and fields[-1] in common:  # the backend: on a line of its own
        return " \u00b7 ".join(shared[:-1]) + "<br>" + shared[-1], labels
    return " \u00b7 ".join(shared), labels


def kv_bytes_per_tensor_token(frame: Any) -> float | None:
    """Bytes one token adds to one KV tensor, derived from the records (None when they do not tell)."""
    f = frame[frame["used_cache_bytes"] > 0]
    tensors = int(frame["cache_tensors_allocated"].max()) if not frame.empty else 0
    if f.empty or tensors <= 0:
        return None
    length = (f["position"] + f["n_tokens"]).iloc[-1]
    return float(f["used_cache_bytes"].iloc[-1]) / float(length) / tensors


def bucket_positions(bytes_per_tensor_token: float, buckets_mib: Iterable[int] = BUCKETS_MIB) -> dict[int, int]:
    """Cache length at which one KV tensor reaches each bucket size (MiB -> tokens)."""
    if not bytes_per_tensor_token or bytes_per_tensor_token <= 0:
        raise ValueError(f"bytes_per_tensor_token={bytes_per_tensor_token!r} must be > 0")
    return {b: int(np.ceil(b * MiB / bytes_per_tensor_token)) for b in buckets_mib}


def _unit(max_bytes: float) -> tuple[float, str]:
    if max_bytes >= 4 * MiB:
        return MiB, "MiB"
    if max_bytes >= 4 * 1024:
        return 1024, "KiB"
    return 1, "bytes"


def _title(what: str, common: str, note: str = "") -> dict[str, Any]:
    text = f"<b>{what}</b><br><sup>{common}{'<br>' + note if note else ''}</sup>"
    return {"text": text, "x": 0.01, "xanchor": "left", "yref": "container", "y": 1, "yanchor": "top",
            "pad": {"t": 30}}


def _top(title: dict[str, Any], extra: int = 0) -> dict[str, int]:
    """A top margin that fits the title's lines (and ``extra`` pixels, e.g. for subplot titles)."""
    return {"t": 75 + 17 * title["text"].count("<br>") + extra}


def _legend_below() -> dict[str, Any]:
    return {"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0}


def _go():
    import plotly.graph_objects as go

    return go


def _recorded_note(runs: Sequence[Run]) -> str:
    notes = sorted({r.recorded for r in runs if r.recorded})
    return ("recorded: " + "; ".join(notes)) if notes else ""


def latency(runs: Any, *, y: str = "wall_ms", phases: Sequence[str] = ("decode",), buckets: bool | None = None,
            bytes_per_tensor_token: float | None = None) -> Any:
    """Per-step latency vs cache length, one line per run; dotted lines where a KV tensor reaches 4/8/12/16 MiB.

    ``buckets``: draw the WebGPU bucket lines (default: when any run is on WebGPU; the CPU EP has no such pool)."""
    if y not in ("wall_ms", "run_ms", "overhead_ms"):
        raise ValueError(f"y={y!r} is not valid; choose one of ('wall_ms', 'run_ms', 'overhead_ms')")
    go = _go()
    runs = as_runs(runs)
    common, labels = _common_and_labels(runs)
    fig = go.Figure()
    xmax = 0
    for i, (r, name) in enumerate(zip(runs, labels)):
        f = r.frame[r.frame["phase"].isin(phases)]
        x = f["position"] + f["n_tokens"]
        xmax = max(xmax, int(x.max()) if len(x) else 0)
        fig.add_trace(go.Scatter(
            x=x, y=f[y], name=name, mode="lines+markers", marker={"size": 4, "color": _COLORS[i % len(_COLORS)]},
            line={"dash": "dot" if r.recorded else "solid", "color": _COLORS[i % len(_COLORS)]},
            customdata=np.stack([f["step"], f["phase"], f["cache_tensors_allocated"], f["new_buffers"]], axis=-1),
            hovertemplate=("cache length %{x}<br>%{y:.1f} ms<br>step %{customdata[0]} (%{customdata[1]})<br>"
                           "KV tensors allocated %{customdata[2]}, new buffers %{customdata[3]}<extra>%{fullData.name}"
                           "</extra>")))
    note = _recorded_note(runs)
    if buckets is None:
        buckets = any(r.device.startswith("webgpu") for r in runs)
    if buckets and runs:
        note = "<br>".join(n for n in (note, _add_bucket_lines(fig, runs, xmax, bytes_per_tensor_token)) if n)
    title = _title(f"{' + '.join(phases)} step latency ({y})", common, note)
    fig.update_layout(title=title,
                      xaxis_title="cache length after the step (tokens)", yaxis_title=f"{y} (ms)",
                      yaxis_rangemode="tozero", legend=_legend_below(), template="plotly_white",
                      margin=_top(title))
    return fig


def _add_bucket_lines(fig: Any, runs: Sequence[Run], xmax: int, bpt: float | None) -> str:
    """Draw the bucket lines inside the x range; return a note naming those beyond it."""
    bpt = bpt or next((b for b in (kv_bytes_per_tensor_token(r.frame) for r in runs) if b), None)
    if not bpt:
        return ""
    beyond = []
    for mib, pos in bucket_positions(bpt).items():
        if pos <= xmax * 1.02:
            fig.add_vline(x=pos, line={"dash": "dot", "color": "#888", "width": 1},
                          annotation={"text": f"KV tensor {mib} MiB", "textangle": -90, "font": {"size": 10,
                                                                                                  "color": "#666"}},
                          annotation_position="top left")
        else:
            beyond.append(f"{mib} MiB at {pos:,}")
    per = f"{bpt:,.0f} bytes/token per KV tensor"
    return f"WebGPU buckets: {per}; beyond this range: {', '.join(beyond)} tokens" if beyond else \
        f"WebGPU buckets drawn ({per})"


def allocations(runs: Any) -> Any:
    """Three panels vs cache length: KV tensors allocated per step, bytes allocated per step, cumulative bytes."""
    from plotly.subplots import make_subplots

    go = _go()
    runs = as_runs(runs)
    common, labels = _common_and_labels(runs)
    top = max((float(r.frame["cache_bytes_allocated"].sum()) for r in runs), default=0.0)
    scale, unit = _unit(top)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("KV tensors allocated in the step", f"KV {unit} allocated in the step",
                                        f"cumulative KV {unit} allocated"))
    for i, (r, name) in enumerate(zip(runs, labels)):
        f = r.frame
        x = f["position"] + f["n_tokens"]
        style = {"color": _COLORS[i % len(_COLORS)], "dash": "dot" if r.recorded else "solid"}
        common_kw = {"legendgroup": name, "line": style, "marker": {"size": 4, "color": style["color"]}}
        fig.add_trace(go.Scatter(x=x, y=f["cache_tensors_allocated"], name=name, mode="lines+markers",
                                 **common_kw), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=f["cache_bytes_allocated"] / scale, name=name, mode="lines+markers",
                                 showlegend=False, **common_kw), row=2, col=1)
        fig.add_trace(go.Scatter(x=x, y=f["cache_bytes_allocated"].cumsum() / scale, name=name, mode="lines",
                                 showlegend=False, **common_kw), row=3, col=1)
    fig.update_xaxes(title_text="cache length after the step (tokens)", row=3, col=1)
    title = _title("KV cache allocations per step", common, _recorded_note(runs))
    fig.update_layout(title=title, height=660, legend=_legend_below(), template="plotly_white",
                      margin=_top(title, extra=20))
    fig.update_layout(legend={"y": -0.1})
    return fig


def memory(runs: Any) -> Any:
    """KV memory reserved (live cache tensors) vs used (tokens held x bytes per token) vs cache length."""
    go = _go()
    runs = as_runs(runs)
    common, labels = _common_and_labels(runs)
    top = max((float(r.frame["live_cache_bytes"].max()) for r in runs if not r.frame.empty), default=0.0)
    scale, unit = _unit(top)
    fig = go.Figure()
    for i, (r, name) in enumerate(zip(runs, labels)):
        f = r.frame
        x = f["position"] + f["n_tokens"]
        color = _COLORS[i % len(_COLORS)]
        fig.add_trace(go.Scatter(x=x, y=f["live_cache_bytes"] / scale, name=f"{name}: reserved", mode="lines",
                                 line={"color": color, "width": 3}, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=f["used_cache_bytes"] / scale, name=f"{name}: used", mode="lines",
                                 line={"color": color, "dash": "dash"}, legendgroup=name))
    title = _title("KV memory: reserved vs used", common, _recorded_note(runs))
    fig.update_layout(title=title,
                      xaxis_title="cache length after the step (tokens)", yaxis_title=unit, yaxis_rangemode="tozero",
                      legend=_legend_below(), template="plotly_white", margin=_top(title))
    return fig


def conformance(result: Any) -> Any:
    """Per-position max |logit difference| of a ``kvlab.conformance.Conformance``; argmax changes in red."""
    go = _go()
    f = result.frame()
    ok, bad = f[f["argmax_equal"]], f[~f["argmax_equal"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=ok["position"], y=ok["max_abs_diff"], name="same argmax", marker_color="#1f77b4"))
    fig.add_trace(go.Bar(x=bad["position"], y=bad["max_abs_diff"], name="argmax differs", marker_color="#d62728"))
    fig.add_hline(y=result.atol, line={"dash": "dot", "color": "#888"}, annotation_text=f"atol {result.atol:g}",
                  annotation_position="bottom right")
    first = result.first_divergence
    note = "all positions agree" if first is None else f"first divergence at position {first}"
    title = _title(f"{result.mode} logits, position by position: is {result.device.split(' ')[0]} the same as "
                   f"{result.reference.split(' ')[0]}?", f"model {result.model} \u00b7 {result.device} vs "
                   f"{result.reference}", note)
    fig.update_layout(
        title=title,
        xaxis_title="position", yaxis_title="max |logit difference|", yaxis_type="log", barmode="overlay",
        legend=_legend_below(), template="plotly_white", margin=_top(title))
    return fig


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where two token sequences differ (a length difference counts); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_diff(a: Sequence[int], b: Sequence[int], names: tuple[str, str] = ("a", "b"),
               decode: Any = None) -> Any:
    """Token-by-token comparison as a styled table; the first divergence is highlighted in red."""
    import pandas as pd

    n = max(len(a), len(b))
    col = lambda seq: [int(seq[i]) if i < len(seq) else None for i in range(n)]  # noqa: E731
    df = pd.DataFrame({f"{names[0]} id": col(a), f"{names[1]} id": col(b)})
    if decode is not None:
        df.insert(1, f"{names[0]} text", [repr(decode([t])) if t is not None else "" for t in col(a)])
        df[f"{names[1]} text"] = [repr(decode([t])) if t is not None else "" for t in col(b)]
    df["same"] = [x == y for x, y in zip(col(a), col(b))]
    first = first_divergence(a, b)

    def paint(row: Any) -> list[str]:
        if first is not None and row.name == first:
            return ["background-color: #f8c9c9; font-weight: bold"] * len(row)
        if not row["same"]:
            return ["background-color: #fdeaea"] * len(row)
        return [""] * len(row)

    caption = ("identical" if first is None else f"first divergence at generated token {first}")
    return df.style.apply(paint, axis=1).set_caption(f"{names[0]} vs {names[1]}: {caption}")


def recorded_environment(result: dict[str, Any]) -> str:
    """One line naming where recorded benchmark results (``kvlab bench`` JSON) were measured."""
    env = result.get("environment", {})
    vers = env.get("versions", {})
    ort = vers.get("onnxruntime-webgpu") or vers.get("onnxruntime") or "?"
    return (f"{env.get('date', 'undated')}, {env.get('cpu', 'unknown CPU')}, {env.get('backend', '?')} {ort}, "
            f"commit {env.get('commit', '?')}")


def recorded_variant(row: dict[str, Any]) -> str:
    """A recorded variant's name, with a static cache sized to fit each context named 'static@fit' (so that
    it makes one line across contexts)."""
    name, space, suffix = str(row["variant"]).partition(" ")
    if name.startswith("static@") and "new_tokens" in row:
        try:
            if int(name.split("@", 1)[1]) == int(row["context"]) + int(row["new_tokens"]) - 1:
                name = "static@fit"
        except ValueError:
            pass
    return name + space + suffix


def sweep(runs: Any = (), *, y: str = "wall_ms", buckets: bool | None = None,
          bytes_per_tensor_token: float | None = None, recorded: dict[str, Any] | None = None,
          recorded_model: str | None = None, recorded_device: str | None = None) -> Any:
    """Median decode-step latency of each run vs its context, one line per cache (and device, when they differ);
    for short runs at several contexts. Bucket lines as in ``latency``.

    ``recorded``: a ``kvlab bench`` result (its JSON, loaded) drawn beside the live runs as dotted lines labelled
    "recorded", for ``recorded_model``/``recorded_device`` (default: those of the live runs), with its environment
    in the subtitle."""
    go = _go()
    runs = as_runs(list(runs))
    common, _ = _common_and_labels([Run(r.frame, r.model, r.device, "", r.dtype, backend=r.backend) for r in runs],
                                   context=False)
    groups: dict[str, list[tuple[int, float, Run]]] = {}
    for r in runs:
        dec = r.frame[r.frame["phase"] == "decode"]
        if dec.empty:
            continue
        key = r.label or (r.cache + (" (recorded)" if r.recorded else " (live)"))
        if len({x.device for x in runs}) > 1:
            key += f" \u00b7 {r.device}"
        groups.setdefault(key, []).append((int(dec["position"].iloc[0]), float(dec[y].median()), r))
    fig = go.Figure()
    xmax = 0
    for i, (name, points) in enumerate(groups.items()):
        points.sort(key=lambda p: p[0])
        xmax = max(xmax, points[-1][0])
        color = _color_for(name, i)
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], name=name, mode="lines+markers",
                                 marker={"size": 11, "color": color, "symbol": "diamond",
                                         "line": {"width": 1, "color": "#333"}},
                                 line={"color": color, "dash": "dot" if points[0][2].recorded else "solid"},
                                 hovertemplate="context %{x}<br>median %{y:.1f} ms<extra>%{fullData.name}</extra>"))
    note = _recorded_note(runs)
    if recorded is not None:
        model = recorded_model or (runs[0].model if runs else None)
        device = recorded_device or (runs[0].device.split(" ")[0] if runs else None)
        rows = [r for r in recorded.get("rows", []) if (model is None or r["model"] == model)
                and (device is None or r["device"] == device)]
        if not rows:
            raise ValueError(f"the recorded results have no rows for model {model!r} on device {device!r}")
        for j, key in enumerate(sorted({(recorded_variant(r), r.get("buffer_cache_mode", "")) for r in rows})):
            pts = sorted((r for r in rows if (recorded_variant(r), r.get("buffer_cache_mode", "")) == key),
                         key=lambda r: r["context"])
            color = _color_for(key[0], len(groups) + j)
            fig.add_trace(go.Scatter(
                x=[r["context"] for r in pts], y=[r["decode_ms"] for r in pts], mode="lines+markers",
                name=f"{key[0]}{' ' + key[1] if key[1] else ''} (recorded)", line={"dash": "dot", "color": color},
                marker={"symbol": "square", "size": 7, "color": color},
                error_y={"type": "data", "symmetric": False,
                         "array": [r["decode_ms_max"] - r["decode_ms"] for r in pts],
                         "arrayminus": [r["decode_ms"] - r["decode_ms_min"] for r in pts]},
                hovertemplate="context %{x}<br>median %{y:.1f} ms (recorded)<extra>%{fullData.name}</extra>"))
            xmax = max(xmax, pts[-1]["context"])
        r0 = rows[0]
        where = (f"{r0['model']} ({r0['dtype']}) on {r0['device']} [{r0['adapter']}]"
                 f"{', buffer cache ' + r0['buffer_cache_mode'] if r0.get('buffer_cache_mode') else ''}")
        rec = f"dotted: RECORDED, not live: {where}<br>measured {recorded_environment(recorded)}"
        note = "<br>".join(n for n in (note, rec) if n)
        if not runs:
            common = f"kvlab bench results, {r0.get('new_tokens', '?')} new tokens per run, median over paired runs " \
                     "(bars: min-max)"
        if bytes_per_tensor_token is None and r0.get("kv_tensor_mib") and r0.get("context"):
            bytes_per_tensor_token = r0["kv_tensor_mib"] * MiB / r0["context"]
        if buckets is None and r0["device"] == "webgpu":
            buckets = True
    if buckets is None:
        buckets = any(r.device.startswith("webgpu") for r in runs)
    if buckets and (runs or bytes_per_tensor_token):
        note = "<br>".join(n for n in (note, _add_bucket_lines(fig, runs, xmax, bytes_per_tensor_token)) if n)
    title = _title(f"median decode step ({y}) vs context", common, note)
    fig.update_layout(title=title,
                      xaxis_title="context when decoding starts (tokens)", yaxis_title=f"median {y} (ms)",
                      yaxis_rangemode="tozero", xaxis_rangemode="tozero", legend=_legend_below(),
                      template="plotly_white", margin=_top(title))
    return fig
