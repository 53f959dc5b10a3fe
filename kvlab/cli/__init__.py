"""The ``kvlab`` command: doctor, generate, compare, bench, profile, trace, conformance. A kvlab error exits 1 with one line on stderr
(``kvlab: error: ...``), never a traceback."""

from __future__ import annotations

import sys
from typing import Sequence

from ..core.errors import ConfigError, KvlabError
from .args import parser
from .bench import bench_command, conformance_command, profile_command, trace_command
from .doctor import doctor
from .runs import emit, run_kinds


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
        kinds = ("dynamic", "static") if args.command == "compare" else (args.cache,)
        if args.command == "generate" and args.cache == "dynamic" and args.max_cache_len is not None:
            raise ConfigError("--max-cache-len applies to --cache static only")
        emit(run_kinds(args, kinds), args.json)
        return 0
    except KvlabError as exc:
        print(f"kvlab: error: {exc}", file=sys.stderr)
        return 1
