"""The lab: plotly figures of per-step records (``plots``, ``recorded``) and the notebook dashboard
(``widgets.CacheLab``). Figures read records and labels only; they format labels, never parse them."""

from .runs import Run

__all__ = ["Run"]
