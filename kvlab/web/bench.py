"""``kvlab browser-bench``'s engine: the caches in a browser host at several contexts, as rows shaped like ``kvlab
bench``'s results (rows + environment), so the same figures draw them beside the native runs."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..bench.plan import prompt_ids
from ..core.devices import DEFAULT_VALIDATION
from ..core.errors import ConfigError, check_choice
from ..core.labels import cpu_adapter
from ..ort import generate
from ..ort.models.model import Model, load
from .assets import versions
from .job import make_job
from .results import BrowserGeneration, BrowserResult, decode_stats
from .run import run_job

REFERENCES = ("cpu", "caches")
# a row keeps these columns of its first round's step records, as lists ("step_<column>")
STEP_COLUMNS = (
    "wall_ms",
    "run_ms",
    "gpu_buffers_created",
    "gpu_buffers_destroyed",
    "storage_buffers_created",
    "cache_tensors_allocated",
)
MiB = 2**20


def row_of(
    model: Model,
    context: int,
    runs: list[BrowserGeneration],
    dynamic: list[BrowserGeneration],
    reference: list[int],
    result: BrowserResult,
    fitted: bool,
) -> dict[str, Any]:
    """One results row for one cache at one context (``runs``: its measured rounds, in order; ``fitted``: a static
    cache sized for this run, not given a size): where it ran, the cache, ``decode_stats`` against the dynamic
    cache's rounds, whether every round's tokens equal ``reference``, the first round's tokens and per-step values,
    the validation mode, the Dawn toggles its host was started with and whether Dawn validated the device's calls."""
    g = runs[0]
    spec = g.label.cache
    equal = all(r.token_ids == reference for r in runs)
    return {
        "model": model.name,
        "device": "webgpu",
        "adapter": str(result.adapter),
        "adapter_kind": result.adapter.kind,
        "host": str(result.host),
        "host_kind": result.host.kind,
        "precision": precision_of(model),
        "weights": model.info.weights,
        "buffer_cache_mode": g.label.device.buffer_cache_mode,
        "dtype": model.info.dtype_name,
        "context": context,
        "kv_tensor_mib": model.info.entries[0].nbytes(context) / MiB,
        "validation_mode": g.label.device.validation_mode,
        "dawn_toggles": ",".join(result.host.dawn_toggles),  # "" where Dawn runs as its host starts it
        "dawn_validates": result.raw.get("dawn_validates"),  # as the page's device showed it (None: not reported)
        "new_tokens": len(g.token_ids),
        "variant": spec.name,
        "runner": "transformers.js" if g.impl == "transformers.js" else "kvlab",
        "impl": g.impl,
        "runtime": g.label.device.runtime,
        "cache_kind": spec.kind,
        "max_cache_len": spec.max_cache_len,
        "fitted": fitted,
        "cache_variant": spec.variant,
        "reps": len(runs),
        "valid": equal,
        "tokens_equal": equal,
        **decode_stats(runs, dynamic),
        "released_buffers": g.release["buffers_destroyed"] if g.release else None,
        "tokens": list(g.token_ids),
        **{f"step_{column}": [getattr(r, column) for r in g.records] for column in STEP_COLUMNS},
    }


def precision_of(model: Model) -> str:
    """The precision a built-in model was built in (its kvlab_recipe.json), else what its weights are."""
    recipe = model.info.path / "kvlab_recipe.json"
    try:
        return str(json.loads(recipe.read_text())["precision"])
    except (OSError, ValueError, KeyError):
        return model.info.weights


def environment(results: Sequence[BrowserResult], host: str, adapter: str) -> dict[str, Any]:
    """Where the rows were measured: the host and adapter the pages reported, the npm and Python versions."""
    from ..ort.runtime.backend import versions as python_versions

    r0 = results[0] if results else None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "kind": "browser-bench",
        "host": str(r0.host) if r0 else host,
        "host_kind": r0.host.kind if r0 else host,
        "user_agent": r0.host.user_agent if r0 else "",
        "adapter": str(r0.adapter) if r0 else "",
        "adapter_info": r0.raw.get("adapter") if r0 else None,
        "adapter_choice": adapter,
        "backend": "onnxruntime-web WebGPU EP" + (" in a browser" if r0 and r0.host.kind == "browser" else ""),
        "backend_package": "onnxruntime-web",
        "backend_version": r0.ort_version if r0 else versions()["onnxruntime-web"],
        "transformers_js": r0.transformers if r0 else None,
        "npm_versions": versions(),
        "versions": python_versions(),
        "cpu": cpu_adapter().name,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit or "unknown",
    }


def browser_bench(
    models: Sequence[Model | str],
    contexts: Sequence[int],
    *,
    precision: str | None = None,
    new_tokens: int = 16,
    caches: Sequence[str] = ("dynamic", "static"),
    host: str = "chromium",
    adapter: str = "auto",
    reference: str = "cpu",
    timeout: float = 600,
    on_line: Callable[[str], None] = print,
    **job_options: Any,
) -> dict[str, Any]:
    """A browser benchmark: one page per (model, context), each a prompt of exactly ``context`` real-text tokens
    (``kvlab bench``'s), each cache ``new_tokens`` greedy tokens, ``reps`` measured rounds after a warm-up round,
    interleaved. Every job is checked before the first page starts. Returns {"environment", "plan", "rows", "runs"}:
    one row per (model, context, cache) (``row_of``), compared with ``reference`` ("cpu": kvlab's own CPU EP run of
    the same prompt; "caches": the page's caches against each other); ``runs`` keeps every run's step records;
    ``refused`` lists the caches a page could not run (a captured cache onnxruntime-web cannot capture) and why.
    ``on_line`` receives one progress line per finished page; a KeyboardInterrupt stops after releasing the page
    that was running. ``job_options``: the rest of ``make_job``'s keyword arguments (``reps``, default 2 here;
    ``warmup``, ``dynamic_impl``, ``buffer_cache_mode``, ``validation_mode``: "disabled" unless given, as native)."""
    job_options.setdefault("reps", 2)
    check_choice(reference, REFERENCES, "reference=")
    if not contexts:
        raise ConfigError("contexts is empty; give at least one prompt length")
    loaded = [load(m, precision=precision) for m in models]
    jobs = []  # everything checked before the first browser starts
    for model in loaded:
        for context in contexts:
            ids = prompt_ids(model, context)  # the text kvlab bench's prompts come from
            jobs.append((model, context, make_job(model, ids, max_new_tokens=new_tokens, caches=caches, **job_options)))
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    results: list[BrowserResult] = []
    refused: list[dict[str, Any]] = []
    for model, context, job in jobs:
        t0 = time.monotonic()
        result = run_job(job, host=host, adapter=adapter, timeout=timeout)
        results.append(result)
        by_name = {spec.name: result.by_cache(spec.name) for spec in job.caches}
        if reference == "cpu":  # kvlab's CPU EP run of the same prompt
            ref = generate(model, job.prompt_ids, device="cpu", max_new_tokens=new_tokens, stop_on_eos=False).token_ids
        else:  # the first cache's first measured round: every run of every cache is compared with it
            ref = next(iter(by_name.values()))[0].token_ids
        fitted = {spec.name for spec, asked in zip(job.caches, caches) if asked == "static"}
        page = [
            row_of(model, context, measured, by_name.get("dynamic", []), ref, result, name in fitted)
            for name, measured in by_name.items()
            if measured  # a refused cache has no runs: the result's "refused" says why
        ]
        rows += page
        where = {"model": model.name, "context": context}
        runs += [
            {**where, "cache": g.label.cache.name, "impl": g.impl, "rep": g.rep, "warmup": g.warmup}
            | {"release": g.release, "steps": [asdict(r) for r in g.records]}
            for g in result.generations
        ]
        refused += [{**where, "cache": c, "why": w} for c, w in result.refused.items()]
        said = [
            f"{r['variant']} {r['decode_ms']:.1f} ms/step, {r['storage_buffers_per_step']:g} storage buffers/step, "
            f"tokens equal: {r['tokens_equal']}"
            for r in page
        ]
        on_line(f"{model.name} context {context}: " + "; ".join(said) + f" [{time.monotonic() - t0:.0f} s]")
    plan = {
        "models": [m.name for m in loaded],
        "contexts": list(contexts),
        "new_tokens": new_tokens,
        "caches": [str(c) for c in caches],
        **job_options,
        "host": host,
        "adapter": adapter,
        "buffer_cache_mode": job_options.get("buffer_cache_mode") or "bucket",
        "validation_mode": job_options.get("validation_mode", DEFAULT_VALIDATION),
        "reference": reference,
    }
    env = environment(results, host, adapter)
    return {"environment": env, "plan": plan, "rows": rows, "runs": runs, "refused": refused}
