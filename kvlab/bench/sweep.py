"""``kvlab bench``'s run of a plan (``run_plan``): each target on its device (on WebGPU once per buffer cache mode),
each context's variants in the plan's interleaved rounds, and one row per variant, measured against the memory
bandwidth of its rounds. A context's rows join the result all at once, so an interrupt keeps whole contexts."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..core.devices import BUFFER_CACHE_MODES
from ..core.errors import check_choice
from ..ort import Model, close_device, load, open_device
from ..ort.runtime.device import private_device
from ..ort.runtime.options import webgpu_options
from .machine import memory_bandwidth, roofline_ms
from .plan import Plan, Rounds, interleaved, load_checked, memory_traces, prompt_ids, summarize
from .results import environment
from .variants import GENAI_GRAPH, MATMULS_ONLY, GenaiPeer, Setting, Variant, variants
from .weights import matmuls_only_model, weight_bytes_per_token


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
    sweep = _Sweep(plan, log, bandwidth)
    try:
        with tempfile.TemporaryDirectory(prefix="kvlab-bench-") as tmp:
            for name, precision, device in plan.runs():
                model = models[name, precision]
                target = _Target(model, name, precision, device, weight_bytes_per_token(model))
                if device == "webgpu":
                    _on_webgpu(sweep, target)
                else:
                    _on_cpu(sweep, target, Path(tmp))
    except KeyboardInterrupt as stop:
        raise Interrupted(_result(sweep, complete=False)) from stop
    return _result(sweep, complete=True)


def _result(sweep: _Sweep, complete: bool) -> dict[str, Any]:
    bandwidth, rows = sweep.bandwidth, sweep.rows
    bandwidth["best"] = max([bandwidth["best"], *bandwidth["paired"]])
    for row in rows:  # the strictest reading: every row against the highest bandwidth seen anywhere in the run
        row["roofline_fraction_at_run_best"] = (
            roofline_ms(row["weight_bytes"] + row["kv_read_bytes"], bandwidth["best"]) / row["decode_ms"]
        )
    env = environment(bandwidth, sweep.genai_huge)
    return {"environment": env, "plan": asdict(sweep.plan), "rows": rows, "complete": complete}


@dataclass
class _Sweep:
    """What one run_plan gathers as it goes: the memory bandwidth paired with each round, the finished rows, and
    the bytes of the genai peers' memory collapsed into huge pages."""

    plan: Plan
    log: Callable[[str], None]
    bandwidth: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    genai_huge: int = 0


@dataclass(frozen=True)
class _Target:
    """One (model, device, precision) of the plan."""

    model: Model
    name: str  # as the plan names it (a built-in name or a directory)
    precision: str
    device: str
    weights: int  # the model's weight bytes read per decode step


@dataclass(frozen=True)
class _Pass:
    """One pass over a target's contexts: the device it runs on (on WebGPU, one per buffer cache mode) and what
    every context's setting shares."""

    target: _Target
    dev: Any  # the Device
    mode: str | None  # its WebGPU buffer cache mode (None on the CPU EP)
    base: Setting  # every context's setting but its prompt
    floor_bytes: int = 0  # the matmuls-only graph's weight bytes (CPU)


def _on_cpu(sweep: _Sweep, t: _Target, tmp: Path) -> None:
    """A target on the CPU EP: its genai peer, the 4 KiB-pages twin's device and the matmuls-only graph where the
    plan asks for them (the graph in ``tmp``), then every context."""
    plan, model = sweep.plan, t.model
    genai = GenaiPeer(model) if plan.genai.get(t.device) else None
    sweep.genai_huge += genai.huge_pages["bytes"] if genai else 0
    dev = open_device("cpu")
    small = None
    if plan.small_pages_twin and dev.huge_pages:
        dev.session(model.onnx_path)  # first: its collapse must not reach the twin's memory
        small = private_device("cpu", huge_pages=False)  # the same model and cache from weights in 4 KiB pages
    with_floor = plan.matmuls_only and model.info.weights == "float32"  # fp32 MatMuls
    floor, floor_bytes = matmuls_only_model(model, tmp / model.name) if with_floor else (None, 0)
    base = Setting(model, t.device, np.empty(0, np.int64), plan.new_tokens[t.device], genai, small, floor)
    _contexts(sweep, _Pass(t, dev, None, base, floor_bytes))
    if small is not None:
        small.close()
    if floor is not None:
        dev.forget(floor)  # its weights (a model's worth) go with the run


def _on_webgpu(sweep: _Sweep, t: _Target) -> None:
    """A target on WebGPU: every context once per buffer cache mode, each mode in a new WebGPU context, its genai
    peers given the mode too (on the plugin EP they join that context; with onnxruntime-webgpu genai's context is
    its own: ``GenaiPeer``). The previous mode's peers are gone by then: their sessions hold the context."""
    plan = sweep.plan
    graph_model = load(t.name, precision=t.precision, graph_capture=True) if plan.graph_capture else None
    peers = plan.genai.get(t.device)
    for mode in plan.buffer_cache_modes:
        genai_options = webgpu_options(mode)
        close_device("webgpu")  # a new context for each mode (ORT keeps one per process)
        dev = open_device("webgpu", buffer_cache_mode=mode)
        base = Setting(
            t.model,
            t.device,
            np.empty(0, np.int64),
            plan.new_tokens[t.device],
            GenaiPeer(t.model, "webgpu", options=genai_options) if peers else None,
            prefill=plan.prefill_on.get(t.device),
            graph_model=graph_model,
            genai_graph=GenaiPeer(graph_model, "webgpu", True, genai_options) if graph_model and peers else None,
            kv_precisions=tuple(plan.kv_precisions),
        )
        _contexts(sweep, _Pass(t, dev, mode, base))
        del base  # its genai peers, before the next mode's close_device


def _contexts(sweep: _Sweep, p: _Pass) -> None:
    """Every context of the pass: its variants run in interleaved rounds (and once more each for the GPU memory
    traces), then its rows join the sweep all at once and one line goes to the log."""
    from tqdm.auto import tqdm

    plan, t = sweep.plan, p.target
    for context in tqdm(plan.contexts[t.device], desc=f"{t.model.name} on {t.device}", leave=False):
        setting = replace(p.base, ids=prompt_ids(t.model, context))
        runners, kept = variants(
            setting,
            plan.static_lens,
            plan.static_fit.get(t.device, True),
            tuple(plan.check_every),
            plan.token_on_device[t.device],
        )
        try:
            rounds = interleaved(runners, plan.reps)
            traces = memory_traces(runners) if t.device == "webgpu" and plan.gpu_memory else {}
        finally:
            for pre in kept:
                pre.cache.dispose()
        summary = summarize(rounds.runs, next(iter(runners)))
        # packed KV is lossy (and prefills on its own device): its tokens are reported, not required equal
        valid = all(s["tokens_equal"] is not False for v, s in summary.items() if not v.packed_kv)
        rows = _rows(p, setting, plan.reps, rounds, summary, traces, valid)
        sweep.bandwidth["paired"].extend(rounds.measured)
        sweep.rows.extend(rows)  # one step: an interrupt leaves a context's rows all in or all out
        sweep.log(_row_line(t.model.name, t.device, p.mode, context, summary, valid))


def _rows(
    p: _Pass,
    setting: Setting,
    reps: int,
    rounds: Rounds,
    summary: dict[Variant, dict[str, Any]],
    traces: dict[Variant, dict[str, Any]],
    valid: bool,
) -> list[dict[str, Any]]:
    """One row per variant of a context: where it ran, the variant, its medians and each against the roofline of
    the bandwidth measured around its rounds (the matmuls-only row reads its graph's weights and no cache)."""
    t, info, dev = p.target, p.target.model.info, p.dev
    context, new = len(setting.ids), setting.new
    kv_read = (context + new // 2) * info.bytes_per_token
    bw = float(np.median(rounds.bandwidth))
    rows = []
    for v, s in summary.items():
        w, kv = (p.floor_bytes, 0) if v.runner == MATMULS_ONLY else (t.weights, kv_read)
        paired = [roofline_ms(w + kv, b) / r.decode_ms for b, r in zip(rounds.bandwidth, rounds.runs[v])]
        captured = v.runner == GENAI_GRAPH or (v.cache is not None and v.cache.variant.startswith("graph"))
        rows.append(
            {
                "model": t.model.name,
                "device": t.device,
                "adapter": str(dev.adapter),
                "adapter_kind": dev.adapter.kind,
                "precision": t.precision,
                "weights": info.weights,
                "buffer_cache_mode": p.mode or "",
                "dtype": info.dtype_name,
                "context": context,
                "kv_tensor_mib": context * info.bytes_per_token / info.layout.tensors / 2**20,
                "new_tokens": new,
                **v.fields(),
                "reps": reps,
                "valid": valid,
                "model_build": "enable_webgpu_graph" if captured else "standard",
                "prefill_on": setting.prefill or t.device,
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
    return rows


def _row_line(model: str, device: str, mode: str | None, context: int, summary: dict, valid: bool) -> str:
    parts = [f"{v.name} {s['decode_ms']:.1f} ms (x{s['ratio_to_dynamic']:.2f})" for v, s in summary.items()]
    return (
        f"{model}/{device}{'/' + mode if mode else ''} ctx {context}: "
        + ", ".join(parts)
        + ("" if valid else "  INVALID: tokens differ")
    )
