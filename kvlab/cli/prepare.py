"""``kvlab prepare``: build, ahead of a workshop, every model the notebooks load, so that no attendee waits for a
build in a lesson. Prints one line per model (built now or already there, its size on disk, the seconds it took)
and a total; ``--json`` prints them as a list. ``kvlab prepare all`` adds the deep dives' models to the core path's,
``kvlab prepare NAME ...`` takes those presets of the list alone; ``--list`` says what is there without building
anything."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..ort.models.build import DONE, ensure_built, model_dir
from . import flags

# what the notebooks load, by the part of the course they are in: "preset", "preset:precision" (default fp32), or
# "preset:graph-capture" (its build for WebGPU graph capture)
CORE = ("toy", "toy:graph-capture", "smollm2", "smollm2:fp16", "smollm2:int4", "kv-heavy")  # 00, 00b, 01-04
DEEP_DIVES = (  # 05-10
    "sliding-toy", "gemma2-toy", "mistral-toy", "hybrid-toy", "conv-toy", "kv-shared-toy",
)  # fmt: skip


def triple(spec: str) -> tuple[str, str, bool]:
    """A ``CORE`` or ``DEEP_DIVES`` entry as (preset, precision, graph_capture)."""
    name, _, rest = spec.partition(":")
    return (name, "fp32", True) if rest == "graph-capture" else (name, rest or "fp32", False)


def add(sub: argparse._SubParsersAction) -> None:
    """The ``prepare`` subcommand."""
    p = sub.add_parser("prepare", help="build every model the notebooks need, ahead of the day (sizes and times)")
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="'all': the deep dives' models (05-10) too; or only these presets of the list (e.g. smollm2); "
        "none: the core path's models",
    )
    p.add_argument("--list", action="store_true", help="say what is built and what is missing; build nothing")
    flags.json_flag(p, "one object per model as a JSON list")
    p.set_defaults(run=prepare_command)


def wanted(names: list[str]) -> tuple[tuple[str, str, bool], ...]:
    """The (preset, precision, graph_capture) triples to build for ``kvlab prepare NAME ...``: none, the core
    path's; ["all"], the deep dives' too; else those presets of either list alone. Raises ConfigError for a name
    that is in neither list (or "all" beside other names), naming the valid ones."""
    if not names:
        return tuple(triple(spec) for spec in CORE)
    models = tuple(triple(spec) for spec in CORE + DEEP_DIVES)
    if names == ["all"]:
        return models
    valid = list(dict.fromkeys(name for name, _, _ in models))
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ConfigError(f"{', '.join(map(repr, unknown))} is not one of the notebooks' models: 'all' or {valid}")
    return tuple(m for m in models if m[0] in names)


def prepare(name: str, precision: str, graph: bool, build: bool = True) -> dict[str, Any]:
    """The model built when missing (``build`` False: only looked at): its name, precision, graph_capture, path,
    status ("built now", "already built" or "missing"), bytes on disk and seconds spent. Raises what
    ``ensure_built`` raises (ModelError for a build that fails)."""
    folder = model_dir(name, precision, graph)
    there = (folder / DONE).is_file()
    start = time.perf_counter()
    if build and not there:
        ensure_built(name, precision, progress=False, graph_capture=graph)
    return {
        "name": name, "precision": precision, "graph_capture": graph, "path": str(folder),
        "status": "already built" if there else "built now" if build else "missing",
        "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),  # none: 0
        "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip


def prepare_command(args: argparse.Namespace) -> int:
    """``kvlab prepare``: one line per model as it is done, and a total (or the JSON list); 0 when every model is
    there at the end (with ``--list``: 1 when one is missing)."""
    rows = []
    for triple in wanted(args.names):  # one at a time: the models before a build that fails stay built
        row = prepare(*triple, build=not args.list)
        rows.append(row)
        if not args.json:
            build = f"{row['name']} {row['precision']}{' (graph capture build)' if row['graph_capture'] else ''}"
            print(
                f"{build:34s} {row['status']:13s} {row['bytes'] / 2**20:9.1f} MiB {row['seconds']:7.1f} s", flush=True
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        total = sum(r["bytes"] for r in rows) / 2**20
        seconds = sum(r["seconds"] for r in rows)
        print(f"{len(rows)} models, {total:,.1f} MiB on disk, {seconds:.1f} s ({Path(rows[0]['path']).parent})")
    return 1 if any(r["status"] == "missing" for r in rows) else 0
