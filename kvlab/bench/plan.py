"""``kvlab bench``'s plan and its paired, interleaved rounds.

For every (model, device, context) row, each variant first runs once to warm up, then ``reps`` times interleaved
(A B C A B C ...), so slow drifts of a noisy machine hit every variant alike. Per run the median decode step is
taken; per variant the median over runs and its min-max; per pair the ratio of runs i (against the dynamic cache).
Token ids must match between compared variants or the row is marked invalid. The machine's memory bandwidth is
measured before every round and after the last: each round's roofline uses the higher of the two around it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError, check_choice
from ..ort import Model, close_device, load, open_device
from ..ort.runtime.backend import DEVICES
from ..ort.runtime.device import BUFFER_CACHE_MODES
from ..ort.runtime.gpu_memory import GpuMemory
from .machine import cpu_times, memory_bandwidth, roofline_ms
from .results import environment
from .variants import GENAI_GRAPH, KVLAB, MATMULS_ONLY, GenaiPeer, Run, Setting, Variant, small_pages_device, variants
from .weights import matmuls_only_model, weight_bytes_per_token


@dataclass
class Plan:
    """What to sweep. The defaults are the reference run for this class of machine (see data/README.md); ``quick``
    is a small smoke run. Devices are "cpu" and "webgpu"; per-device fields are keyed by them."""

    targets: list[tuple[str, str]] = field(default_factory=lambda: [("smollm2", "cpu"), ("kv-heavy", "webgpu")])
    precisions: list[str] = field(default_factory=lambda: ["fp32"])  # crossed with the targets
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
    gpu_memory: bool = True  # WebGPU on NVIDIA: one more, untimed run per variant reading NVML at every step
    check_every: list[int] = field(default_factory=lambda: [1])  # static caches: read back presents every k steps
    small_pages_twin: bool = True  # CPU: the fitted static cache again on a device whose weights stay in 4 KiB pages
    matmuls_only: bool = True  # CPU: the model's matrix products alone, each round
    graph_capture: bool = False  # WebGPU: kvlab's captured static caches (and genai captured, where genai runs
    #                              there) beside the uncaptured ones, on the model built for capture
    # per device: each static cache also with the greedy token kept on the device, beside its twin that chooses
    # it on the host (as genai does); on WebGPU by default, where which is faster depends on the model
    token_on_device: dict[str, bool] = field(default_factory=lambda: {"cpu": False, "webgpu": True})

    def __post_init__(self) -> None:
        if isinstance(self.genai, bool):  # genai=True/False: the CPU peer row on or off
            self.genai = {"cpu": self.genai, "webgpu": False}
        if isinstance(self.token_on_device, bool):  # token_on_device=True/False: on every device or none
            self.token_on_device = dict.fromkeys(DEVICES, self.token_on_device)

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            targets=[("toy", "cpu"), ("toy", "webgpu")],
            contexts={"cpu": [64, 256], "webgpu": [64, 256]},
            new_tokens={"cpu": 8, "webgpu": 4},
            static_lens=[512],
            reps=2,
            small_pages_twin=False,
        )


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


def load_checked(plan: Plan) -> dict[tuple[str, str], Model]:
    """Every model of the plan by (name, precision), loaded once, with every context checked to fit it (with its
    new tokens) before anything runs, so a bad context never discards the rows measured before it (ConfigError)."""
    models: dict[tuple[str, str], Model] = {}
    for (name, device), precision in ((t, p) for t in plan.targets for p in plan.precisions):
        if (name, precision) not in models:
            models[name, precision] = load(name, precision=precision)
        model, new = models[name, precision], plan.new_tokens[device]
        for context in plan.contexts[device]:
            if context + new > model.info.context_length:
                raise ConfigError(
                    f"context {context} + {new} new tokens exceed {model.name}'s context length "
                    f"{model.info.context_length}; use contexts up to "
                    f"{model.info.context_length - new}"
                )
    return models


class Interrupted(KeyboardInterrupt):
    """A plan stopped by Ctrl-C: ``result`` holds the rows of every context that finished (``complete`` False)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("kvlab bench interrupted")
        self.result = result


def run_plan(plan: Plan, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every row of ``plan``: ``{"environment", "plan", "rows", "complete"}``; ``log`` gets one line per row.
    A KeyboardInterrupt keeps what was measured: it arrives as ``Interrupted`` with the finished contexts' rows (a
    context's rows join the result all at once, after its last round). Raises ConfigError for a bad plan before
    anything runs."""
    for mode in plan.buffer_cache_modes:
        check_choice(mode, BUFFER_CACHE_MODES, "buffer cache mode ")
    models = load_checked(plan)
    bandwidth: dict[str, Any] = {**memory_bandwidth(), "paired": []}
    log("memory bandwidth (GB/s): " + ", ".join(f"{k} {v:.1f}" for k, v in bandwidth.items() if k != "paired"))
    rows: list[dict[str, Any]] = []
    genai_huge: list[int] = []  # bytes of the peer's memory collapsed into huge pages
    try:
        with tempfile.TemporaryDirectory(prefix="kvlab-bench-") as tmp:
            _run_plan(plan, models, log, Path(tmp), bandwidth, rows, genai_huge)
    except KeyboardInterrupt as stop:
        raise Interrupted(_result(plan, bandwidth, rows, sum(genai_huge), complete=False)) from stop
    return _result(plan, bandwidth, rows, sum(genai_huge), complete=True)


def _result(
    plan: Plan, bandwidth: dict[str, Any], rows: list[dict[str, Any]], genai_huge: int, complete: bool
) -> dict[str, Any]:
    bandwidth["best"] = max([bandwidth["best"], *bandwidth["paired"]])
    for row in rows:  # the strictest reading: every row against the highest bandwidth seen anywhere in the run
        row["roofline_fraction_at_run_best"] = (
            roofline_ms(row["weight_bytes"] + row["kv_read_bytes"], bandwidth["best"]) / row["decode_ms"]
        )
    return {"environment": environment(bandwidth, genai_huge), "plan": asdict(plan), "rows": rows, "complete": complete}


def _run_plan(
    plan: Plan,
    models: dict[tuple[str, str], Model],
    log: Callable[[str], None],
    tmp: Path,
    bandwidth: dict[str, Any],
    rows: list[dict[str, Any]],
    genai_huge: list[int],
) -> None:
    from tqdm.auto import tqdm

    for (name, device), precision in ((t, p) for t in plan.targets for p in plan.precisions):
        model = models[name, precision]
        model_name = model.name
        genai = GenaiPeer(model) if plan.genai.get(device) and device == "cpu" else None
        genai_huge.append(genai.huge_pages["bytes"] if genai else 0)
        graph_model = (
            load(name, precision=precision, graph_capture=True) if plan.graph_capture and device == "webgpu" else None
        )
        genai_graph = None
        weights = weight_bytes_per_token(model)
        for mode in plan.buffer_cache_modes if device == "webgpu" else [None]:
            if device == "webgpu":
                genai = genai_graph = setting = runners = (
                    None  # genai's sessions hold the WebGPU context: they go first
                )
                close_device("webgpu")  # a new context for each mode (ORT keeps one per process)
                dev = open_device("webgpu", buffer_cache_mode=mode)
                genai = GenaiPeer(model, "webgpu") if plan.genai.get(device) else None  # joins the new context
                if graph_model is not None and plan.genai.get(device):
                    genai_graph = GenaiPeer(graph_model, "webgpu", graph_capture=True)
            else:
                dev = open_device("cpu")
            small = None
            if device == "cpu" and plan.small_pages_twin and dev.huge_pages:
                dev.session(model.onnx_path)  # first: its collapse must not reach the twin's memory
                small = small_pages_device()
            with_floor = device == "cpu" and plan.matmuls_only and model.info.weights == "float32"  # fp32 MatMuls
            floor, floor_bytes = matmuls_only_model(model, tmp / model_name) if with_floor else (None, 0)
            new = plan.new_tokens[device]
            for context in tqdm(plan.contexts[device], desc=f"{model_name} on {device}", leave=False):
                setting = Setting(
                    model,
                    device,
                    prompt_ids(model, context),
                    new,
                    genai,
                    small,
                    floor,
                    prefill=plan.prefill_on.get(device),
                    graph_model=graph_model,
                    genai_graph=genai_graph,
                )
                runners, kept = variants(
                    setting,
                    plan.static_lens,
                    plan.static_fit.get(device, True),
                    tuple(plan.check_every),
                    plan.token_on_device[device],
                )
                try:
                    rounds = interleaved(runners, plan.reps)
                    traces = memory_traces(runners) if device == "webgpu" and plan.gpu_memory else {}
                finally:
                    for pre in kept:
                        pre.cache.dispose()
                summary = summarize(rounds.runs, next(iter(runners)))
                valid = all(s["tokens_equal"] is not False for s in summary.values())
                kv_read = (context + new // 2) * model.info.bytes_per_token
                bw = float(np.median(rounds.bandwidth))
                done = []
                for v, s in summary.items():
                    w, kv = (floor_bytes, 0) if v.runner == MATMULS_ONLY else (weights, kv_read)
                    paired = [roofline_ms(w + kv, b) / r.decode_ms for b, r in zip(rounds.bandwidth, rounds.runs[v])]
                    done.append(
                        {
                            "model": model_name,
                            "device": device,
                            "adapter": str(dev.adapter),
                            "adapter_kind": dev.adapter.kind,
                            "precision": precision,
                            "weights": model.info.weights,
                            "buffer_cache_mode": mode or "",
                            "dtype": model.info.dtype_name,
                            "context": context,
                            "kv_tensor_mib": context * model.info.bytes_per_token / model.info.layout.tensors / 2**20,
                            "new_tokens": new,
                            **v.fields(),
                            "reps": plan.reps,
                            "valid": valid,
                            "model_build": "enable_webgpu_graph"
                            if v.runner == GENAI_GRAPH or (v.cache is not None and v.cache.variant.startswith("graph"))
                            else "standard",
                            "prefill_on": setting.prefill or device,
                            "weight_bytes": w,
                            "kv_read_bytes": kv,
                            "bandwidth_gbps": bw,
                            "roofline_ms": roofline_ms(w + kv, bw),
                            "roofline_fraction": float(np.median(paired)),
                            "roofline_fraction_min": min(paired),
                            "roofline_fraction_max": max(paired),
                            "overhead_fraction": s["overhead_ms"] / s["decode_ms"],
                            "cpu_steal_fraction": rounds.steal_fraction,
                            **s,
                            **traces.get(v, {}),
                        }
                    )
                bandwidth["paired"].extend(rounds.measured)
                rows.extend(done)  # one step: an interrupt leaves a context's rows all in or all out
                log(_row_line(model_name, device, mode, context, summary, valid))
            if small is not None:
                small.close()
            if floor is not None:
                dev.forget(floor)  # its weights (a model's worth) go with the run
        genai = genai_graph = setting = runners = None


def _row_line(model: str, device: str, mode: str | None, context: int, summary: dict, valid: bool) -> str:
    parts = [f"{v.name} {s['decode_ms']:.1f} ms (x{s['ratio_to_dynamic']:.2f})" for v, s in summary.items()]
    return (
        f"{model}/{device}{'/' + mode if mode else ''} ctx {context}: "
        + ", ".join(parts)
        + ("" if valid else "  INVALID: tokens differ")
    )
