"""What the CacheLab says in words and tables, as pure functions of a run's ``Settings``: the next run's memory plan,
the WebGPU buffer cache mode in force, a run's legend name and chart title, and the table of runs, one row each."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from ..core.generation import Generation, positions_needed
from ..ort import Device, Model, StaticCache, opened
from .style import runtime_text


@dataclass(frozen=True)
class Settings:
    """What the dashboard's controls say the next run is."""

    model: str
    cache: str  # "dynamic" or "static"
    max_cache_len: int  # the control's value, meaningful for a static cache only (``size``)
    prompt_tokens: int
    new_tokens: int
    device: str
    buffer_cache_mode: str  # the control's value, meaningful on WebGPU only (``mode``)

    @property
    def mode(self) -> str:
        """The WebGPU buffer cache mode; "-" on another device."""
        return self.buffer_cache_mode if self.device == "webgpu" else "-"

    @property
    def size(self) -> int | None:
        """The static cache's max_cache_len; None for a dynamic cache."""
        return self.max_cache_len if self.cache == "static" else None

    @property
    def needed(self) -> int:
        """Positions the run needs: prompt + new tokens - 1 (the last token is never fed back)."""
        return positions_needed(self.prompt_tokens, self.new_tokens)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def plan_html(info: Any, s: Settings) -> str:
    """What the run ``s`` needs of model ``info``, and what its cache reserves (whether it fits)."""
    lines = [
        f"<b>{html.escape(info.name)}</b> ({info.dtype_name}): {2 * info.num_layers} KV tensors, "
        f"{info.bytes_per_token:,} bytes per token; this run needs <b>{s.needed}</b> positions "
        f"({s.prompt_tokens} prompt + {s.new_tokens} new - 1)."
    ]
    if s.cache == "static":
        report = StaticCache(s.max_cache_len).memory_report(info)
        fits = (
            "<span style='color:#2ca02c'>fits</span>"
            if s.needed <= s.max_cache_len
            else "<span style='color:#d62728'><b>does not fit</b>: the run will be refused before anything is "
            "allocated</span>"
        )
        lines.append(
            f"Static: reserves {_mib(report.total_bytes)} once ({s.max_cache_len} positions); "
            f"the run will use {_mib(s.needed * info.bytes_per_token)}. {fits}"
        )
    else:
        lines.append("Dynamic: the runtime allocates new, one-token-longer KV tensors every step.")
    if s.device == "webgpu":
        lines.append(mode_note(s.mode))
    return "<div style='line-height:1.5'>" + "<br>".join(lines) + "</div>"


def mode_note(want: str) -> str:
    """The WebGPU buffer cache mode the next run gets, against the open context's."""
    dev = opened("webgpu")
    if dev is None:
        return f"WebGPU buffer cache mode: {want} (the context opens on Run)."
    have = dev.label.buffer_cache_mode
    if have == want:
        return f"WebGPU buffer cache mode in force: <b>{have}</b>."
    return (
        f"The WebGPU context is open with mode <b>{have}</b>; Run closes it and opens a fresh one with "
        f"<b>{want}</b> (only possible when no cache holds WebGPU tensors: {dev.live_tensors} alive now)."
    )


def run_titles(model: Model, dev: Device, s: Settings, number: int, prompt: int) -> tuple[str, str]:
    """(legend name, chart title) of live run ``number`` of ``model`` on ``dev`` with ``prompt`` tokens."""
    size = f"({s.max_cache_len})" if s.cache == "static" else ""
    webgpu = dev.name == "webgpu"
    label = f"#{number} {s.cache}{size} \u00b7 {dev.name}" + (f" {s.mode}" if webgpu else "")
    mode_text = f" \u00b7 buffer cache {s.mode}" if webgpu else ""
    title = (
        f"<b>{model.name} ({model.info.dtype_name}) on {dev.name}: {html.escape(str(dev.adapter))}</b>"
        f"<br><sup>run #{number}: {s.cache} cache"
        f"{f' (max_cache_len={s.max_cache_len})' if s.cache == 'static' else ''}, prompt "
        f"{prompt} + {s.new_tokens} new tokens{mode_text} \u00b7 {runtime_text(dev.label)}</sup>"
    )
    return label, title


def browser_titles(g: Generation, number: int, host: str) -> tuple[str, str]:
    """(legend name, chart title) of a run a browser on ``host`` sent back, numbered ``number``."""
    where = f"{host}: {g.label.device.adapter}"
    name = f"#{number} {g.label.cache} \u00b7 browser"
    title = (
        f"<b>{html.escape(g.label.model)} ({g.label.dtype}) in the browser: {html.escape(str(where))}</b>"
        f"<br><sup>run #{number}: {g.label.cache}, prompt {len(g.prompt_ids)} + {len(g.token_ids)} new "
        f"tokens \u00b7 {html.escape(g.label.device.runtime)}</sup>"
    )
    return name, title


def settings_row(
    number: int, model: str, device: str, mode: str, cache: str, max_cache_len: int | None, prompt: int, new: int
) -> dict[str, Any]:
    """The table's columns for a run's settings (max_cache_len shows as "-" for a dynamic cache)."""
    return {
        "run": number,
        "model": model,
        "device": device,
        "buffer cache": mode,
        "cache": cache,
        "max_cache_len": max_cache_len if cache == "static" else "-",
        "prompt": prompt,
        "new": new,
        "needed": positions_needed(prompt, new),
    }


def browser_row(g: Generation, number: int) -> dict[str, Any]:
    """The table's row for a run a browser sent back, numbered ``number``."""
    kind, mode = g.label.cache.kind, g.label.device.buffer_cache_mode or "-"
    settings = (kind, g.label.cache.max_cache_len, len(g.prompt_ids), len(g.token_ids))
    return {**settings_row(number, g.label.model, "browser webgpu", mode, *settings), **outcome(g)}


def outcome(g: Generation) -> dict[str, Any]:
    """The table's columns for a finished run: its result, median decode step, memory and allocations."""
    f = g.frame()
    return {
        "result": f"ok: {len(g.token_ids)} tokens",
        "decode ms (median)": round(g.decode_ms(), 1),
        "reserved KiB": round(f["live_cache_bytes"].max() / 1024, 1),
        "used KiB": round(f["used_cache_bytes"].iloc[-1] / 1024, 1),
        "allocated KiB (all steps)": round(f["cache_bytes_allocated"].sum() / 1024, 1),
        "new buffers": int(f["new_buffers"].sum()),
        "first tokens": " ".join(str(t) for t in g.token_ids[:6]),
    }


# columns the dashboard's table leaves out to fit its width (``CacheLab.results`` keeps them)
HIDDEN_COLUMNS = ("first tokens",)

_TABLE_CSS = """<style>
.kvlab-results-table {border-collapse: collapse; font-size: 12px; margin-top: 6px}
.kvlab-results-table th {background: #f3f5f7; padding: 3px 8px; max-width: 90px; white-space: normal;
  text-align: center; font-weight: 600; border-bottom: 1px solid #ccc}
.kvlab-results-table td {padding: 3px 8px; white-space: nowrap; text-align: right; border-bottom: 1px solid #eee}
.kvlab-results-table tr:last-child td {background: #eef6ff}
</style>"""


def table_html(rows: list[dict[str, Any]]) -> str:
    """The runs (one row each) as the dashboard's table, without ``HIDDEN_COLUMNS``; blanks for missing values,
    integers without '.0'."""
    if not rows:
        return "<p><i>No runs yet: set the controls and press Run.</i></p>"
    import pandas as pd

    def cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and v != v):
            return ""
        return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else v

    df = pd.DataFrame(rows)
    df = df.drop(columns=[c for c in HIDDEN_COLUMNS if c in df.columns]).astype(object).map(cell)
    table = df.to_html(index=False, classes="kvlab-results-table", border=0, escape=True)
    return f"{_TABLE_CSS}<div style='overflow-x:auto'>{table}</div>"
