"""Recorded ``kvlab bench`` results read: where they live, where they were measured, their rows for one model and
device, and the lines those rows make. A bench row names its cache as fields (``runner``, ``cache_kind``,
``max_cache_len``, ``fitted``: sized to its own context, ``cache_variant``), so one line can follow a static cache
sized to fit every context."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ConfigError


def data_dir() -> Path:
    """The checkout's ``data/`` folder, where recorded results live: found from the working directory up, else
    beside kvlab's own source (an editable install), so a notebook run from a copy elsewhere still finds it."""
    here = Path.cwd()
    source = Path(__file__).resolve().parents[3]
    for root in (here, *here.parents, source):
        if (root / "data" / "gpu").is_dir():
            return root / "data"
    raise ConfigError(
        f"no data/ folder with recorded results (data/gpu/) in {here}, its parents or {source}: run "
        "this from a kvlab checkout"
    )


def recorded_environment(result: dict[str, Any]) -> str:
    """One line naming where recorded benchmark results were measured."""
    env = result.get("environment", {})
    return (
        f"{env.get('date', 'undated')}, {env.get('cpu', 'unknown CPU')}, {env.get('backend_package', '?')} "
        f"{env.get('backend_version', '?')}, commit {env.get('commit', '?')}"
    )


def series_key(row: dict[str, Any]) -> tuple[str, Any]:
    """(kind, size) of a bench row: what its colour and its line follow ("fit" for a static cache sized to fit)."""
    if row["runner"] != "kvlab":
        return row["runner"], None
    return row["cache_kind"], ("fit" if row["fitted"] else row["max_cache_len"], row.get("cache_variant", ""))


def series_name(row: dict[str, Any]) -> str:
    """A bench row's line name: "dynamic", "static@4160", "static@fit", "static@fit 4KiB-pages", "genai", ..."""
    kind, size = series_key(row)
    if size is None:
        return kind
    length, variant = size
    return f"{kind}{'@' + str(length) if length is not None else ''}" + (f" {variant}" if variant else "")


def rows_of(result: dict[str, Any], model: str | None, device: str | None) -> list[dict[str, Any]]:
    """The rows of a bench result for ``model`` on ``device`` (None: any), in the result's order."""
    return [
        r
        for r in result.get("rows", [])
        if (model is None or r["model"] == model) and (device is None or r["device"] == device)
    ]


def where_measured(row: dict[str, Any]) -> str:
    """A row's model, dtype, device, adapter and buffer cache mode, as a legend or title names them."""
    mode = f", buffer cache {row['buffer_cache_mode']}" if row.get("buffer_cache_mode") else ""
    return f"{row['model']} ({row['dtype']}) on {row['device']} [{row['adapter']}]{mode}"


def error_bars(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Plotly error bars from each row's median decode step to its min and max."""
    return {
        "type": "data",
        "symmetric": False,
        "array": [r["decode_ms_max"] - r["decode_ms"] for r in rows],
        "arrayminus": [r["decode_ms"] - r["decode_ms_min"] for r in rows],
    }


def series_lines(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(line name, buffer cache mode, rows by context) per line of a bench result."""
    keys = sorted({(series_name(r), r.get("buffer_cache_mode", "")) for r in rows})
    return [
        (
            name,
            mode,
            sorted(
                (r for r in rows if (series_name(r), r.get("buffer_cache_mode", "")) == (name, mode)),
                key=lambda r: r["context"],
            ),
        )
        for name, mode in keys
    ]


def paired(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """The paired ratio of two rows measured in the same interleaved rounds: the median over rounds of each round's
    ``a / b`` decode step; None when either row is missing."""
    if a is None or b is None:
        return None
    return float(np.median(np.array(a["decode_ms_runs"]) / np.array(b["decode_ms_runs"])))
