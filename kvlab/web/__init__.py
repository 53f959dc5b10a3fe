"""kvlab's caches in the browser: the same dynamic and static KV caches on onnxruntime-web's WebGPU EP, driven
from Python (headless Chromium or Node with Dawn: ``browser_generate``), from ``kvlab browser-bench``, or from a
notebook in the attendee's own browser (``BrowserLab``, an anywidget talking over the Jupyter comm channel).

Modules: ``job`` (what a page runs, checked), ``server`` with ``chromium``, or ``node`` (the hosts), ``results``
(the page's result as labelled records), ``run`` (the three together), ``bench`` (``kvlab browser-bench``'s rows),
``widget`` and ``adapter`` (the notebook widgets), ``assets`` (the npm files served). The page's code is ``js/``.

It may import ``kvlab.core``, ``kvlab.presets``, ``kvlab.ort``, ``kvlab.lab`` and ``kvlab.bench``; only the CLI
imports it.
"""

from .job import Job, make_job
from .results import WEB_COLUMNS, BrowserGeneration, BrowserHost, BrowserResult, BrowserStepRecord
from .run import browser_generate, run_job

__all__ = [
    "Job",
    "make_job",
    "browser_generate",
    "run_job",
    "BrowserResult",
    "BrowserGeneration",
    "BrowserHost",
    "BrowserStepRecord",
    "WEB_COLUMNS",
]
