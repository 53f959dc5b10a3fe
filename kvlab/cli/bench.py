"""``kvlab bench``, ``kvlab profile``, ``kvlab trace`` and ``kvlab conformance``: each turns its arguments into a
call of ``kvlab.bench``, prints what it measured and returns the exit status."""

from __future__ import annotations

import argparse
import csv
import io
import json

from .. import bench
from ..core.cache import check_every_text
from ..core.devices import DEVICES
from ..core.errors import ConfigError
from ..core.paths import write_atomic
from ..ort import load
from ..ort.decode.greedy import AUTO
from ..presets import check_precision
from .args import applies_only_with, cpu_options, ints, open_cpu


def check_devices(text: str, flag: str) -> list[str]:
    devices = text.split(",")
    bad = [d for d in devices if d not in DEVICES]
    if bad:
        raise ConfigError(f"{flag} {bad[0]!r} is not valid; choose from {DEVICES}")
    return devices


def under_load_command(args: argparse.Namespace) -> int:
    """``kvlab bench --under-load N``: kvlab.bench.load's rows for one model on the CPU EP, written to --out."""
    from ..bench import load as competing_load

    competing_load.check_load(args.under_load, "--under-load")
    models = (args.models or "smollm2").split(",")
    if len(models) != 1 or check_devices(args.devices or "cpu", "--devices") != ["cpu"]:
        raise ConfigError(
            f"--under-load runs one model on the CPU EP; got --models {args.models!r} --devices {args.devices!r}"
        )
    load(models[0])  # a bad name is refused here (ModelError), not inside a child process
    contexts = ints(args.contexts or "1024", "--contexts")
    new = ints(str(args.new_tokens or 16), "--new-tokens")[0]
    rounds = ints(str(args.reps or 3), "--reps")[0]
    settings = (args.load_settings or "default,ort").split(",")
    rows = competing_load.run(models[0], contexts, new, rounds, args.under_load, settings)
    print(f"\nwrote {competing_load.write(rows, args.out)}")
    return 0


def bench_command(args: argparse.Namespace) -> int:
    loaded = args.under_load is not None
    applies_only_with({"--load-settings": args.load_settings is not None}, "--under-load N", loaded)
    if loaded:
        return under_load_command(args)
    plan = bench.Plan.quick() if args.quick else bench.Plan()
    if args.models or args.devices:
        models = (args.models or ",".join(sorted({m for m, _ in plan.targets}))).split(",")
        devices = check_devices(args.devices or "cpu", "--devices")
        plan.targets = [(m, d) for m in models for d in devices]
    if args.precisions:
        plan.precisions = [check_precision(p) for p in args.precisions.split(",")]
    if args.contexts:
        plan.contexts = {d: ints(args.contexts, "--contexts") for d in DEVICES}
    if args.new_tokens is not None:
        plan.new_tokens = {d: ints(str(args.new_tokens), "--new-tokens")[0] for d in DEVICES}
    if args.max_cache_lens:
        plan.static_lens = ints(args.max_cache_lens, "--max-cache-lens")
    if args.check_every:
        plan.check_every = ints(args.check_every, "--check-every")
    if args.reps is not None:
        plan.reps = ints(str(args.reps), "--reps")[0]
    if args.buffer_cache_modes:
        plan.buffer_cache_modes = args.buffer_cache_modes.split(",")
    if args.genai_on:
        plan.genai = {d: d in check_devices(args.genai_on, "--genai-on") for d in DEVICES}
    if args.no_genai:
        plan.genai = {d: False for d in DEVICES}
    if args.graph_capture:
        plan.graph_capture = True
    if args.token_on_device is not None:
        plan.token_on_device = dict.fromkeys(DEVICES, args.token_on_device)
    if args.prefill_on:
        plan.prefill_on = {"cpu": None, "webgpu": None if args.prefill_on == "webgpu" else "cpu"}
    if args.kv_precision:
        plan.kv_precisions = args.kv_precision.split(",")
    open_cpu(args)
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
    files = bench.write(result, args.out, charts=not args.no_charts)
    print("\n" + bench.report(result))
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def profile_command(args: argparse.Namespace) -> int:
    context = ints(str(args.context), "--context")[0]
    new_tokens = ints(str(args.new_tokens), "--new-tokens")[0]
    if args.phases and args.lockstep:
        raise ConfigError("--phases and --lockstep are two different profiles: give one of them")
    applies_only_with({"--no-genai": args.no_genai}, "--phases", args.phases)
    only_lockstep = {
        "--graph-capture": args.graph_capture,
        "--block": args.block is not None,
        "--tokens-per-read": args.tokens_per_read is not None,
        "--sides": bool(args.sides),
        "--under-load": args.under_load is not None,
        "--buffer-cache-mode": args.buffer_cache_mode is not None,
        "--validation-mode": args.validation_mode is not None,
    }
    applies_only_with(only_lockstep, "--lockstep", args.lockstep)
    shared = {"--rounds": args.rounds is not None, "--json": args.json is not None}
    shared["--check-every"] = args.check_every is not None
    shared |= {"--token-on-device": args.token_on_device is not None, "--greedy-reduction": bool(args.greedy_reduction)}
    applies_only_with(shared, "--phases or --lockstep", args.phases or args.lockstep)
    if args.phases:
        return phases_command(args, context, new_tokens)
    if args.lockstep:
        return lockstep_command(args, context, new_tokens)
    rows = bench.op_profile(
        load(args.model, precision=args.precision), args.device, context, new_tokens, **cpu_options(args)
    )
    lines = [["op", "ms/step", "nodes/step", "share"]] + [
        [r["op"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_step']:g}", f"{100 * r['share']:.1f}%"] for r in rows
    ]
    widths = [max(len(row[i]) for row in lines) for i in range(4)]
    print(
        "\n".join(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in lines
        )
    )
    print(
        f"({args.model} on {args.device}, static cache, context {context}; ONNX Runtime's profiler, which adds "
        f"a little to every node; mean of {new_tokens - 2} decode runs)"
    )
    if args.csv:
        table = io.StringIO(newline="")
        w = csv.DictWriter(table, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        write_atomic(args.csv, table.getvalue())
    return 0


def trace_command(args: argparse.Namespace) -> int:
    from ..bench.trace import trace, write_json

    open_cpu(args)
    model = load(args.model, precision=args.precision)
    result = trace(
        model,
        args.device,
        ints(str(args.context), "--context")[0],
        ints(str(args.steps), "--steps")[0],
        prefill_device=args.prefill_on,
    )
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


def conformance_command(args: argparse.Namespace) -> int:
    from ..bench.trace import conformance, write_json

    precisions = [check_precision(p) for p in (args.precisions or "fp32").split(",")]
    models = [load(m, precision=p) for m in args.models.split(",") for p in precisions]
    rows = conformance(models, args.device, ints(str(args.prompt_tokens), "--prompt-tokens")[0])
    for r in rows:
        where = "all agree" if r["first_divergence"] is None else f"first divergence at {r['first_divergence']}"
        print(
            f"{r['model']:24s} {r['mode']:8s} max |diff| {r['max_abs_diff']:.3g} (atol {r['atol']:g}): {where}, "
            f"argmax differs at {r['argmax_differs']}/{r['positions']}  [{r['device']}]"
        )
    if args.out:
        write_json(rows, args.out)
    return 0


def phases_token(args: argparse.Namespace) -> bool | str:
    """``--token-on-device`` / ``--greedy-reduction`` as ``token_on_device=``: "auto" (generate's default) unless
    told; ConfigError for a reduction with ``--no-token-on-device``."""
    if args.token_on_device is False:
        if args.greedy_reduction:
            raise ConfigError(
                f"--greedy-reduction {args.greedy_reduction} chooses the token on the device; "
                "--no-token-on-device chooses it on the host: give one of them"
            )
        return False
    return args.greedy_reduction or (True if args.token_on_device else AUTO)


def phases_command(args: argparse.Namespace, context: int, new_tokens: int) -> int:
    """``kvlab profile --phases``: kvlab's whole decode step, phase by phase, beside genai's step."""
    open_cpu(args, [args.device])
    rounds, check_every = 3 if args.rounds is None else args.rounds, args.check_every
    r = bench.step_phases(
        load(args.model, precision=args.precision),
        args.device,
        context,
        new_tokens,
        rounds,
        check_every,
        genai=not args.no_genai,
        token_on_device=phases_token(args),
    )
    lines = [["phase", "ms/step", "share"]] + [
        [row["phase"], f"{row['ms_per_step']:.3f}", f"{100 * row['share']:.1f}%"] for row in r["rows"]
    ]
    lines.append(["token to token", f"{r['kvlab_token_to_token_ms']:.3f}", "100.0%"])
    widths = [max(len(row[i]) for row in lines) for i in range(3)]
    print(
        "\n".join(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in lines
        )
    )
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
    token = (
        f", the token on the device ({r['greedy_reduction']})" if r["token_on_device"] else ", the token on the host"
    )
    print(
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {args.device}; static cache "
        f"({check_every_text(check_every)}{token}), "
        f"context {context}, {new_tokens} new tokens x {rounds} rounds; medians of the decode steps after the "
        "first)"
    )
    if args.json:
        write_atomic(args.json, json.dumps(r, indent=1))
    return 0


def lockstep_command(args: argparse.Namespace, context: int, new_tokens: int) -> int:
    """``kvlab profile --lockstep``: kvlab's static loop and genai's, in turns of blocks of steps."""
    from ..bench.lockstep import lockstep, summary
    from ..bench.results import write_recording

    open_cpu(args, [args.device])
    r = lockstep(
        args.model,
        args.device,
        args.precision,
        context,
        new_tokens,
        3 if args.rounds is None else args.rounds,
        token_on_device=phases_token(args),
        graph_capture=args.graph_capture,
        check_every=args.check_every,
        block=32 if args.block is None else args.block,
        tokens_per_read=AUTO if args.tokens_per_read is None else args.tokens_per_read,
        sides=tuple((args.sides or "kvlab,genai").split(",")),
        under_load=args.under_load,
        buffer_cache_mode=args.buffer_cache_mode,
        validation_mode=args.validation_mode,
    )
    print(summary(r))
    if args.json:
        write_recording(args.json, r, note="not measured by kvlab profile --lockstep")
    return 0
