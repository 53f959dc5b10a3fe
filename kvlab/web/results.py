"""The page's result as kvlab records: checked field by field, then one ``Generation`` per run, with step records
every kvlab chart draws and a label that says what produced them (the browser or Node host, the adapter as its
``GPUAdapter.info`` reports it, onnxruntime-web's version, transformers.js's where it ran the dynamic cache)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import DeviceError
from ..core.generation import Generation
from ..core.labels import Adapter, CacheSpec, DeviceLabel, RunLabel
from ..core.records import COLUMNS, StepRecord
from .job import Job

# column -> (meaning, "exact" | "proxy" | "label"), beside kvlab.COLUMNS
WEB_COLUMNS: dict[str, tuple[str, str]] = {
    "gpu_buffers_created": (
        "GPU buffers the device created during the step: every GPUDevice.createBuffer call, counted by wrapping it "
        "in the page (KV, activations, kernel uniforms, staging)",
        "exact",
    ),
    "gpu_buffers_destroyed": (
        "GPU buffers destroyed during the step (GPUBuffer.destroy, wrapped the same way)",
        "exact",
    ),
    "gpu_bytes_created": ("bytes of the buffers created, as requested", "exact"),
    "gpu_bytes_destroyed": ("bytes of the buffers destroyed", "exact"),
    "storage_buffers_created": ("of the buffers created, storage buffers: tensors (KV, activations)", "exact"),
    "uniform_buffers_created": ("of the buffers created, uniform buffers: kernel parameters", "exact"),
    "staging_buffers_created": (
        "of the buffers created, MAP_READ/MAP_WRITE buffers: host copies (inputs up, logits down)",
        "exact",
    ),
    "gpu_buffers_live": (
        "buffers created since counting began and not destroyed, after the step (counting begins once the "
        "session is open: its weights are not included)",
        "exact",
    ),
}
# the page's counter for each column (counters.mjs): the column's name without "gpu_" and "buffers_"
_GPU_KEYS = {column: column.replace("buffers_", "").removeprefix("gpu_") for column in WEB_COLUMNS}
_STEP_INTS = ("step", "position", "n_tokens", "token", "cache_tensors_allocated", "cache_bytes_allocated")
_STEP_INTS += ("new_buffers", "live_cache_bytes")
IMPLS = ("onnxruntime-web", "transformers.js")
SOFTWARE = re.compile(r"swiftshader|warp|llvmpipe|lavapipe|microsoft basic render", re.I)  # CPU-made adapters


@dataclass
class BrowserStepRecord(StepRecord):
    """A step in a page: kvlab's ``StepRecord`` columns (``rss_bytes`` 0: a page cannot read its process's memory)
    plus the exact GPU buffer counts of ``WEB_COLUMNS``."""

    gpu_buffers_created: int
    gpu_buffers_destroyed: int
    gpu_bytes_created: int
    gpu_bytes_destroyed: int
    storage_buffers_created: int
    uniform_buffers_created: int
    staging_buffers_created: int
    gpu_buffers_live: int


assert [f for f in BrowserStepRecord.__dataclass_fields__ if f not in COLUMNS] == list(WEB_COLUMNS)


@dataclass(frozen=True)
class BrowserHost:
    """What ran the page: a browser, or Node with Dawn's bindings (not a browser)."""

    kind: str  # "browser" or "node"
    name: str  # the browser's brand and version, or "Node <version> + Dawn (npm webgpu <version>)"
    user_agent: str = ""
    headless: bool | None = None
    dawn_toggles: tuple[str, ...] = ()  # the Dawn toggles kvlab started the host with (``dawn_toggles``)

    def __str__(self) -> str:
        toggles = f", Dawn {'+'.join(self.dawn_toggles)}" if self.dawn_toggles else ""
        return self.name + (" (headless)" if self.headless else "") + toggles


@dataclass
class BrowserGeneration(Generation):
    """A ``Generation`` made in a page: also the host, which library ran the cache, and the round."""

    host: BrowserHost | None = None
    job_cache: str = ""  # the job's name for the cache ("dynamic", "static@N"; the label adds how it ran)
    impl: str = ""  # "onnxruntime-web" (kvlab's page code) or "transformers.js"
    rep: int = 0  # the measured round (-1: the warm-up round)
    warmup: bool = False
    release: dict[str, int] | None = None  # what the cache's release destroyed (kvlab's runs)

    def frame(self) -> Any:
        """``Generation.frame()``, with the host in ``attrs["host"]``."""
        df = super().frame()
        df.attrs["host"] = self.host
        return df


@dataclass
class BrowserResult:
    """Everything one page run reported; ``generations`` include the warm-up round's, flagged."""

    host: BrowserHost
    adapter: Adapter
    ort_version: str
    transformers: dict[str, Any] | None  # {"version", "error"} where transformers.js was asked for
    session_ms: float
    generations: list[BrowserGeneration]
    counters: dict[str, int] = field(default_factory=dict)  # the device's totals when the page finished
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    refused: dict[str, str] = field(default_factory=dict)  # cache name -> why it could not run (a captured cache)

    @property
    def measured(self) -> list[BrowserGeneration]:
        """The generations of the measured rounds (warm-up excluded)."""
        return [g for g in self.generations if not g.warmup]

    def by_cache(self, name: str) -> list[BrowserGeneration]:
        """The measured generations of the job's cache ``name`` ("dynamic", "static@N"), in round order."""
        return [g for g in self.measured if g.job_cache == name]


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str, among: Sequence[Any] = ()) -> Any:
    """``obj[key]``, checked to be a ``kind`` (a bool only where ``kind`` says so) and one of ``among`` when given."""
    if not isinstance(obj, dict) or key not in obj:
        raise DeviceError(f"the page's result has no {where}{key!r}")
    value = obj[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise DeviceError(f"the page's result: {where}{key!r} is {value!r}; expected {kind}")
    if not isinstance(value, kind):
        raise DeviceError(f"the page's result: {where}{key!r} is {type(value).__name__} {value!r:.60}; expected {kind}")
    if among and value not in among:
        raise DeviceError(f"the page's result: {where}{key!r} is {value!r}; expected one of {tuple(among)}")
    return value


def _number(obj: dict, key: str, where: str) -> float:
    value = float(_need(obj, key, (int, float), where))
    if not math.isfinite(value) or value < 0:
        raise DeviceError(f"the page's result: {where}{key!r} is {value!r}; expected a finite number >= 0")
    return value


def check_step(step: Any, where: str) -> dict[str, Any]:
    """One step record of the page, its fields checked."""
    if not isinstance(step, dict):
        raise DeviceError(f"the page's result: {where} is {type(step).__name__}; expected an object")
    for key in _STEP_INTS:
        _need(step, key, int, where)
    for key in ("wall_ms", "run_ms"):
        _number(step, key, where)
    if "read_with" in step:
        _need(step, "read_with", int, where)
    _need(step, "phase", str, where, among=("prefill", "decode"))
    gpu = _need(step, "gpu", dict, where)
    for key in _GPU_KEYS.values():
        _need(gpu, key, int, f"{where}gpu.")
    return step


def check_run(run: Any, job: Job, index: int) -> dict[str, Any]:
    """Run ``index`` of the page, checked against ``job``: its cache, its runner, a token and a step record per new
    token (``max_new_tokens`` of them, or fewer ending with a stop token of the job), the steps' tokens equal to
    the token list."""
    where = f"runs[{index}]."
    _need(run, "cache", str, where, among=[c.name for c in job.caches])
    _need(run, "impl", str, where, among=IMPLS)
    tokens = _need(run, "tokens", list, where)
    steps = _need(run, "steps", list, where)
    stopped = bool(tokens) and tokens[-1] in job.stop_tokens and len(tokens) <= job.max_new_tokens
    if len(steps) != len(tokens) or (len(tokens) != job.max_new_tokens and not stopped):
        raise DeviceError(
            f"the page's result: {where} has {len(tokens)} tokens and {len(steps)} steps; the job asked for "
            f"{job.max_new_tokens} of each, or fewer ending with one of its stop tokens {job.stop_tokens}"
        )
    for i, s in enumerate(steps):
        check_step(s, f"{where}steps[{i}].")
    if [s["token"] for s in steps] != tokens:
        raise DeviceError(f"the page's result: {where} its steps' tokens differ from its token list")
    return run


def adapter_kind(info: dict[str, Any]) -> str:
    """'software' for a fallback adapter or a CPU implementation (SwiftShader, WARP, llvmpipe), else 'hardware'."""
    text = " ".join(str(info.get(k) or "") for k in ("vendor", "architecture", "description"))
    return "software" if info.get("is_fallback") or SOFTWARE.search(text) else "hardware"


def adapter_label(info: dict[str, Any], host: BrowserHost) -> Adapter:
    """The adapter as its GPUAdapter.info reports it, named with the host that reached it."""
    vendor, arch = str(info.get("vendor", "")), str(info.get("architecture", ""))
    what = f"{vendor} {arch}".strip() or str(info.get("description", "")) or "an unnamed adapter"
    source = "GPUAdapter.info: " + ", ".join(
        f"{k}={info.get(k, '')!r}" for k in ("vendor", "architecture", "device", "description")
    )
    return Adapter(f"{what} in {host}", adapter_kind(info), "webgpu", source, "shader-f16" in info.get("features", []))


def _record(step: dict[str, Any], bytes_per_token: int) -> BrowserStepRecord:
    gpu, wall, run = step["gpu"], float(step["wall_ms"]), float(step["run_ms"])
    return BrowserStepRecord(
        **{key: step[key] for key in _STEP_INTS},
        phase=step["phase"],
        device="webgpu",
        copied_from="",
        wall_ms=wall,
        run_ms=run,
        overhead_ms=wall - run,
        used_cache_bytes=(step["position"] + step["n_tokens"]) * bytes_per_token,
        copy_bytes=0,
        rss_bytes=0,
        read_with=int(step.get("read_with", 0)),
        **{column: int(gpu[key]) for column, key in _GPU_KEYS.items()},
    )


def read_result(raw: Any, job: Job, dawn_toggles: tuple[str, ...] = ()) -> BrowserResult:
    """The page's result for ``job``, checked and turned into records; ``dawn_toggles``: those the host was started
    with (named in its label), none for a browser kvlab did not start. DeviceError when the page reported an error
    (its message, one line) and when a field is missing or of the wrong kind (naming the field and what was
    expected)."""
    if isinstance(raw, dict) and "error" in raw:
        raise DeviceError(f"the browser runner failed: {str(raw['error']).strip().splitlines()[0]}")
    if _need(raw, "version", int, "") != 1:
        raise DeviceError(f"the page's result has version {raw['version']!r}; this kvlab reads version 1")
    h = _need(raw, "host", dict, "")
    host = BrowserHost(
        _need(h, "kind", str, "host."),
        _need(h, "name", str, "host."),
        h.get("user_agent", ""),
        h.get("headless"),
        tuple(dawn_toggles),
    )
    adapter = adapter_label(_need(raw, "adapter", dict, ""), host)
    ort_version = _need(raw, "ort_version", str, "")
    tjs = raw.get("transformers")
    info = job.model.info
    generations = []
    for i, run in enumerate(_need(raw, "runs", list, "")):
        check_run(run, job, i)
        spec = next(c for c in job.caches if c.name == run["cache"])
        if run["impl"] == "transformers.js":
            version = f"{(tjs or {}).get('version', '?')} (onnxruntime-web {ort_version})"
            backend = ("transformers.js", version)
            spec = CacheSpec(spec.kind, spec.max_cache_len, "transformers.js")
        else:
            backend = ("onnxruntime-web", ort_version)
        device = DeviceLabel("webgpu", adapter, *backend, job.buffer_cache_mode or "bucket", job.validation_mode)
        own = run["impl"] == "onnxruntime-web" and job.reduction  # kvlab's own runs of the greedy graph
        greedy = {"token_on_device": True, "greedy_reduction": job.reduction, "tokens_per_read": job.tokens_per_read}
        label = RunLabel(info.name, info.dtype_name, device, spec, **(greedy if own else {}))
        generations.append(
            BrowserGeneration(
                label,
                list(job.prompt_ids),
                list(run["tokens"]),
                job.model.decode(run["tokens"]),
                "eos" if run["tokens"] and run["tokens"][-1] in job.stop_tokens else "max_new_tokens",
                [_record(s, info.bytes_per_token) for s in run["steps"]],
                host=host,
                job_cache=run["cache"],
                impl=run["impl"],
                rep=int(run.get("rep", 0)),
                warmup=bool(run.get("warmup", False)),
                release=run.get("release"),
            )
        )
    return BrowserResult(
        host,
        adapter,
        ort_version,
        tjs,
        float(raw.get("session_ms", 0.0)),
        generations,
        dict(raw.get("counters") or {}),
        raw,
        {str(k): str(v) for k, v in (raw.get("refused") or {}).items()},
    )


def _decode(g: BrowserGeneration, column: str = "wall_ms") -> list[float]:
    return [getattr(r, column) for r in g.records if r.phase == "decode"]


def decode_stats(runs: Sequence[BrowserGeneration], dynamic: Sequence[BrowserGeneration] = ()) -> dict[str, Any]:
    """Over one cache's measured rounds ``runs``: the median decode step (each round's median: "decode_ms"), its
    spread, its ratio to the dynamic cache's rounds ``dynamic`` paired by round (1 without them), session.run's
    median, the prefill's median, and tensors and GPU buffers created per decode step, averaged over the rounds."""
    medians = [float(np.median(_decode(r))) for r in runs]
    paired = [m / float(np.median(_decode(d))) for m, d in zip(medians, dynamic)] or [1.0]
    per_step = {
        "tensors_per_step": "cache_tensors_allocated",
        "gpu_buffers_per_step": "gpu_buffers_created",
        "storage_buffers_per_step": "storage_buffers_created",
        "staging_buffers_per_step": "staging_buffers_created",
        "new_buffers_per_step": "new_buffers",
    }
    return {
        "decode_ms": float(np.median(medians)),
        "decode_ms_min": float(min(medians)),
        "decode_ms_max": float(max(medians)),
        "decode_ms_runs": medians,
        "run_ms": float(np.median([np.median(_decode(r, "run_ms")) for r in runs])),
        "ratio_to_dynamic": float(np.median(paired)),
        "ratio_min": float(min(paired)),
        "ratio_max": float(max(paired)),
        "tokens_per_s": 1000.0 / float(np.median(medians)),
        "prefill_ms": float(np.median([r.records[0].wall_ms for r in runs])),
        **{k: float(np.mean([np.mean(_decode(r, col) or [0.0]) for r in runs])) for k, col in per_step.items()},
    }
