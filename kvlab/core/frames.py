"""Records as tables: a pandas DataFrame per run, a hook that keeps every record, the median of a column."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from .records import COLUMNS, StepRecord


def decode_median(records: Sequence[StepRecord], column: str = "wall_ms") -> float:
    """Median of a column over the decode steps; NaN with no decode step."""
    values = [getattr(r, column) for r in records if r.phase == "decode"]
    return float(np.median(values)) if values else float("nan")


def frame(records: Iterable[StepRecord], columns: Iterable[str] = COLUMNS, **attrs: Any):
    """Records as a pandas DataFrame, one row per step; ``attrs`` (what produced them) go to ``frame.attrs``."""
    import pandas as pd

    df = pd.DataFrame([asdict(r) for r in records], columns=list(columns))
    df.attrs.update(attrs)
    return df


class Recorder:
    """A step hook that keeps every record: ``generate(..., on_step=rec)``, then ``rec.frame()``."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def __call__(self, record: StepRecord) -> None:
        self.records.append(record)

    def frame(self):
        """The records kept so far as a pandas DataFrame (``COLUMNS``)."""
        return frame(self.records)

    def clear(self) -> None:
        """Forget the records kept."""
        self.records.clear()
