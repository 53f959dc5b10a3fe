"""The ``kvlab`` command: doctor, generate, compare, bench, profile, trace, conformance, browser-bench, chat.

Every failure is one line on stderr, never a traceback: a bad flag exits 2 (``kvlab: error: ...``; an output path
kvlab cannot write too, checked before anything is measured: ``check_outputs``), a kvlab error 1, Ctrl-C 130, a
defect 2 (``kvlab: internal error: ...``; ``KVLAB_TRACEBACK=1`` shows its traceback). SIGTERM
(``timeout``, a job scheduler) stops a command as Ctrl-C does: through the same releases, and ``kvlab bench``
keeps the contexts it finished."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import ConfigError, KvlabError
from ..core.paths import check_output
from .args import parser
from .bench import bench_command, conformance_command, profile_command, trace_command
from .browser import browser_bench_command
from .chat import chat_command
from .doctor import doctor
from .runs import emit, graph_kinds, run_kinds


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvlab`` command on ``argv`` (default ``sys.argv[1:]``); returns its exit status."""
    args = parser().parse_args(argv)
    try:
        check_outputs(args)
    except ConfigError as exc:  # a bad output flag, as argparse's bad flags: exit 2, before anything is measured
        print(f"kvlab: error: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return command(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def stop(signum: int, frame: object) -> None:
    """SIGTERM, handled as Ctrl-C: through the SIGINT handler in force (Python's raises KeyboardInterrupt;
    ``kvlab.core.atomic``'s defers it to its block's end), or straight away where Ctrl-C is ignored (a job started
    in the background by a script inherits that) but a SIGTERM still means stop."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signum, frame)


def command(args: argparse.Namespace) -> int:
    """Run one parsed subcommand; every failure becomes one line on stderr and an exit status (module docstring)."""
    try:
        if args.command == "doctor":
            return doctor(as_json=args.json)
        if args.command == "bench":
            return bench_command(args)
        if args.command == "profile":
            return profile_command(args)
        if args.command == "trace":
            return trace_command(args)
        if args.command == "conformance":
            return conformance_command(args)
        if args.command == "browser-bench":
            return browser_bench_command(args)
        if args.command == "chat":
            return chat_command(args)
        kinds = ("dynamic", "static") if args.command == "compare" else (args.cache,)
        if args.command == "generate" and args.cache == "dynamic" and args.max_cache_len is not None:
            raise ConfigError("--max-cache-len applies to --cache static only")
        if args.graph_capture:
            kinds = graph_kinds(args, kinds)
        emit(run_kinds(args, kinds), args.json)
        return 0
    except KvlabError as exc:
        print(f"kvlab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvlab: interrupted (every cache and device tensor was released)", file=sys.stderr)
        return 130
    except Exception as exc:  # a defect in kvlab or below it: still one line, with what to report
        if os.environ.get("KVLAB_TRACEBACK"):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(
            f"kvlab: internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            f"(at {Path(where.filename).name}:{where.lineno}; KVLAB_TRACEBACK=1 shows the traceback; please "
            "report it)",
            file=sys.stderr,
        )
        return 2
