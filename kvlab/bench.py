"""``kvlab bench``: paired, interleaved decode benchmarks of the caches, with onnxruntime-genai as a peer and the
machine's memory bandwidth as the roofline.

For every (model, device, context) row, each variant (dynamic, static at one or more max_cache_len, genai) first
runs once to warm up, then ``reps`` times interleaved (A B C A B C ...), so slow drifts of a noisy machine hit
every variant alike. Per run the median decode step is taken; per variant the median over runs and its min-max;
per pair the ratio of runs i (against the row's baseline). Token ids must match between compared variants or the
row is marked invalid. Results: JSON + CSV with the full environment, and plotly charts (HTML, PNG via kaleido).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .caches import Cache, DynamicCache, StaticCache
from .errors import ConfigError
from .generate import Stepper, generate
from .instrument import StepRecord
from .models import Model, load
from . import memory
from .runtime import (BUFFER_CACHE_MODES, Device, backend, close_device, cpu_adapter, cpu_options, describe,
                      open_device, opened)

# WebGPU buffer pool buckets a KV tensor crosses (knowledge/ort_webgpu.md, buffer_manager.cc)
BUCKETS_MIB = (4, 8, 12, 16)


@dataclass
class Plan:
    """What to sweep. The defaults are the reference run for this class of machine (see data/README.md)."""

    targets: list[tuple[str, str]] = field(default_factory=lambda: [("smollm2", "cpu"), ("kv-heavy", "webgpu")])
    contexts: dict[str, list[int]] = field(default_factory=lambda: {
        "cpu": [256, 1024, 3072], "webgpu": [256, 1024, 2048, 3072, 4096]})
    new_tokens: dict[str, int] = field(default_factory=lambda: {"cpu": 64, "webgpu": 6})
    static_lens: list[int] = field(default_factory=lambda: [4160])
    static_fit: dict[str, bool] = field(default_factory=lambda: {"cpu": True, "webgpu": False})  # + context+new
    reps: int = 3
    genai: bool = True  # the peer row (CPU only: its WebGPU prefill would run on the device)
    buffer_cache_modes: list[str] = field(default_factory=lambda: ["bucket"])
    webgpu_prefill_on_cpu: bool = True  # the handoff (kvlab.generate prefill_device="cpu")
    small_pages_twin: bool = True  # CPU: the fitted static cache again on a device whose weights stay in 4 KiB pages
    matmuls_only: bool = True  # CPU: the model's matrix products alone, each round (MATMULS_ONLY)

    @classmethod
    def quick(cls) -> "Plan":
        return cls(targets=[("toy", "cpu"), ("toy", "webgpu")], contexts={"cpu": [64, 256], "webgpu": [64, 256]},
                   new_tokens={"cpu": 8, "webgpu": 4}, static_lens=[512], reps=2, small_pages_twin=False)


@dataclass
class Run:
    """One generation of one variant."""

    token_ids: list[int] | None  # None: a run that makes no tokens (the matmuls-only floor)
    decode_ms: float  # median wall time of the decode steps
    overhead_ms: float  # median Python time outside session.run per decode step
    tensors_per_step: float  # median cache tensors the runtime allocated per decode step
    new_buffers_per_step: float
    bytes_per_step: float


def _run(tokens: list[int], records: list[StepRecord]) -> Run:
    dec = [r for r in records if r.phase == "decode"]
    med = lambda key: float(np.median([getattr(r, key) for r in dec]))  # noqa: E731
    return Run(tokens, med("wall_ms"), med("overhead_ms"), med("cache_tensors_allocated"), med("new_buffers"),
               med("cache_bytes_allocated"))


SMALL_PAGES = " 4KiB-pages"  # suffix of the twin variant


def small_pages_device() -> Device:
    """A private CPU device whose sessions' weights stay in 4 KiB pages, beside the open (huge-page) one: the
    same model and cache decoded from both, interleaved in one process, measure what huge pages change."""
    return Device("cpu", backend(), cpu_adapter(), cpu_options(huge_pages=False))


MATMULS_ONLY = "matmuls only"  # the variant: the model's own matrix products, nothing else


def matmuls_only_model(model: Model, out: Path) -> tuple[Path, int]:
    """A graph of the model's MatMuls alone: the same weight tensors (read from a copy of the model's external
    data file in ``out``), each fed a constant row. Running it once costs what one decode step's matrix
    products cost with nothing around them: the floor ONNX Runtime's MatMul kernel sets, which the rest of a
    step (attention, norms, scheduling, Python) adds to. Returns its path and the weight bytes one run reads."""
    import onnx
    from onnx import TensorProto, external_data_helper, helper

    src = onnx.load(str(model.onnx_path), load_external_data=False)
    inits = {t.name: t for t in src.graph.initializer}
    nodes, weights, rows, outputs, nbytes = [], [], set(), [], 0
    for node in src.graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
            continue
        k, n = w.dims
        y = f"y{len(nodes)}"
        rows.add(k)
        weights.append(w)
        nodes.append(helper.make_node("MatMul", [f"x{k}", w.name], [y]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, n]))
        nbytes += k * n * 4
    if not nodes:
        raise ConfigError(f"{model.name} has no fp32 MatMul with a weight initializer: no matmuls-only floor")
    graph = helper.make_graph(nodes, "matmuls_only",
                              [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in sorted(rows)],
                              outputs, weights)
    floor = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=src.ir_version)
    out.mkdir(parents=True, exist_ok=True)
    for w in weights:  # ORT reads external data only from the model file's own directory: no links out of it,
        if external_data_helper.uses_external_data(w):  # and onnx refuses a data file with several hard links
            name = external_data_helper.ExternalDataInfo(w).location
            if not (out / name).exists():
                shutil.copyfile(Path(model.onnx_path).parent / name, out / name)
    path = out / "matmuls_only.onnx"
    onnx.save(floor, str(path))
    return path, nbytes


def run_matmuls_only(path: Path, device: str | Device, steps: int) -> Run:
    """``steps`` runs of the matmuls-only graph, bound once like a static cache's decode step; the median wall."""
    session = (open_device(device) if isinstance(device, str) else device).session(path, "the matmuls-only floor")
    b = session.binding()
    for i in session._sess.get_inputs():
        b.input(i.name, np.full(i.shape, 0.01, np.float32))
    for o in session._sess.get_outputs():
        b.output(o.name, np.empty(o.shape, np.float32))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        b.run()
        times.append((time.perf_counter() - start) * 1e3)
    return Run(None, float(np.median(times[1:])), float("nan"), float("nan"), float("nan"), float("nan"))


def run_kvlab(model: Model, ids: np.ndarray, make_cache: Callable[[], Cache], device: str | Device,
              new: int) -> Run:
    with make_cache() as cache:
        g = generate(model, ids, cache=cache, device=device, max_new_tokens=new, stop_on_eos=False)
    return _run(g.token_ids, g.records)


@dataclass
class Prefilled:
    """A CPU prefill kept for reuse: every run of a variant hands it off to the device and decodes (the same
    path as ``generate(prefill_device="cpu")``, without recomputing a quadratic prefill per run)."""

    cache: Cache
    first_token: int


def prefill_on_cpu(model: Model, ids: np.ndarray, cache: Cache) -> Prefilled:
    with Stepper(model, cache, open_device("cpu"), len(ids)) as st:
        _, record = st.step(ids, logits_out="none")
    return Prefilled(cache, record.token)


def run_handoff(model: Model, pre: Prefilled, make_cache: Callable[[], Cache], device: str, new: int) -> Run:
    records: list[StepRecord] = []
    with make_cache() as cache, Stepper(model, cache, open_device(device), pre.cache.seq_length + new - 1,
                                        [records.append]) as st:
        st.receive(pre.cache)
        tokens = [pre.first_token]
        while len(tokens) < new:
            tokens.append(st.step(np.array([tokens[-1]], np.int64), logits_out="none")[1].token)
    return _run(tokens, records)


class GenaiPeer:
    """onnxruntime-genai on the same model directory and prompt; times each generate_next_token."""

    def __init__(self, model: Model):
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(model.info.path))
        config.clear_providers()  # CPU EP
        # like for like: its weights in huge pages too, when kvlab's CPU device puts its own there
        with memory.collapsing(open_device("cpu").huge_pages) as self.huge_pages:
            self.model = og.Model(config)
        self.version = og.__version__ if hasattr(og, "__version__") else "?"

    def run(self, ids: np.ndarray, new: int) -> Run:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(ids) + new, min_length=len(ids) + new)
        gen = og.Generator(self.model, params)
        gen.append_tokens([ids.tolist()])  # the prefill runs here
        tokens, times = [], []
        while len(tokens) < new:
            start = time.perf_counter()
            gen.generate_next_token()
            times.append((time.perf_counter() - start) * 1e3)
            tokens.append(int(gen.get_next_tokens()[0]))
        # the first token comes from the prefill's logits (genai samples it in the first call): decode steps are
        # the calls after it, each of which runs one decode forward pass
        return Run(tokens, float(np.median(times[1:])), float("nan"), float("nan"), float("nan"), float("nan"))


def memory_bandwidth(size_mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """STREAM-like measurements on this machine (GB/s), each the best of ``repeats``: copy (read + write bytes
    counted) and read (a dot product of an array with itself), on 1 and 2 threads. numpy puts arrays this large in
    transparent huge pages. ``best`` is the most the memory system was seen to deliver: the roofline uses it."""
    n = size_mib * 2**20 // 4
    a, b = np.ones(n, np.float32), np.empty(n, np.float32)
    halves = (slice(0, n // 2), slice(n // 2, n))

    def best(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    def on_two_threads(fn: Callable[[slice], Any]) -> None:
        ts = [threading.Thread(target=fn, args=(half,)) for half in halves]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    out = {"copy_1t": 2 * a.nbytes / best(lambda: np.copyto(b, a)) / 1e9,
           "copy_2t": 2 * a.nbytes / best(lambda: on_two_threads(lambda h: np.copyto(b[h], a[h]))) / 1e9,
           "read_1t": a.nbytes / best(lambda: np.dot(a, a)) / 1e9,
           "read_2t": a.nbytes / best(lambda: on_two_threads(lambda h: np.dot(a[h], a[h]))) / 1e9}
    out["best"] = max(out.values())
    return out


def cpu_times() -> tuple[int, int]:
    """(steal, total) CPU time of the whole machine since boot, in clock ticks (/proc/stat; (0, 0) elsewhere):
    steal is time the hypervisor gave this VM's vCPUs to someone else."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def roofline_ms(bytes_read: float, gbps: float) -> float:
    """The shortest a step reading ``bytes_read`` can take at ``gbps`` of memory bandwidth (ms)."""
    return bytes_read / (gbps * 1e9) * 1e3


def weight_bytes_per_token(model: Model) -> int:
    """Bytes of weights one decode step reads: every initializer, except tables a step reads one row of
    (embeddings only gathered from; GroupQueryAttention's rotary cos/sin caches, inputs 7 and 8)."""
    import onnx

    m = onnx.load(str(model.onnx_path), load_external_data=False)
    uses: dict[str, set[tuple[str, int]]] = {}  # initializer -> (op type, input index) of each use
    for node in m.graph.node:
        for i, name in enumerate(node.input):
            uses.setdefault(name, set()).add((node.op_type, i))
    one_row = {("Gather", 0), ("GroupQueryAttention", 7), ("GroupQueryAttention", 8)}
    total = 0
    for init in m.graph.initializer:
        size = int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        if len(init.dims) == 2 and uses.get(init.name) and uses[init.name] <= one_row:
            size //= int(init.dims[0])  # one row per token
        total += size
    return total


def prompt_ids(model: Model, length: int) -> np.ndarray:
    """Exactly ``length`` tokens of real English text (data/prompts/long.txt, repeated)."""
    text = (Path(__file__).resolve().parents[1] / "data" / "prompts" / "long.txt").read_text()
    ids = model.encode(text)
    reps = -(-length // len(ids))
    return np.tile(ids, reps)[:length].astype(np.int64)


def op_profile(model: Model | str, device: str = "cpu", context: int = 256, new_tokens: int = 16,
               **device_options: Any) -> list[dict[str, Any]]:
    """Where a static-cache decode step's time goes, by ONNX operator type, from ONNX Runtime's own profiler.

    Opens a profiled device of its own (the process's open device of that name is closed first: its caches must
    be disposed), prefills ``context`` tokens, decodes ``new_tokens`` and averages the decode runs after the
    first. Rows: each op type's kernel time per step, "(between nodes)" (the run's time outside every node:
    scheduling, thread hand-offs) and "(run)" (the whole run). Profiling itself adds a little to each node. On
    WebGPU a node's time is its CPU-side submission, not GPU execution."""
    import tempfile

    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 3:
        raise ConfigError(f"new_tokens={new_tokens!r} leaves no decode run to profile (the prefill and the first "
                          "decode run are skipped); use an int >= 3")
    model = load(model) if isinstance(model, str) else model
    close_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        dev = open_device(device, profile=os.path.join(tmp, "ort"), **device_options)
        try:
            with StaticCache(context + new_tokens) as cache:
                generate(model, prompt_ids(model, context), cache=cache, device=dev, max_new_tokens=new_tokens,
                         stop_on_eos=False)
        finally:
            close_device(device)
        events = json.loads(Path(dev.profiles[str(Path(model.onnx_path).resolve())]).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][2:]  # skip the prefill and the first decode
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(a <= e["ts"] <= b for a, b in spans):
            per_op.setdefault(e["args"]["op_name"], []).append(e["dur"])
    n, run_us = len(runs), sum(r["dur"] for r in runs) / len(runs)
    rows = [{"op": op, "ms_per_step": sum(d) / n / 1e3, "nodes_per_step": len(d) / n} for op, d in per_op.items()]
    rows.sort(key=lambda r: -r["ms_per_step"])
    inside = sum(r["ms_per_step"] for r in rows)
    rows += [{"op": "(between nodes)", "ms_per_step": run_us / 1e3 - inside, "nodes_per_step": 0.0},
             {"op": "(run)", "ms_per_step": run_us / 1e3, "nodes_per_step": sum(r["nodes_per_step"] for r in rows)}]
    for r in rows:
        r["share"] = r["ms_per_step"] / (run_us / 1e3)
    return rows


def _variants(plan: Plan, model: Model, device: str, ids: np.ndarray, new: int, genai: GenaiPeer | None,
              small: Device | None, floor: Path | None) -> tuple[dict[str, Callable[[], Run]], list[Prefilled]]:
    """name -> a function doing one run. With the handoff, each cache kind's CPU prefill is made once here
    (returned too, for disposal)."""
    fit = len(ids) + new - 1
    lens = {s for s in plan.static_lens if fit <= s <= model.info.context_length}
    lens = sorted(lens | {fit} if plan.static_fit.get(device, True) or not lens else lens)
    kinds: dict[str, Callable[[], Cache]] = {"dynamic": DynamicCache}
    kinds.update({f"static@{n}": (lambda n=n: StaticCache(n)) for n in lens})
    out: dict[str, Callable[[], Run]] = {}
    kept: list[Prefilled] = []
    floor_run = (lambda: run_matmuls_only(floor, device, new)) if floor is not None else None
    for name, make in kinds.items():
        if device == "webgpu" and plan.webgpu_prefill_on_cpu:
            kept.append(prefill_on_cpu(model, ids, make()))
            out[name] = lambda make=make, pre=kept[-1]: run_handoff(model, pre, make, device, new)
        else:
            out[name] = lambda make=make: run_kvlab(model, ids, make, device, new)
        if floor_run and name == f"static@{fit}":  # right after the fitted static cache: pairs close in time
            out[MATMULS_ONLY] = floor_run
    if small is not None:  # after the open device's session exists, so its collapse cannot reach this one's memory
        out[f"static@{fit}{SMALL_PAGES}"] = lambda: run_kvlab(model, ids, lambda: StaticCache(fit), small, new)
    if genai is not None and device == "cpu":
        out["genai"] = lambda: genai.run(ids, new)
    if floor_run:
        out.setdefault(MATMULS_ONLY, floor_run)  # last, when no static cache is sized to fit
    return out, kept


@dataclass
class Rounds:
    """Every variant run ``reps`` times, interleaved round by round, with the machine measured around them."""

    runs: dict[str, list[Run]]
    bandwidth: list[float]  # GB/s per round: the higher of the measurements just before and just after it
    measured: list[float]  # every measurement: before each round, and after the last
    steal_fraction: float  # the hypervisor's share of this VM's CPU time meanwhile (nan where unknown)


def _rounds(variants: dict[str, Callable[[], Run]], reps: int) -> Rounds:
    for fn in variants.values():  # warm-up: shader compilation, allocator pools, page faults
        fn()
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    measured: list[float] = []
    steal_start = cpu_times()
    for _ in range(reps):
        measured.append(memory_bandwidth(repeats=3)["best"])
        for name, fn in variants.items():
            runs[name].append(fn())
    measured.append(memory_bandwidth(repeats=3)["best"])
    steal, total = (b - a for a, b in zip(steal_start, cpu_times()))
    return Rounds(runs, [max(pair) for pair in zip(measured, measured[1:])], measured,
                  steal / total if total else float("nan"))


def _summarize(runs: dict[str, list[Run]], baseline: str) -> dict[str, dict[str, Any]]:
    ref = runs[baseline]
    out = {}
    for name, rs in runs.items():
        ms = [r.decode_ms for r in rs]
        ratios = [r.decode_ms / b.decode_ms for r, b in zip(rs, ref)]
        out[name] = {"decode_ms": float(np.median(ms)), "decode_ms_min": min(ms), "decode_ms_max": max(ms),
                     "decode_ms_runs": ms,  # per round, in order: pairs any two variants
                     f"ratio_to_{baseline}": float(np.median(ratios)), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "overhead_ms": _nanmedian([r.overhead_ms for r in rs]),
                     "tensors_per_step": rs[0].tensors_per_step, "new_buffers_per_step": rs[-1].new_buffers_per_step,
                     "bytes_per_step": rs[0].bytes_per_step,
                     "tokens_equal": None if rs[0].token_ids is None else all(r.token_ids == ref[0].token_ids
                                                                               for r in rs)}
    return out


def _nanmedian(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return float(np.median(finite)) if finite else float("nan")


def run_plan(plan: Plan, log: Callable[[str], None] = print) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvlab-bench-") as tmp:
        return _run_plan(plan, log, Path(tmp))


def _run_plan(plan: Plan, log: Callable[[str], None], tmp: Path) -> dict[str, Any]:
    from tqdm.auto import tqdm

    for mode in plan.buffer_cache_modes:
        if mode not in BUFFER_CACHE_MODES:
            raise ConfigError(f"buffer cache mode {mode!r} is not valid; choose one of {BUFFER_CACHE_MODES}")
    bandwidth: dict[str, Any] = {**memory_bandwidth(), "paired": []}
    log("memory bandwidth (GB/s): " + ", ".join(f"{k} {v:.1f}" for k, v in bandwidth.items() if k != "paired"))
    rows: list[dict[str, Any]] = []
    genai_huge = 0  # bytes of the peer's memory collapsed into huge pages
    for model_name, device in plan.targets:
        model = load(model_name)
        genai = GenaiPeer(model) if plan.genai and device == "cpu" else None
        genai_huge += genai.huge_pages["bytes"] if genai else 0
        weights = weight_bytes_per_token(model)
        for mode in (plan.buffer_cache_modes if device == "webgpu" else [None]):
            if device == "webgpu":
                close_device("webgpu")  # a new context for each mode (ORT keeps one per process)
                dev = open_device("webgpu", buffer_cache_mode=mode)
            else:
                dev = open_device("cpu")
            small = None
            if device == "cpu" and plan.small_pages_twin and dev.huge_pages:
                dev.session(model.onnx_path)  # first: its collapse must not reach the twin's memory
                small = small_pages_device()
            floor, floor_bytes = (matmuls_only_model(model, tmp / model_name) if device == "cpu" and plan.matmuls_only
                                  else (None, 0))
            new = plan.new_tokens[device]
            for context in tqdm(plan.contexts[device], desc=f"{model_name} on {device}", leave=False):
                if context + new > model.info.context_length:
                    raise ConfigError(f"context {context} + {new} new tokens exceed {model_name}'s context length "
                                      f"{model.info.context_length}")
                ids = prompt_ids(model, context)
                variants, kept = _variants(plan, model, device, ids, new, genai, small, floor)
                try:
                    rounds = _rounds(variants, plan.reps)
                finally:
                    for pre in kept:
                        pre.cache.dispose()
                summary = _summarize(rounds.runs, "dynamic")
                valid = all(s["tokens_equal"] is not False for s in summary.values())
                kv_read = (context + new // 2) * model.info.bytes_per_token
                bw = float(np.median(rounds.bandwidth))
                for name, s in summary.items():
                    w, kv = (floor_bytes, 0) if name == MATMULS_ONLY else (weights, kv_read)
                    paired = [roofline_ms(w + kv, b) / r.decode_ms for b, r in zip(rounds.bandwidth, rounds.runs[name])]
                    row = {"model": model_name, "device": device, "adapter": dev.adapter.label,
                           "buffer_cache_mode": mode or "", "dtype": model.info.dtype_name, "context": context,
                           "kv_tensor_mib": context * model.info.bytes_per_token / (2 * model.info.num_layers) / 2**20,
                           "new_tokens": new, "variant": name, "reps": plan.reps, "valid": valid,
                           "weight_bytes": w, "kv_read_bytes": kv, "bandwidth_gbps": bw,
                           "roofline_ms": roofline_ms(w + kv, bw),
                           "roofline_fraction": float(np.median(paired)),
                           "roofline_fraction_min": min(paired), "roofline_fraction_max": max(paired),
                           "overhead_fraction": s["overhead_ms"] / s["decode_ms"],
                           "cpu_steal_fraction": rounds.steal_fraction, **s}
                    rows.append(row)
                bandwidth["paired"].extend(rounds.measured)
                log(_row_line(model_name, device, mode, context, summary, valid))
            if small is not None:
                small.close()
            if floor is not None:
                dev.forget(floor)  # its weights (a model's worth) go with the run
    bandwidth["best"] = max([bandwidth["best"], *bandwidth["paired"]])
    for row in rows:  # the strictest reading: every row against the highest bandwidth seen anywhere in the run
        row["roofline_fraction_at_run_best"] = roofline_ms(row["weight_bytes"] + row["kv_read_bytes"],
                                                           bandwidth["best"]) / row["decode_ms"]
    return {"environment": environment(bandwidth, genai_huge), "plan": asdict(plan), "rows": rows}


def _row_line(model: str, device: str, mode: str | None, context: int, summary: dict, valid: bool) -> str:
    parts = [f"{name} {s['decode_ms']:.1f} ms (x{s['ratio_to_dynamic']:.2f})" for name, s in summary.items()]
    return f"{model}/{device}{'/' + mode if mode else ''} ctx {context}: " + ", ".join(parts) + \
        ("" if valid else "  INVALID: tokens differ")


def environment(bandwidth: dict[str, Any], genai_huge_bytes: int = 0) -> dict[str, Any]:
    env = describe()
    cpu = opened("cpu")
    huge = {**memory.state(), "cpu_session_bytes": cpu.huge_page_bytes if cpu else 0, "genai_bytes": genai_huge_bytes}
    env.update({"bandwidth_gbps": bandwidth, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "huge_pages": huge,
                "cpu_count": os.cpu_count(), "machine": platform.machine(),
                "cpu_ep_options": open_device("cpu").ep_options or "defaults (ORT: one thread per physical core, "
                                                                    "spinning on; kvlab: huge pages on)"})
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except OSError:
        env["commit"] = "unknown"
    try:
        import onnxruntime_genai as og

        env["onnxruntime_genai"] = getattr(og, "__version__", "installed")
    except ImportError:
        env["onnxruntime_genai"] = "missing"
    return env


def write(result: dict[str, Any], out: Path, charts: bool = True) -> list[Path]:
    """results.json, results.csv and (unless disabled) one chart per (model, device) as HTML and PNG."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "results.csv"]
    files[0].write_text(json.dumps(result, indent=1, default=float))
    with files[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(result["rows"][0]))
        w.writeheader()
        w.writerows({k: " ".join(f"{x:.3f}" for x in v) if isinstance(v, list) else v for k, v in r.items()}
                    for r in result["rows"])
    if charts:
        for (model, device) in {(r["model"], r["device"]) for r in result["rows"]}:
            fig = figure(result, model, device)
            stem = out / f"{model}-{device}"
            fig.write_html(stem.with_suffix(".html"), include_plotlyjs="cdn")
            files.append(stem.with_suffix(".html"))
            try:
                fig.write_image(stem.with_suffix(".png"), width=1100, height=600)
                files.append(stem.with_suffix(".png"))
            except Exception as exc:  # noqa: BLE001 - kaleido needs a Chromium; the HTML is still there
                print(f"kvlab bench: no PNG for {stem.name} ({exc})")
    return files


def report(result: dict[str, Any]) -> str:
    """The targets of the benchmark issue, computed from the rows (ratios come from paired runs)."""
    rows = result["rows"]
    lines = []
    by = lambda **kw: [r for r in rows if all(r[k] == v for k, v in kw.items())]  # noqa: E731
    for model in sorted({r["model"] for r in rows if r["device"] == "cpu"}):
        cpu = by(model=model, device="cpu")
        for ctx in sorted({r["context"] for r in cpu}):
            row = {r["variant"]: r for r in cpu if r["context"] == ctx}
            static = min((r for n, r in row.items() if n.startswith("static") and not n.endswith(SMALL_PAGES)),
                         key=lambda r: r["decode_ms"])
            line = f"{model} cpu ctx {ctx}: static {static['decode_ms']:.1f} ms ({static['variant']})"
            if "genai" in row:
                g = row["genai"]
                line += (f"; genai {g['decode_ms']:.1f} ms -> static/genai {static['decode_ms'] / g['decode_ms']:.2f} "
                         f"(target <= 0.9; tokens equal: {g['tokens_equal'] and static['tokens_equal']})")
            d = row["dynamic"]
            line += f"; dynamic/static {d['decode_ms'] / static['decode_ms']:.1f}x"
            line += (f"; roofline {static['roofline_fraction']:.0%} (paired; "
                     f"{static['roofline_fraction_at_run_best']:.0%} at the run's best bandwidth); python overhead "
                     f"{static['overhead_fraction']:.1%}; cpu steal {static['cpu_steal_fraction']:.1%}")
            fit = row.get(f"static@{ctx + static['new_tokens'] - 1}")
            if MATMULS_ONLY in row and fit:  # how far the matrix products alone get; what the rest of a step adds
                f = row[MATMULS_ONLY]
                rest = [a - b for a, b in zip(fit["decode_ms_runs"], f["decode_ms_runs"])]
                line += (f"; matmuls alone {f['decode_ms']:.1f} ms = {f['roofline_fraction']:.0%} of their roofline "
                         f"(paired), the rest of {fit['variant']}'s step {np.median(rest):.1f} ms "
                         f"(per round {min(rest):.1f} to {max(rest):.1f})")
            twin = [r for n, r in row.items() if n.endswith(SMALL_PAGES)]
            if twin:
                huge = row[twin[0]["variant"].removesuffix(SMALL_PAGES)]
                ratios = [a / b for a, b in zip(huge["decode_ms_runs"], twin[0]["decode_ms_runs"])]
                line += (f"; huge pages x{np.median(ratios):.2f} vs 4 KiB ({huge['variant']}, paired, faster in "
                         f"{sum(x < 1 for x in ratios)}/{len(ratios)})")
            lines.append(line)
    heavy = by(model="kv-heavy", device="webgpu")
    if heavy:
        for mode in sorted({r["buffer_cache_mode"] for r in heavy}):
            for ctx in sorted({r["context"] for r in heavy}):
                row = {r["variant"]: r for r in heavy if r["context"] == ctx and r["buffer_cache_mode"] == mode}
                d = row["dynamic"]
                statics = [r for n, r in row.items() if n.startswith("static")]
                worst = max(statics, key=lambda r: r["ratio_to_dynamic"])
                lines.append(f"kv-heavy webgpu/{mode} ctx {ctx}: dynamic {d['decode_ms']:.0f} ms, "
                             + ", ".join(f"{r['variant']} {r['decode_ms']:.0f} ms" for r in statics)
                             + f"; dynamic/static {1 / worst['ratio_to_dynamic']:.2f}x (worst static; target >= 1)"
                             + f"; static new buffers/step {max(r['new_buffers_per_step'] for r in statics):g}")
    return "\n".join(lines)


def figure(result: dict[str, Any], model: str, device: str):
    """Decode ms per step vs context for each variant (median, min-max bars), with the bucket boundaries the
    per-tensor KV size crosses on WebGPU; labelled with backend, adapter, model, dtype and machine."""
    import plotly.graph_objects as go

    from .plots import recorded_variant

    rows = [r for r in result["rows"] if r["model"] == model and r["device"] == device]
    env = result["environment"]
    fig = go.Figure()

    def series(r: dict[str, Any]) -> str:  # a static cache sized to each run is one series across contexts
        name = recorded_variant(r)
        return "static@fit (context + new tokens)" if name == "static@fit" else name

    contexts = sorted({r["context"] for r in rows})
    for (variant, mode) in sorted({(series(r), r["buffer_cache_mode"]) for r in rows}):
        rs = sorted((r for r in rows if series(r) == variant and r["buffer_cache_mode"] == mode),
                    key=lambda r: r["context"])
        bars = {"type": "data", "symmetric": False, "array": [r["decode_ms_max"] - r["decode_ms"] for r in rs],
                "arrayminus": [r["decode_ms"] - r["decode_ms_min"] for r in rs]}
        name = variant + (f" ({mode})" if mode else "")
        if len(contexts) == 1:  # one context: a bar per variant reads better than points stacked on one x
            fig.add_bar(x=[name], y=[r["decode_ms"] for r in rs], name=name, error_y=bars)
        else:
            fig.add_scatter(x=[r["context"] for r in rs], y=[r["decode_ms"] for r in rs], mode="lines+markers",
                            name=name, error_y=bars)
    if device == "webgpu" and rows:
        per_token_mib = rows[0]["kv_tensor_mib"] / rows[0]["context"]
        for mib in BUCKETS_MIB:
            ctx = mib / per_token_mib
            if ctx <= max(r["context"] for r in rows) * 1.05:
                fig.add_vline(x=ctx, line_dash="dot", line_color="gray",
                              annotation_text=f"KV tensor {mib} MiB", annotation_position="top left")
    r0 = rows[0]
    fig.update_layout(
        title=(f"{model} ({r0['dtype']}) decode step vs context: {device} on {r0['adapter']}<br>"
               f"<sup>{env['backend']} {env['versions'].get('onnxruntime-webgpu', '')}, {r0['new_tokens']} new tokens, "
               f"median of {r0['reps']} paired runs (bars: min-max); {env['cpu']}; {env['date']}</sup>"),
        xaxis_title="context (tokens already in the cache)", yaxis_title="ms per decode step",
        template="plotly_white", legend_title="cache")
    if len(contexts) == 1:
        fig.update_layout(xaxis_title=f"cache, at a context of {contexts[0]} tokens", showlegend=False)
    else:
        fig.update_xaxes(tickvals=contexts)  # ticks where measured
    return fig
