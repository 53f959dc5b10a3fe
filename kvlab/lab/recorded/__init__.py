"""Recorded ``kvlab bench`` (and ``kvlab trace``) results drawn beside live runs: median decode step vs context, one
line per cache, with the environment they were measured in. One module per figure family: ``rows`` (where the
results live, their environment, their rows and lines), ``sweep``, ``staircase``, ``gain``, ``capture``, ``modes``
and ``trace``; every public name is importable from here (``recorded.staircase(...)``)."""

from .capture import capture_figure, capture_table
from .gain import GAIN_COLORS, LIVE_COLORS, gain_rows, static_gain
from .modes import MODE_COLORS, modes_figure, modes_table
from .rows import data_dir, recorded_environment, rows_of, series_key, series_name
from .staircase import staircase, staircase_cost, staircase_glance
from .sweep import bench_figure, sweep
from .trace import trace_figure

__all__ = [
    "GAIN_COLORS",
    "LIVE_COLORS",
    "MODE_COLORS",
    "bench_figure",
    "capture_figure",
    "capture_table",
    "data_dir",
    "gain_rows",
    "modes_figure",
    "modes_table",
    "recorded_environment",
    "rows_of",
    "series_key",
    "series_name",
    "staircase",
    "staircase_cost",
    "staircase_glance",
    "static_gain",
    "sweep",
    "trace_figure",
]
