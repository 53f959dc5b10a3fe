"""Run kvlab's caches on onnxruntime-web's WebGPU from Python: in headless Chromium (served from 127.0.0.1) or in
Node with Dawn; the notebook widget (``kvlab.web.widget``) runs the same page code in the attendee's own browser."""

from __future__ import annotations

from typing import Any

from ..core.errors import check_choice, check_flag
from ..ort.models.model import Model, load
from .chromium import Chromium
from .job import Job, dawn_toggles, make_job
from .node import run_node
from .results import BrowserResult, read_result
from .server import PageServer

HOSTS = ("chromium", "node")


def run_job(
    job: Job,
    *,
    host: str = "chromium",
    adapter: str = "auto",
    timeout: float = 600,
) -> BrowserResult:
    """``job`` run in headless Chromium ("chromium") or in Node with Dawn ("node"), its result read
    (``results.read_result``); ``adapter`` as ``chromium.adapter_flags`` takes it. The browser or node process and
    the server are closed exactly once, also on error and KeyboardInterrupt; DeviceError when the page failed or ran
    past ``timeout`` seconds. Either host is started with the Dawn toggles of the job's validation mode
    (``dawn_toggles``), named in the result's host."""
    check_choice(host, HOSTS, "host=")
    toggles = dawn_toggles(job.validation_mode)
    if host == "node":
        return read_result(run_node(job, timeout, adapter, toggles), job, toggles)
    with PageServer(job) as server, Chromium(server.url, adapter=adapter, dawn=toggles) as browser:
        raw = server.wait_result(timeout, browser.alive)
    return read_result(raw, job, toggles)


def browser_generate(
    model: Model | str,
    prompt: Any,
    *,
    chat: bool = False,
    host: str = "chromium",
    adapter: str = "auto",
    timeout: float = 600,
    **job_options: Any,
) -> BrowserResult:
    """Greedy generations after ``prompt`` (text, chat messages or token ids) with each cache, in a browser host.
    ``job_options``: ``make_job``'s keyword arguments (``max_new_tokens``, ``caches``, ``reps``, ``warmup``,
    ``dynamic_impl``: "auto" (transformers.js where the host is a browser and it runs the model, else
    onnxruntime-web directly, fresh outputs every step as transformers.js does), "transformers.js" (or an error),
    "onnxruntime-web"; ``validation_mode``, ...). Raises kvlab errors for bad inputs before anything starts
    (``make_job``), then runs as ``run_job``: a ``BrowserResult``, one ``BrowserGeneration`` per cache and round."""
    model = load(model)
    check_flag("chat", chat)
    job = make_job(model, model.encode(prompt, chat=chat), **job_options)
    return run_job(job, host=host, adapter=adapter, timeout=timeout)
