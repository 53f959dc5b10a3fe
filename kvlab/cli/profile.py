"""``kvlab profile ops|phases``: where a static-cache decode step's time goes, by ONNX operator (ONNX Runtime's own
profiler) or by phase of kvlab's step beside onnxruntime-genai's. Each mode turns its flags into one call of
``kvlab.bench``, prints what it measured and returns the exit status."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json

from .. import bench
from ..core.cache import check_every_text
from ..core.paths import write_atomic
from ..ort import load
from . import flags
from .generate import table


def add(sub: argparse._SubParsersAction) -> None:
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
        text = io.StringIO(newline="")
        w = csv.DictWriter(text, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        write_atomic(args.out, text.getvalue())
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
