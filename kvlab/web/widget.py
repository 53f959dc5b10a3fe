"""``BrowserLab``: the notebook widget that runs kvlab's caches on the attendee's own browser GPU. The kernel sends
the npm assets, the model's files and the job over the Jupyter comm channel (no side server, no CDN: it works on a
laptop, Binder, JupyterHub); the page sends back each step, then its result. The front end is
``kvlab/web/js/widget.mjs`` with the runner's modules, bundled into one ES module (``bundle``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import anywidget
import numpy as np
import traitlets

from ..core.errors import DeviceError, KvlabError
from ..lab.widgets import LAB_TEXT
from ..ort import generate
from ..ort.models.model import Model, load
from .assets import JS_DIR, NPM_FILES, npm_file, versions
from .job import Job, make_job
from .results import BrowserResult, adapter_kind, decode_stats, read_result

BUNDLE = ("counters.mjs", "caches.mjs", "decode.mjs", "captured.mjs", "tjs.mjs", "runner.mjs", "host.mjs", "widget.mjs")
CHUNK = 8 * 2**20  # bytes per comm message
SMALL_RUN = ("toy", 3, 32)  # what a software or low-memory adapter runs: model, prompt tokens, new tokens
SMALL_CACHES = ("dynamic", "static", "captured")  # and with which caches (the captured one where the page can)
RECORDED = "what-a-static-cache-buys"  # the recorded question whose curves a result is drawn over
_RELATIVE_IMPORT = re.compile(r"^import \{[^}]*\} from '\./[\w.]+\.mjs';\n", re.M)
_EXPORT = re.compile(r"^export (?=(async )?function |class |const )", re.M)


def bundle(names: Sequence[str]) -> str:
    """``kvlab/web/js``'s modules ``names`` as one ES module: their imports of each other removed (their names do
    not collide); the default export is the last module's (the others have none)."""
    parts = []
    for name in names:
        text = _RELATIVE_IMPORT.sub("", (JS_DIR / name).read_text())
        parts.append(f"// ---- {name}\n" + _EXPORT.sub("", text))
    return "\n".join(parts)


CSS = """
.kvlab-browser-lab { font-family: var(--jp-ui-font-family, sans-serif); padding: 4px 0; }
.kvlab-browser-lab button { margin: 4px 0; padding: 4px 12px; }
.kvlab-browser-status { color: var(--jp-ui-font-color2, #555); }
.kvlab-browser-summary { white-space: pre-wrap; margin: 4px 0; }
.kvlab-browser-plan, .kvlab-browser-progress { color: var(--jp-ui-font-color1, #222); }
"""


def run_bytes(job: Job) -> int:
    """What a run holds on the adapter at once, at least: the model's files and its largest cache (a static one at
    its max_cache_len, a dynamic one at the run's end)."""
    longest = max(c.max_cache_len or len(job.prompt_ids) + job.max_new_tokens for c in job.caches)
    return sum(f.stat().st_size for f in job.files) + longest * job.model.info.bytes_per_token


def adapter_plan(browser: dict[str, Any], job: Job) -> tuple[str, str]:
    """What the button runs on the browser that reported ``browser`` (its ``describeBrowser()`` answer), and the
    one line that says so: ("asked", ...) the job as made; ("small", ...) ``SMALL_RUN`` for a software adapter
    (SwiftShader, WARP, llvmpipe: minutes for the asked run; a job no larger than it runs as asked) or one whose
    largest buffer (maxBufferSize) is smaller than what the run holds (``run_bytes``); ("recorded", ...) nothing
    runs where the browser has no WebGPU adapter (or has not said which): the recorded run is shown instead.
    Never raises."""
    browser = browser if isinstance(browser, dict) else {}
    info = browser.get("adapter")
    if not info:
        said = "this browser has no WebGPU" if browser.get("name") else "the browser has not reported an adapter"
        why = browser.get("error") or said
        return "recorded", f"no WebGPU here ({why}): showing the recorded run instead"
    name, prompt, new = SMALL_RUN
    small = f"running {name} with a {prompt}-token prompt and {new} new tokens so that it finishes within a minute"
    if adapter_kind(info) == "software":
        if job.model.name == name and len(job.prompt_ids) + job.max_new_tokens <= prompt + new:
            return "asked", f"this adapter is software (a CPU drawing WebGPU); {name} as asked is small enough"
        return "small", f"this adapter is software (a CPU drawing WebGPU): {small}"
    limit = int(info.get("max_buffer_size") or 0)
    if limit and limit < run_bytes(job):
        return "small", f"this adapter's buffers hold at most {limit / 2**20:.0f} MiB: {small}"
    return "asked", f"this adapter is a GPU: running {job.model.name} as asked"


class BrowserLab(anywidget.AnyWidget):
    """Dynamic vs static KV cache on this browser's WebGPU: ``new_tokens`` greedy tokens after ``prompt`` (default:
    ``prompt_tokens`` tokens of the lab's text) with each of ``caches`` ("captured" needs a model built for capture).
    The job is checked when the widget is made (kvlab errors, in the cell that made it). ``browser`` holds what the
    page reported about itself (its name and WebGPU adapter) once it is shown. A press of its button runs what
    ``adapter_plan`` chooses for that adapter (``ran``: that job, ``plan``: the line saying why), with progress and
    a Cancel button; the kernel checks the result (``read_result``), runs the same greedy generation on its CPU EP
    and shows a summary: ``result`` is then a ``BrowserResult`` (None before, and after a cancel, which leaves the
    page's buffer counters in ``cancelled``). Where the browser has no WebGPU adapter nothing runs and the
    ``on_recorded`` callbacks draw the recording instead."""

    _esm = traitlets.Unicode(bundle(BUNDLE)).tag(sync=True)
    _css = traitlets.Unicode(CSS).tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)
    plan = traitlets.Unicode("").tag(sync=True)  # what the button runs on this adapter, in one line
    summary = traitlets.Unicode("").tag(sync=True)
    running = traitlets.Bool(False).tag(sync=True)
    browser = traitlets.Dict({}).tag(sync=True)  # set by the page: its name, its adapter's GPUAdapter.info

    def __init__(
        self,
        model: Model | str = "toy",
        prompt: Sequence[int] | np.ndarray | None = None,
        *,
        prompt_tokens: int = 32,
        new_tokens: int = 16,
        caches: Sequence[str] = ("dynamic", "static"),
        **job_options: Any,
    ) -> None:
        """``job_options``: the rest of ``kvlab.web.make_job``'s keyword arguments."""
        super().__init__()
        model = load(model)
        ids = model.tokens_of(LAB_TEXT, prompt_tokens) if prompt is None else prompt
        self.job: Job = make_job(model, ids, max_new_tokens=new_tokens, caches=caches, **job_options)
        self.ran: Job = self.job
        self._options = job_options
        self.cancelled: dict[str, int] | None = None
        self.result: BrowserResult | None = None
        self.steps: list[dict[str, Any]] = []
        self._callbacks: list[Callable[[BrowserResult], None]] = []
        self._recorded_callbacks: list[Callable[[], None]] = []
        caches_text = ", ".join(c.name for c in self.job.caches)
        self.status = (
            f"ready: {model.name}, {len(self.job.prompt_ids)}-token prompt, {new_tokens} new tokens, {caches_text}; "
            f"onnxruntime-web {versions()['onnxruntime-web']}, sent from this kernel"
        )
        self.on_msg(self._on_msg)

    def on_result(self, fn: Callable[[BrowserResult], None]) -> None:
        """``fn(result)`` is called with every result from now on, after the kernel checked it."""
        self._callbacks.append(fn)

    def on_recorded(self, fn: Callable[[], None]) -> None:
        """``fn()`` is called whenever a press finds no WebGPU adapter (nothing runs: the recorded run stands in)."""
        self._recorded_callbacks.append(fn)

    # -- messages
    def _on_msg(self, _widget: Any, content: dict[str, Any], buffers: list[Any]) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "start":
            if isinstance(content.get("browser"), dict) and content["browser"].get("name"):
                self.browser = content["browser"]
            self._start(set(content.get("have") or ()))
        elif kind == "step":
            self.steps.append(content.get("step") or {})
            self.status = f"running in the browser: {len(self.steps)} steps done"
        elif kind == "result":
            self._finish(content.get("result"))

    def _send_blob(self, name: str, data: bytes) -> None:
        count = max(1, -(-len(data) // CHUNK))
        for i in range(count):
            self.send({"type": "blob", "name": name, "index": i, "count": count}, [data[i * CHUNK : (i + 1) * CHUNK]])

    def _start(self, have: set[str]) -> None:
        self.cancelled, self.summary = None, ""
        kind, self.plan = adapter_plan(self.browser, self.job)
        if kind == "recorded":
            self.status = "nothing ran in this browser: the chart shows the recorded run"
            self.send({"type": "recorded"})
            for fn in self._recorded_callbacks:
                fn()
            return
        try:
            self.ran = self.job
            if kind == "small":  # SMALL_RUN with SMALL_CACHES, in the model's capture build: the captured row too
                name, prompt, new = SMALL_RUN
                model = load(name, graph_capture=True)
                ids = model.tokens_of(LAB_TEXT, prompt)
                self.ran = make_job(model, ids, max_new_tokens=new, caches=SMALL_CACHES, **self._options)
            self.running, self.steps, self.result = True, [], None
            npm = versions()
            assets = {  # the npm files the page needs, each named with its package's version
                key: f"npm:{path}@{npm['@huggingface/transformers' if key == 'transformers' else 'onnxruntime-web']}"
                for key, path in NPM_FILES.items()
                if key != "transformers" or self.ran.transformers_graph
            }
            for key, name in assets.items():
                if name not in have:
                    self.status = f"sending {NPM_FILES[key]} to the browser"
                    self._send_blob(name, npm_file(key).read_bytes())
            info = self.ran.model.info
            for name, file in self.ran.served.items():
                self._send_blob(f"model:{info.name}:{name}", file if isinstance(file, bytes) else file.read_bytes())
            self.status = "running in the browser (the first step compiles its shaders)"
            self.send({"type": "job", "job": self.ran.to_json(), "assets": assets})
        except KvlabError as exc:
            self.running, self.status = False, f"error: {exc}"

    def _finish(self, raw: Any) -> None:
        self.running = False
        if isinstance(raw, dict) and raw.get("cancelled"):
            counts = raw.get("counters") or {}
            self.cancelled = {k: int(counts.get(k, 0)) for k in ("created", "destroyed", "live")}
            self.status = (
                f"cancelled after {len(self.steps)} steps: the page released its buffers ({self.cancelled['created']} "
                f"created, {self.cancelled['destroyed']} destroyed, {self.cancelled['live']} live)"
            )
            return
        try:
            self.result = read_result(raw, self.ran)
        except DeviceError as exc:
            self.status = f"error: {exc}"
            return
        job = self.ran
        cpu = generate(job.model, job.prompt_ids, device="cpu", max_new_tokens=job.max_new_tokens, stop_on_eos=False)
        self.summary = summary_text(self.result, cpu.token_ids)
        self.status = f"done: the kernel received {len(self.result.generations)} runs from {self.result.host}"
        for fn in self._callbacks:
            fn(self.result)

    # -- results
    def over_recorded(self, question: str = RECORDED) -> Any:
        """The recorded curves of ``question`` (``kvlab.lab.recorded``: the dynamic cache's decode step over the
        static cache's against the context) with this browser's measured (dynamic, static) pairs drawn over them;
        the recorded curves alone before a result (or where nothing ran)."""
        from ..lab import recorded

        live = []
        if self.result is not None:
            runs = self.result.measured
            dyn = [g for g in runs if g.label.cache.kind == "dynamic"]
            sta = [g for g in runs if g.label.cache.kind == "static"]
            where = f"{self.ran.model.name} in this browser ({self.result.adapter.name})"
            live = [(where, list(zip(dyn, sta)))] if dyn and sta else []
        note = self.plan or "recorded runs only: press the button to add this browser's"
        return recorded.load(question).figure(live=live, note=note)


def with_chart(lab: BrowserLab, question: str = RECORDED) -> Any:
    """``lab`` above a chart (an ipywidgets Output) that shows ``lab.over_recorded(question)`` after every result,
    and the recorded curves alone when a press finds no WebGPU; returns the VBox holding both."""
    import ipywidgets

    chart = ipywidgets.Output()

    def draw(*_: Any) -> None:
        from IPython.display import display

        with chart:  # a figure displays itself (plotly's _ipython_display_): captured, not appended
            chart.clear_output(wait=True)
            display(lab.over_recorded(question))

    lab.on_result(draw)
    lab.on_recorded(draw)
    return ipywidgets.VBox([lab, chart])


def summary_text(result: BrowserResult, reference: list[int]) -> str:
    """Per cache the job ran: ``decode_stats``' median decode step, fresh KV tensors, new GPU storage buffers and GPU
    buffers of any kind per decode step, and how the token came back; a refused cache's row says why; then whether
    the greedy tokens equal ``reference`` (the kernel's CPU EP run)."""
    lines = [f"{result.host} · {result.adapter.name.split(' in ')[0]} ({result.adapter.kind})"]
    names = dict.fromkeys([*(g.job_cache for g in result.measured), *result.refused])
    for name in names:
        if name in result.refused:
            lines.append(f"{name}: refused: {result.refused[name]}")
            continue
        runs = result.by_cache(name)
        s, label = decode_stats(runs), runs[0].label
        token = "token on the host"
        if label.token_on_device:
            token = f"token on the GPU, read every {label.tokens_per_read}"
        lines.append(
            f"{name} ({runs[0].impl}; {token}): {s['decode_ms']:.1f} ms per decode step, {s['tensors_per_step']:g} "
            f"fresh KV tensors, {s['storage_buffers_per_step']:.2g} new GPU storage buffers and "
            f"{s['gpu_buffers_per_step']:.2g} GPU buffers of any kind per step"
        )
    equal = all(g.token_ids[: len(reference)] == reference[: len(g.token_ids)] for g in result.measured)
    lines.append(f"greedy tokens equal the kernel's CPU EP run: {equal}")
    if result.transformers and result.transformers.get("error"):
        lines.append(f"transformers.js: {result.transformers['error']}")
    return "\n".join(lines)
