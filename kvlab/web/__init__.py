"""kvlab's caches in the browser: the same dynamic and static KV caches on onnxruntime-web's WebGPU EP, driven
from Python (headless Chromium or Node with Dawn, ``browser_generate``), from the ``kvlab browser-bench`` command,
or from a notebook in the attendee's own browser (``BrowserLab``, an anywidget whose model bytes and results
travel over the Jupyter comm channel, so it works on Binder and JupyterHub).

Modules, one job each: ``assets`` (the npm files served, their versions), ``job`` (what a page is asked to run,
checked), ``server`` (serves a job on 127.0.0.1), ``chromium`` (a headless browser, closed once), ``node`` (the
runner in Node with Dawn), ``results`` (the page's result as kvlab records, labelled), ``run`` (the three
together), ``bench`` (``kvlab browser-bench``'s rows), ``widget`` (the notebook widget), ``adapter`` (the notebook
browser's WebGPU adapter beside the kernel's). The page code is in ``kvlab/web/js/``: kvlab's caches there run the
native path's greedy graph (the token stays on the GPU, read back in bursts), and a captured static cache replays
its decode steps where onnxruntime-web can capture them.

It may import ``kvlab.core``, ``kvlab.ort`` (to read and check models, and for the CPU EP reference), ``kvlab.lab``
(the lab's prompt text and figures) and ``kvlab.bench`` (``kvlab bench``'s prompts); only the CLI imports it.
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
