"""``kvlab bench``'s plan and its paired, interleaved rounds.

For every (model, device, context) row, each variant first runs once to warm up, then ``reps`` times interleaved
(A B C A B C ...), so slow drifts of a noisy machine hit every variant alike. Per run the median decode step is
taken; per variant the median over runs and its min-max; per pair the ratio of runs i (against the dynamic cache).
Token ids must match between compared variants or the row is marked invalid. The machine's memory bandwidth is
measured before every round and after the last: each round's roofline uses the higher of the two around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..ort import Model, close_device, load, open_device
from ..ort.decode.caches.kv_precision import check_kv_precision, check_runs_here
from ..ort.runtime.gpu_memory import GpuMemory
from ..presets import BUILTIN_NAMES, check_precision
from .machine import cpu_times, memory_bandwidth
from .variants import KVLAB, MATMULS_ONLY, Run, Variant


@dataclass
class Plan:
    """What to sweep: ``targets`` are (model, device) pairs, a model a built-in name (tagged ``name:precision`` to
    run in that precision only), or a directory; ``quick`` is a small smoke run. Devices are "cpu" and "webgpu";
    per-device fields are keyed by them."""

    targets: list[tuple[str, str]] = field(default_factory=lambda: [("smollm2", "cpu"), ("kv-heavy", "webgpu")])
    precisions: list[str] = field(default_factory=lambda: ["fp32"])  # crossed with the untagged targets
    contexts: dict[str, list[int]] = field(
        default_factory=lambda: {"cpu": [256, 1024, 3072], "webgpu": [256, 1024, 2048, 3072, 4096]}
    )
    new_tokens: dict[str, int] = field(default_factory=lambda: {"cpu": 64, "webgpu": 6})
    static_lens: list[int] = field(default_factory=lambda: [4160])
    static_fit: dict[str, bool] = field(default_factory=lambda: {"cpu": True, "webgpu": False})  # + context+new
    reps: int = 3
    genai: dict[str, bool] = field(default_factory=lambda: {"cpu": True, "webgpu": False})  # the peer row, per
    # device (on WebGPU it prefills there itself, wrong where the package's WebGPU prefill is: off by default)
    buffer_cache_modes: list[str] = field(default_factory=lambda: ["bucket"])
    # where each device's rows prefill, once per cache kind, handed off to every run (None: each run prefills on
    # its own device). WebGPU: on the CPU (fast on a software adapter, and right where a WebGPU prefill is not)
    prefill_on: dict[str, str | None] = field(default_factory=lambda: {"cpu": None, "webgpu": "cpu"})
    gpu_memory: bool = True  # WebGPU where NVML reports: one more, untimed run per variant reading it every step
    check_every: list[int | None] = field(default_factory=lambda: [None])  # static caches: read back every present
    #                                     every k steps (None: the cache's default, a spot check a step)
    small_pages_twin: bool = True  # CPU: the fitted static cache again on a device whose weights stay in 4 KiB pages
    matmuls_only: bool = True  # CPU: the model's matrix products alone, each round
    graph_capture: bool = False  # WebGPU: kvlab's captured static caches (and genai captured, where genai runs
    #                              there) beside the uncaptured ones, on the model built for capture
    # per device: each static cache also with the greedy token kept on the device, beside its twin that chooses
    # it on the host (as genai does); on WebGPU by default, where which is faster depends on the model
    token_on_device: dict[str, bool] = field(default_factory=lambda: {"cpu": False, "webgpu": True})
    # packed KV precisions ("int8", "int4"): each cache also with its KV packed so, beside its twin; where the
    # runtime cannot pack (all but the WebGPU plugin EP on a software adapter) a ConfigError before anything runs
    kv_precisions: list[str] = field(default_factory=list)

    def runs(self) -> list[tuple[str, str, str]]:
        """Every (model, precision, device) the plan runs, in order: a tagged target in its precision, an untagged
        one in each of ``precisions``. ConfigError for a tag that is not a precision."""
        out = []
        for model, device in self.targets:
            name, precision = untag(model)
            out += [(name, p, device) for p in ([precision] if precision else self.precisions)]
        return out

    @classmethod
    def quick(cls) -> Plan:
        """A small smoke run: the toy model on the CPU EP and WebGPU, two contexts, two rounds."""
        return cls(
            targets=[("toy", "cpu"), ("toy", "webgpu")],
            contexts={"cpu": [64, 256], "webgpu": [64, 256]},
            new_tokens={"cpu": 8, "webgpu": 4},
            static_lens=[512],
            reps=2,
            small_pages_twin=False,
        )


def untag(model: str) -> tuple[str, str | None]:
    """``model`` as (name, precision): "smollm2:int4" -> ("smollm2", "int4"); a name or directory without a
    built-in name before its last ":" -> (model, None). ConfigError for a built-in name tagged with a precision that
    is not one."""
    name, colon, tag = model.rpartition(":")
    return (name, check_precision(tag)) if colon and name in BUILTIN_NAMES else (model, None)


@dataclass
class Rounds:
    """Every variant run ``reps`` times, interleaved round by round, with the machine measured around them."""

    runs: dict[Variant, list[Run]]
    bandwidth: list[float]  # GB/s per round: the higher of the measurements just before and just after it
    measured: list[float]  # every measurement: before each round, and after the last
    steal_fraction: float  # the hypervisor's share of this VM's CPU time meanwhile (nan where unknown)


def interleaved(runners: dict[Variant, Callable[..., Run]], reps: int) -> Rounds:
    """One warm-up run of every variant, then ``reps`` rounds of one run each, in order, with the memory bandwidth
    measured before every round and after the last."""
    for fn in runners.values():  # warm-up: shader compilation, allocator pools, page faults
        fn()
    runs: dict[Variant, list[Run]] = {v: [] for v in runners}
    measured: list[float] = []
    steal_start = cpu_times()
    for _ in range(reps):
        measured.append(memory_bandwidth(repeats=3)["best"])
        for v, fn in runners.items():
            runs[v].append(fn())
    measured.append(memory_bandwidth(repeats=3)["best"])
    steal, total = (b - a for a, b in zip(steal_start, cpu_times()))
    return Rounds(
        runs, [max(pair) for pair in zip(measured, measured[1:])], measured, steal / total if total else float("nan")
    )


def memory_traces(runners: dict[Variant, Callable[..., Run]]) -> dict[Variant, dict[str, Any]]:
    """One more run of each variant, untimed, reading the GPU memory this process holds (NVML) after every step:
    what the driver really gave, next to kvlab's exact tensor counts. Nothing where NVML is not available."""
    out = {}
    for v, fn in runners.items():
        trace = GpuMemory()
        if not trace.available or v.runner == MATMULS_ONLY:
            continue
        trace.sample()  # before the run
        fn(hooks=[trace] if v.runner == KVLAB else [trace.sample])  # kvlab: a step hook; genai: per token
        out[v] = {
            "gpu_memory_bytes": trace.bytes,
            "gpu_memory_growth_bytes": trace.bytes[-1] - trace.bytes[0],
            "gpu_memory_max_bytes": max(trace.bytes),
        }
    return out


def _nanmedian(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return float(np.median(finite)) if finite else float("nan")


def summarize(runs: dict[Variant, list[Run]], baseline: Variant) -> dict[Variant, dict[str, Any]]:
    """Per variant: medians over its runs, their spread, ratios to ``baseline`` paired run by run, and whether its
    tokens equal the baseline's."""
    ref = runs[baseline]
    out = {}
    for v, rs in runs.items():
        ms = [r.decode_ms for r in rs]
        ratios = [r.decode_ms / b.decode_ms for r, b in zip(rs, ref)]
        out[v] = {
            "decode_ms": float(np.median(ms)),
            "decode_ms_min": min(ms),
            "decode_ms_max": max(ms),
            "decode_ms_runs": ms,  # per round, in order: pairs any two variants
            "ratio_to_dynamic": float(np.median(ratios)),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "overhead_ms": _nanmedian([r.overhead_ms for r in rs]),
            "tensors_per_step": rs[0].tensors_per_step,
            "cpu_ms": _nanmedian([r.cpu_ms for r in rs]),
            "thread_cpu_ms": _nanmedian([r.thread_cpu_ms for r in rs]),
            "cpu_ms_runs": [r.cpu_ms for r in rs],
            "thread_cpu_ms_runs": [r.thread_cpu_ms for r in rs],
            "new_buffers_per_step": rs[-1].new_buffers_per_step,
            "bytes_per_step": rs[0].bytes_per_step,
            "tokens_equal": None if rs[0].token_ids is None else all(r.token_ids == ref[0].token_ids for r in rs),
        }
    return out


def prompt_ids(model: Any, length: int) -> np.ndarray:
    """Exactly ``length`` tokens of real English text (data/prompts/long.txt, repeated)."""
    text = (Path(__file__).resolve().parents[2] / "data" / "prompts" / "long.txt").read_text()
    return model.tokens_of(text, length)


def _device_of_first_pass(plan: Plan, device: str) -> Any:
    """The device as the plan's first pass opens it (WebGPU: a new context in the first buffer cache mode, as
    ``sweep._on_webgpu`` does), so that checking against it changes nothing the run would not."""
    if device != "webgpu":
        return open_device(device)
    close_device("webgpu")
    return open_device("webgpu", buffer_cache_mode=plan.buffer_cache_modes[0])


def load_checked(plan: Plan) -> dict[tuple[str, str], Model]:
    """Every model of the plan by (name, precision), loaded once, with every context checked to fit it (with its
    new tokens) before anything runs, so a bad context never discards the rows measured before it (ConfigError)."""
    models: dict[tuple[str, str], Model] = {}
    for name, precision, device in plan.runs():
        if (name, precision) not in models:
            models[name, precision] = load(name, precision=precision)
        model, new = models[name, precision], plan.new_tokens[device]
        for kv in plan.kv_precisions:
            if check_kv_precision(kv, "StaticCache") is not None:  # ("model": the model's own dtype, the twin)
                check_runs_here(kv, "StaticCache", model.info, _device_of_first_pass(plan, device))
        for context in plan.contexts[device]:
            if context + new > model.info.context_length:
                raise ConfigError(
                    f"context {context} + {new} new tokens exceed {model.name}'s context length "
                    f"{model.info.context_length}; use contexts up to "
                    f"{model.info.context_length - new}"
                )
    return models
