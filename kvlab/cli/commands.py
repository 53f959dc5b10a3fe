"""The ``kvlab`` command's parser and its subcommands, run on parsed arguments: every failure becomes one line on
stderr and an exit status (the table is ``kvlab.cli``'s docstring). Imported by ``kvlab.cli.main`` once it handles
Ctrl-C: it brings in the subcommands and everything they use."""

from __future__ import annotations

import argparse
import os
import re
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.errors import KvlabError, clip_message
from ..core.paths import check_output
from . import bench, browser, chat, doctor, generate, prepare
from .exits import FAILED, INTERRUPTED, USER_ERROR, one_line, say, stdout_gone, stdout_refused


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (``kvlab: error: ...``, exit 2), not usage plus error, and a
    flag is written whole (no prefixes: ``--prompt`` must not quietly mean ``--prompt-file``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
        self.register("action", "parsers", Commands)  # every level of subcommands (profile ops|phases too)

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print ``message`` as one line naming the command and exit 2."""
        where = "" if self.prog == "kvlab" else self.prog.removeprefix("kvlab ") + ": "
        # argparse names a type function that raised ValueError by its Python name ("invalid cache_names value")
        message = re.sub(r"invalid \w+ value: (.*)", r"\1 is not a valid value", message)
        self.exit(2, f"kvlab: error: {where}{clip_message(message)} (see {self.prog} --help)\n")


class Commands(argparse._SubParsersAction):
    """argparse's subcommands, but a command called by an alias (``compare``) names itself by that alias in its
    errors and its ``--help``."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if values and values[0] in self._name_parser_map:
            self._name_parser_map[values[0]].prog = f"{parser.prog} {values[0]}"
            namespace.subcommand_parser = self._name_parser_map[values[0]]  # the innermost: it names the errors
        super().__call__(parser, namespace, values, option_string)


def parser() -> argparse.ArgumentParser:
    """The ``kvlab`` parser: one subparser per subcommand, each added by its module (in ``--help`` order); each
    sets ``run``, the function that runs it on the parsed arguments."""
    ap = OneLineParser(prog="kvlab", description="See and measure KV caches in LLM decoding.")
    ap.add_argument("--version", action="version", version=f"kvlab {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        doctor.add,
        doctor.add_inspect,
        generate.add,
        chat.add,
        bench.add,
        bench.add_profile,
        browser.add,
        chat.add_bench,
        prepare.add,
    ):
        add(sub)
    return ap


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run its subcommand; returns the exit status (argparse's errors and ``--help`` exit). An
    argument no parser takes is named by the subcommand it was given to (its ``--help``), not by ``kvlab``."""
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra:
        getattr(args, "subcommand_parser", ap).error(f"unrecognized arguments: {' '.join(extra)}")
    return command(args)


def command(args: argparse.Namespace) -> int:
    """Run one parsed subcommand; every failure becomes one line on stderr and an exit status (``kvlab.cli``), and
    every warning one line, ``kvlab: note: ...``. An output path kvlab cannot write is refused before anything is
    measured."""
    try:
        if isinstance(getattr(args, "out", None), Path):
            check_output(args.out, "--out", args.out_is_folder)
        with warnings.catch_warnings():  # a note (e.g. what a model's config declares and kvlab does not apply)
            warnings.showwarning = lambda message, *_: say(f"kvlab: note: {one_line(message)}")  # one line each
            return args.run(args)
    except KvlabError as exc:  # a user error, the environment's included (kvlab.cli's docstring)
        say(f"kvlab: error: {one_line(exc)}")
        return USER_ERROR
    except KeyboardInterrupt:
        say("kvlab: interrupted (every cache and device tensor was released)")
        return INTERRUPTED
    except Exception as exc:  # a defect in kvlab or below it: still one line, with what to report
        if isinstance(exc, BrokenPipeError) and stdout_gone() or stdout_refused(exc):
            raise  # stdout's reader went away (kvlab.cli.main stops quietly), or its device is full (main says so)
        if os.environ.get("KVLAB_TRACEBACK"):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        say(
            f"kvlab: internal error: {type(exc).__name__}: {one_line(exc) if str(exc).strip() else ''} "
            f"(at {Path(where.filename).name}:{where.lineno}; KVLAB_TRACEBACK=1 shows the traceback; please "
            "report it, with the command that ran)"
        )
        return FAILED
