"""``kvlab bench``, ``kvlab trace``, ``kvlab conformance`` and ``kvlab profile ops|phases`` (where a static-cache
decode step's time goes, by ONNX operator or by phase of kvlab's step beside onnxruntime-genai's): each turns its
flags into a call of ``kvlab.bench`` (or of ``kvlab.ort.checks``), prints what it measured and returns the exit
status."""

from __future__ import annotations

import argparse
import importlib.util
import json
from typing import Any

from .. import bench
from ..bench.results import write_csv
from ..core.cache import check_every_text
from ..core.devices import DEVICES
from ..core.errors import ConfigError
from ..core.paths import write_atomic
from ..ort import load, open_device
from ..ort.checks.conformance import check
from ..presets import check_precision
from . import flags
from .generate import table

# --set KEY=VALUE: the fields of kvlab.bench.Plan beyond the flags, and how each value is read
on_off = flags.ON_OFF.__getitem__
PLAN = {
    "precisions": lambda text: [check_precision(p) for p in text.split(",")],  # crossed with untagged models
    "genai": lambda text: {d: d in ([] if text == "none" else flags.devices_of(text, "genai")) for d in DEVICES},
    "static_lens": flags.positive_ints,  # static cache sizes beside the one that fits
    "check_every": flags.positive_ints,  # static caches that read back every present's buffer every k steps
    "token_on_device": lambda text: dict.fromkeys(DEVICES, on_off(text)),  # the token-on-device twins
    "graph_capture": on_off,  # WebGPU: the captured static caches (and genai captured)
    "prefill_on": lambda text: {"cpu": None, "webgpu": {"cpu": "cpu", "webgpu": None}[text]},  # WebGPU rows'
    "kv_precisions": lambda text: text.split(","),  # packed KV twins (the WebGPU plugin EP)
    "small_pages_twin": on_off,  # CPU: the fitted static cache again from weights in 4 KiB pages
    "matmuls_only": on_off,  # CPU: the model's matrix products alone
    "gpu_memory": on_off,  # WebGPU where NVML reports: an untimed run reading it at every step
    "charts": on_off,  # not a Plan field: whether kvlab bench draws its charts (default on)
}


def add(sub: argparse._SubParsersAction) -> None:
    """The ``bench``, ``trace`` and ``conformance`` subcommands."""
    b = sub.add_parser("bench", help="paired decode benchmarks: caches, onnxruntime-genai, memory roofline")
    b.add_argument("--quick", action="store_true", help="a small smoke run (toy model, CPU and WebGPU)")
    flags.model(b, default=None, several=True)
    flags.device(b, several=True)
    flags.device_options(b)
    b.add_argument("--contexts", type=flags.positive_ints, help="comma-separated prompt lengths (every device)")
    flags.counts(b, new_tokens=(None, "new tokens per run (every device)"), reps=(None, "paired rounds"))
    flags.settings(b, "kvlab.bench.Plan (genai: the devices with the genai row, or none; charts=off: none drawn)", PLAN)
    flags.out(b, "artifacts/bench", "output folder (default artifacts/bench)", folder=True)
    b.set_defaults(run=bench_command)

    tr = sub.add_parser("trace", help="one long generation per cache, every step recorded, with the GPU memory held")
    flags.model(tr)
    flags.device(tr, default="webgpu")
    flags.counts(tr, context=(1024, "prompt tokens before the traced steps"), steps=(1000, "decode steps per cache"))
    flags.out(tr, "artifacts/trace.json", "the JSON file (default artifacts/trace.json)")
    tr.set_defaults(run=trace_command)

    co = sub.add_parser("conformance", help="a device's prefill and decode logits against the CPU EP, per model")
    flags.model(co, several=True)
    flags.device(co, default="webgpu")
    flags.counts(co, context=(48, "prompt tokens of real text"))
    flags.out(co, None, "also write the rows as JSON")
    co.set_defaults(run=conformance_command)


def plan_of(args: argparse.Namespace, settings: dict[str, Any]) -> bench.Plan:
    """The ``kvlab.bench.Plan`` the flags and ``settings`` (``--set``'s Plan fields, read) ask for; ConfigError for a
    bad value."""
    plan = bench.Plan.quick() if args.quick else bench.Plan()
    if args.models or args.devices:
        models = (args.models or ",".join(sorted({m for m, _ in plan.targets}))).split(",")
        plan.targets = [(m, d) for m in models for d in flags.devices_of(args.devices or "cpu", "--devices")]
    if args.contexts:
        plan.contexts = dict.fromkeys(DEVICES, args.contexts)
    if args.new_tokens is not None:
        plan.new_tokens = dict.fromkeys(DEVICES, args.new_tokens)
    if args.reps is not None:
        plan.reps = args.reps
    for key, value in settings.items():
        setattr(plan, key, value)
    options = flags.device_options_of(args)
    if "validation_mode" in options:
        raise ConfigError("--device-option validation_mode: kvlab bench opens WebGPU in its default validation mode")
    if "buffer_cache_mode" in options:  # one pass over the WebGPU targets per mode
        plan.buffer_cache_modes = options.pop("buffer_cache_mode").split(",")
    if options:
        open_device("cpu", **options)
    return plan


def bench_command(args: argparse.Namespace) -> int:
    """``kvlab bench``: run the plan, print its report and write its files. Ctrl-C: the contexts that finished are
    written first (``"complete": false``), then the interrupt goes on."""
    settings = flags.key_values(args.set, "--set", PLAN)
    charts = settings.pop("charts", True)  # the command's own switch, not a Plan field
    plan = plan_of(args, settings)
    try:
        result = bench.run_plan(plan)
    except bench.Interrupted as stop:  # keep what was measured, then stop as Ctrl-C does
        if stop.result["rows"]:
            print("\n" + bench.report(stop.result))
            files = bench.write(stop.result, args.out, charts=False)
            print(
                f"\nstopped early: wrote the contexts that finished ({len(stop.result['rows'])} rows, "
                f'"complete": false) to ' + ", ".join(str(f) for f in files)
            )
        raise
    files = bench.write(result, args.out, charts=charts)
    print("\n" + bench.report(result))
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def trace_command(args: argparse.Namespace) -> int:
    """``kvlab trace``: ``kvlab.bench.trace``'s runs, a line each, written as JSON."""
    from ..bench.trace import trace, write_json

    name, precision = flags.one_model(args.model, "kvlab trace")
    result = trace(load(name, precision=precision), args.device, args.context, args.steps)
    for r in result["runs"].values():
        memory = r["gpu_memory"]["bytes"]
        growth = f"{(memory[-1] - memory[0]) / 2**20:+.0f} MiB of GPU memory" if memory else "GPU memory: no NVML"
        print(
            f"{r['cache']}: decode {r['decode_ms']:.2f} ms (first 100 {r['decode_ms_first_100']:.2f}, last 100 "
            f"{r['decode_ms_last_100']:.2f}), {r['tensors_allocated_per_step']:g} tensors/step, "
            f"{r['new_buffers_in_decode']} new buffers in decode, {growth}"
        )
    print(f"tokens equal: {result['tokens_equal']}; wrote {write_json(result, args.out)}")
    return 0


def conformance_rows(models: list[Any], device: str, context: int) -> list[dict[str, Any]]:
    """Per model and mode (prefill, decode): ``device``'s logits against the CPU EP's on ``context`` tokens of real
    text (``kvlab.ort.checks.conformance.check``): the largest difference, its tolerance, the first position past
    it, and how many positions' argmax differ."""
    rows = []
    for model in models:
        ids = bench.prompt_ids(model, context)
        for mode in ("prefill", "decode"):
            r = check(model, ids, device=device, reference="cpu", mode=mode)
            rows.append(
                {
                    "model": model.name,
                    "precision": model.info.precision,
                    "mode": mode,
                    "device": str(r.device),
                    "atol": r.atol,
                    "max_abs_diff": float(r.max_abs_diff.max()),
                    "first_divergence": r.first_divergence,
                    "argmax_differs": int((~r.argmax_equal).sum()),
                    "positions": int(r.argmax_equal.size),
                }
            )
    return rows


def conformance_command(args: argparse.Namespace) -> int:
    """``kvlab conformance``: ``conformance_rows`` for every model, a line each (and JSON with ``--out``)."""
    from ..bench.trace import write_json

    models = [load(name, precision=precision) for name, precision in flags.model_names(args.models)]
    rows = conformance_rows(models, args.device, args.context)
    for r in rows:
        where = "all agree" if r["first_divergence"] is None else f"first divergence at {r['first_divergence']}"
        print(
            f"{r['model']:24s} {r['mode']:8s} max |diff| {r['max_abs_diff']:.3g} (atol {r['atol']:g}): {where}, "
            f"argmax differs at {r['argmax_differs']}/{r['positions']}  [{r['device']}]"
        )
    if args.out:
        write_json(rows, args.out)
    return 0


def add_profile(sub: argparse._SubParsersAction) -> None:
    """The ``profile`` subcommand and its modes, ``ops`` and ``phases``."""
    p = sub.add_parser("profile", help="where a decode step's time goes: by ONNX operator, by phase beside genai")
    modes = p.add_subparsers(dest="mode", required=True, metavar="MODE")
    ops = modes.add_parser("ops", help="by ONNX operator type (ONNX Runtime's own profiler)")
    _common(ops, "also write the rows as CSV")
    ops.set_defaults(run=ops_command)
    phases = modes.add_parser(
        "phases", help="kvlab's step phase by phase (binding, run, read-back, commit, loop), beside onnxruntime-genai's"
    )
    _common(phases, "also write the result as JSON")
    flags.counts(phases, rounds=(3, "rounds of kvlab and genai"))
    flags.token_on_device(phases)
    phases.set_defaults(run=phases_command)


def _common(p: argparse.ArgumentParser, out: str) -> None:
    """The flags every mode takes: the model, the device, the prompt and decode lengths, the output file."""
    flags.model(p)
    flags.device(p)
    flags.counts(
        p,
        context=(256, "prompt tokens before the profiled decode steps"),
        new_tokens=(16, "tokens decoded (the first decode step is left out)"),
    )
    flags.out(p, None, out)


def ops_command(args: argparse.Namespace) -> int:
    """``kvlab profile ops``: ``kvlab.bench.op_profile``'s rows as a table (and CSV with ``--out``)."""
    name, precision = flags.one_model(args.model, "a profile")
    rows = bench.op_profile(load(name, precision=precision), args.device, args.context, args.new_tokens)
    cells = [[r["op"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_step']:g}", f"{100 * r['share']:.1f}%"] for r in rows]
    print(table([["op", "ms/step", "nodes/step", "share"], *cells]))
    print(
        f"({args.model} on {args.device}, static cache, context {args.context}; ONNX Runtime's profiler, which adds "
        f"a little to every node; mean of {args.new_tokens - 2} decode runs)"
    )
    if args.out:
        write_csv(args.out, rows)
    return 0


def phases_command(args: argparse.Namespace) -> int:
    """``kvlab profile phases``: ``kvlab.bench.step_phases``' rows as a table, beside genai where it is installed."""
    name, precision = flags.one_model(args.model, "a profile")
    genai = importlib.util.find_spec("onnxruntime_genai") is not None
    r = bench.step_phases(
        load(name, precision=precision),
        args.device,
        args.context,
        args.new_tokens,
        args.rounds,
        genai=genai,
        token_on_device=flags.WHERE[args.token_on_device],
    )
    rows = [["phase", "ms/step", "share"]]
    rows += [[row["phase"], f"{row['ms_per_step']:.3f}", f"{100 * row['share']:.1f}%"] for row in r["rows"]]
    print(table(rows + [["token to token", f"{r['kvlab_token_to_token_ms']:.3f}", "100.0%"]]))
    print(
        f"kvlab step {r['kvlab_step_ms']:.3f} ms; Python's own time {r['python_ms']:.3f} ms = "
        f"{100 * r['python_share']:.1f}% of it (the step less the runtime's copies and run)"
    )
    if "genai_step_ms" in r:
        print(
            f"genai {r['genai_version']}: step {r['genai_step_ms']:.3f} ms, token to token "
            f"{r['genai_token_to_token_ms']:.3f} ms; kvlab/genai paired by round: step x{r['step_ratio']:.3f}, "
            f"token to token x{r['token_to_token_ratio']:.3f}; tokens equal: {r['tokens_equal_genai']}"
        )
    else:
        print("genai: onnxruntime-genai is not installed, kvlab's rounds only")
    token = (
        f", the token on the device ({r['greedy_reduction']})" if r["token_on_device"] else ", the token on the host"
    )
    print(
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {args.device}; static cache "
        f"({check_every_text(None)}, {token}), context {args.context}, {args.new_tokens} new tokens x {args.rounds} "
        "rounds; medians of the decode steps after the first)"
    )
    if args.out:
        write_atomic(args.out, json.dumps(r, indent=1))
    return 0
