"""``kvlab profile ops|phases|lockstep``: where a static-cache decode step's time goes, by ONNX operator (ONNX
Runtime's own profiler), by phase of kvlab's step beside onnxruntime-genai's, or in turns with genai's loop. Each
mode turns its flags into one call of ``kvlab.bench``, prints what it measured and returns the exit status."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json

from .. import bench
from ..core.cache import check_every_text
from ..core.errors import ConfigError
from ..core.paths import write_atomic
from ..ort import load
from . import flags

# --set KEY=VALUE of lockstep: its keywords beyond the flags, and how each value is read
LOCKSTEP = {
    "block": flags.positive_int,  # steps each loop takes per turn (default 32)
    "sides": lambda text: tuple(text.split(",")),  # the two loops (default kvlab,genai)
    "check_every": flags.positive_int,  # the static cache reads back all its presents every k steps
    "tokens_per_read": flags.positive_int,  # kvlab's greedy steps read back together
    "buffer_cache_mode": flags.nonempty,  # WebGPU: the storage buffer cache mode both loops run in
    "validation_mode": flags.nonempty,  # WebGPU: the validation mode both loops run in
    "graph_capture": flags.ON_OFF.__getitem__,  # WebGPU: both captured (CapturedStaticCache; genai enableGraphCapture)
}

# the modes: name -> (help, what --out writes, whether it pairs kvlab with genai)
MODES = {
    "ops": ("by ONNX operator type (ONNX Runtime's own profiler)", "also write the rows as CSV", False),
    "phases": (
        "kvlab's step phase by phase (binding, run, read-back, commit, loop), beside onnxruntime-genai's",
        "also write the result as JSON",
        True,
    ),
    "lockstep": (
        "kvlab's static-cache loop and onnxruntime-genai's, in turns of 32-step blocks in one process",
        "also write the result as JSON",
        True,
    ),
}


def add(sub: argparse._SubParsersAction) -> None:
    """The ``profile`` subcommand and its modes."""
    p = sub.add_parser("profile", help="where a decode step's time goes: by ONNX operator, by phase, against genai")
    modes = p.add_subparsers(dest="mode", required=True, metavar="MODE")
    runs = {"ops": ops_command, "phases": phases_command, "lockstep": lockstep_command}
    for name, (what, out, paired) in MODES.items():
        mode = modes.add_parser(name, help=what)
        _common(mode, out)
        if paired:
            flags.counts(mode, rounds=(3, "rounds of kvlab and genai"))
            flags.token_on_device(mode)
        mode.set_defaults(run=runs[name])
    flags.settings(modes.choices["lockstep"], "kvlab.bench.lockstep.lockstep", LOCKSTEP)


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


def _model(args: argparse.Namespace) -> tuple[str, str | None]:
    """The one (name, precision) of ``--model``; ConfigError for several."""
    (name, precision), *more = flags.model_names(args.model)
    if more:
        raise ConfigError(f"--model {args.model!r} names several models; a profile runs one")
    return name, precision


def table(rows: list[list[str]]) -> str:
    """``rows`` (the first a header) as aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    )


def ops_command(args: argparse.Namespace) -> int:
    """``kvlab profile ops``: ``kvlab.bench.op_profile``'s rows as a table (and CSV with ``--out``)."""
    name, precision = _model(args)
    rows = bench.op_profile(load(name, precision=precision), args.device, args.context, args.new_tokens)
    head = [["op", "ms/step", "nodes/step", "share"]]
    print(
        table(
            head
            + [
                [r["op"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_step']:g}", f"{100 * r['share']:.1f}%"]
                for r in rows
            ]
        )
    )
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
    name, precision = _model(args)
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


def lockstep_command(args: argparse.Namespace) -> int:
    """``kvlab profile lockstep``: ``kvlab.bench.lockstep``'s summary (and its result as JSON with ``--out``)."""
    from ..bench.lockstep import lockstep, summary
    from ..bench.results import write_recording

    name, precision = _model(args)
    r = lockstep(
        name,
        args.device,
        precision,
        args.context,
        args.new_tokens,
        args.rounds,
        token_on_device=flags.WHERE[args.token_on_device],
        **flags.key_values(args.set, "--set", LOCKSTEP),
    )
    print(summary(r))
    if args.out:
        write_recording(args.out, r, note="not measured by kvlab profile lockstep")
    return 0
