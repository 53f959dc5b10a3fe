"""``kvlab bench`` and ``kvlab profile``."""

from __future__ import annotations

import argparse
import csv

from .. import bench
from ..ort.backend import DEVICES
from ..core.errors import ConfigError
from ..ort import load
from ..presets import check_precision
from .args import cpu_options, ints, open_cpu


def bench_command(args: argparse.Namespace) -> int:
    plan = bench.Plan.quick() if args.quick else bench.Plan()
    if args.models or args.devices:
        models = (args.models or ",".join(sorted({m for m, _ in plan.targets}))).split(",")
        devices = (args.devices or "cpu").split(",")
        bad = [d for d in devices if d not in DEVICES]
        if bad:
            raise ConfigError(f"--devices {bad[0]!r} is not valid; choose from {DEVICES}")
        plan.targets = [(m, d) for m in models for d in devices]
    if args.precisions:
        plan.precisions = [check_precision(p) for p in args.precisions.split(",")]
    if args.contexts:
        plan.contexts = {d: ints(args.contexts, "--contexts") for d in DEVICES}
    if args.new_tokens is not None:
        plan.new_tokens = {d: ints(str(args.new_tokens), "--new-tokens")[0] for d in DEVICES}
    if args.max_cache_lens:
        plan.static_lens = ints(args.max_cache_lens, "--max-cache-lens")
    if args.reps is not None:
        plan.reps = ints(str(args.reps), "--reps")[0]
    if args.buffer_cache_modes:
        plan.buffer_cache_modes = args.buffer_cache_modes.split(",")
    plan.genai = plan.genai and not args.no_genai
    open_cpu(args)
    result = bench.run_plan(plan)
    files = bench.write(result, args.out, charts=not args.no_charts)
    print("\n" + bench.report(result))
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def profile_command(args: argparse.Namespace) -> int:
    context = ints(str(args.context), "--context")[0]
    new_tokens = ints(str(args.new_tokens), "--new-tokens")[0]
    rows = bench.op_profile(load(args.model, precision=args.precision), args.device, context, new_tokens,
                            **cpu_options(args))
    lines = [["op", "ms/step", "nodes/step", "share"]] + [
        [r["op"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_step']:g}", f"{100 * r['share']:.1f}%"] for r in rows]
    widths = [max(len(row[i]) for row in lines) for i in range(4)]
    print("\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                    for row in lines))
    print(f"({args.model} on {args.device}, static cache, context {context}; ONNX Runtime's profiler, which adds "
          f"a little to every node; mean of {new_tokens - 2} decode runs)")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0
