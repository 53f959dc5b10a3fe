"""The ``kvlab`` command's subcommands, run on parsed arguments: every failure becomes one line on stderr and an
exit status (the table is ``kvlab.cli``'s docstring). Imported by ``kvlab.cli.main`` once it handles Ctrl-C: it
brings in the subcommands and everything they use."""

from __future__ import annotations

import argparse
import os
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from ..core.errors import ConfigError, KvlabError
from ..core.paths import check_output
from .args import parser
from .bench import bench_command, conformance_command, profile_command, trace_command
from .browser import browser_bench_command
from .chat import chat_command
from .doctor import doctor
from .exits import FAILED, INTERRUPTED, USER_ERROR, one_line, say, stdout_gone
from .runs import emit, graph_kinds, run_kinds


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run its subcommand; returns the exit status (argparse's errors and ``--help`` exit)."""
    return command(parser().parse_args(argv))


# Every command's output flags: (command, attribute) -> whether it names a folder (else a file).
OUTPUTS = {
    ("bench", "out"): True,
    ("browser-bench", "out"): True,
    ("chat", "out"): True,
    ("trace", "out"): False,
    ("conformance", "out"): False,
    ("profile", "csv"): False,
    ("profile", "json"): False,
}


def check_outputs(args: argparse.Namespace) -> None:
    """ConfigError for the first output flag of ``args`` that names a path kvlab cannot write (``check_output``),
    before any measuring. ``kvlab chat`` writes only with ``--bench``."""
    for (cmd, attr), folder in OUTPUTS.items():
        value = getattr(args, attr, None)
        if args.command != cmd or not isinstance(value, Path) or (cmd == "chat" and not args.bench):
            continue
        check_output(value, f"--{attr}", folder)


def generations(args: argparse.Namespace) -> int:
    """``kvlab generate`` and ``kvlab compare``: the runs asked for, printed (``kvlab.cli.runs``)."""
    kinds = ("dynamic", "static") if args.command == "compare" else (args.cache,)
    if args.command == "generate" and args.cache == "dynamic" and args.max_cache_len is not None:
        raise ConfigError("--max-cache-len applies to --cache static only")
    if args.graph_capture:
        kinds = graph_kinds(args, kinds)
    emit(run_kinds(args, kinds), args.json)
    return 0


# The subcommands other than generate and compare (``generations``): name -> what runs it on the parsed arguments.
SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "doctor": lambda args: doctor(as_json=args.json),
    "bench": bench_command,
    "profile": profile_command,
    "trace": trace_command,
    "conformance": conformance_command,
    "browser-bench": browser_bench_command,
    "chat": chat_command,
}


def command(args: argparse.Namespace) -> int:
    """Run one parsed subcommand; every failure becomes one line on stderr and an exit status (``kvlab.cli``)."""
    try:
        check_outputs(args)  # a bad output flag is refused before anything is measured
        return SUBCOMMANDS.get(args.command, generations)(args)
    except KvlabError as exc:  # a user error, the environment's included (kvlab.cli's docstring)
        say(f"kvlab: error: {one_line(exc)}")
        return USER_ERROR
    except KeyboardInterrupt:
        say("kvlab: interrupted (every cache and device tensor was released)")
        return INTERRUPTED
    except Exception as exc:  # a defect in kvlab or below it: still one line, with what to report
        if isinstance(exc, BrokenPipeError) and stdout_gone():
            raise  # stdout's reader went away: kvlab.cli.main stops quietly
        if os.environ.get("KVLAB_TRACEBACK"):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        say(
            f"kvlab: internal error: {type(exc).__name__}: {one_line(exc) if str(exc).strip() else ''} "
            f"(at {Path(where.filename).name}:{where.lineno}; KVLAB_TRACEBACK=1 shows the traceback; please "
            "report it, with the command that ran)"
        )
        return FAILED
