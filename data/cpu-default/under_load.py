"""Steady under load? The CPU EP's decode step with the machine quiet and with CPU-bound processes competing for
its cores, for kvlab's static cache and onnxruntime-genai, paired by round (was ``kvlab bench --under-load N`` and
``python -m kvlab.bench.load``).

    .venv/bin/python data/cpu-default/under_load.py [--model smollm2] [--contexts 1024] [--new-tokens 16]
        [--rounds 3] [--load N] [--settings default,ort,spinning=off,threads=1] [--out DIR]

Each setting (the CPU EP options kvlab opens its device with: ``kvlab.open_device("cpu", ...)``; genai keeps its
own defaults) runs in a process of its own, since a process has one CPU device. Within it every round runs both
variants quiet and loaded, the order of conditions and of variants alternating from round to round; the ratio
loaded/quiet is taken per round (paired) and its median reported with its range. The load is ``N`` processes
spinning on arithmetic (default: one per core, ``competing.py``), started before and stopped after each loaded block.
Writes results.json in ``--out`` (one row per context and setting) and prints a line per row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from competing import check_load, competing, dies_with_parent

import kvlab
from kvlab import ConfigError
from kvlab.bench.machine import memory_bandwidth
from kvlab.bench.plan import prompt_ids
from kvlab.bench.results import environment
from kvlab.bench.variants import GenaiPeer, run_kvlab
from kvlab.core.paths import write_atomic
from kvlab.ort.runtime.options import physical_cores

# the CPU EP options of each setting: kvlab's defaults (chosen when the device opens: kvlab.ort.runtime.options),
# ONNX Runtime's (a thread per physical core, spinning), ONNX Runtime's threads not spinning, one thread
SETTINGS = ("default", "ort", "spinning=off", "threads=1")


def check_setting(name: str) -> dict[str, Any]:
    """The ``open_device("cpu", ...)`` arguments of setting ``name``; ConfigError for a name not in SETTINGS."""
    if name not in SETTINGS:
        raise ConfigError(f"setting {name!r} is not valid; choose from {', '.join(SETTINGS)}")
    ort = {"threads": physical_cores(), "spinning": True}  # ONNX Runtime's own: a thread per physical core, spinning
    return {"default": {}, "ort": ort, "spinning=off": {**ort, "spinning": False}, "threads=1": {"threads": 1}}[name]


def measure(model_name: str, context: int, new: int, rounds: int, load: int, setting: str) -> dict[str, Any]:
    """One setting, in this process: each variant's median decode step quiet and loaded, per round."""
    device = kvlab.open_device("cpu", **check_setting(setting))
    model = kvlab.load(model_name)
    ids = prompt_ids(model, context)
    genai = GenaiPeer(model, "cpu")
    runs = {
        "kvlab static": lambda: run_kvlab(model, ids, lambda: kvlab.StaticCache(context + new), device, new),
        "genai": lambda: genai.run(ids, new),
    }
    tokens = {name: run().token_ids for name, run in runs.items()}  # warm-up, and the tokens to compare
    times: dict[str, dict[str, list[float]]] = {name: {"quiet": [], "loaded": []} for name in runs}
    for r in range(rounds):
        for condition in ("quiet", "loaded") if r % 2 == 0 else ("loaded", "quiet"):
            with competing(load if condition == "loaded" else 0):
                for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                    times[name][condition].append(runs[name]().decode_ms)
    return {
        "setting": setting,
        "cpu_ep_options": device.ep_options,
        "tokens_equal": tokens["kvlab static"] == tokens["genai"],
        "variants": {name: summary(t) for name, t in times.items()},
        "environment": environment(memory_bandwidth(), genai.huge_pages),
    }


def summary(t: dict[str, list[float]]) -> dict[str, Any]:
    """A variant's quiet and loaded medians, and the median (min, max) of their ratio paired by round."""
    ratios = [b / a for a, b in zip(t["quiet"], t["loaded"])]
    return {
        "quiet_ms": float(np.median(t["quiet"])),
        "loaded_ms": float(np.median(t["loaded"])),
        "loaded_over_quiet": float(np.median(ratios)),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "quiet_ms_runs": t["quiet"],
        "loaded_ms_runs": t["loaded"],
    }


def report(result: dict[str, Any]) -> str:
    """One row as a line."""
    cells = [
        f"{name} {s['quiet_ms']:.1f} -> {s['loaded_ms']:.1f} ms (x{s['loaded_over_quiet']:.2f}, "
        f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f})"
        for name, s in result["variants"].items()
    ]
    return f"{result['setting']}: " + "; ".join(cells) + f"; tokens equal: {result['tokens_equal']}"


def run(model: str, contexts: list[int], new: int, rounds: int, load: int, settings: list[str]) -> list[dict[str, Any]]:
    """Every setting at every context, each in a process of its own (one CPU device a process); a row per
    (setting, context), its line printed as it comes. ConfigError for a bad setting or ``load``, before anything
    runs."""
    check_load(load)
    for name in settings:
        check_setting(name)
    rows = []
    for context in contexts:
        for name in settings:
            child = [sys.executable, __file__, "--model", model, "--contexts", str(context), "--new-tokens", str(new)]
            child += ["--rounds", str(rounds), "--load", str(load), "--one", name]
            out = subprocess.run(child, capture_output=True, text=True, check=True, preexec_fn=dies_with_parent())
            rows.append({"context": context, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(f"{context} tokens, {report(rows[-1])}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--contexts", default="1024", help="comma-separated prompt lengths")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 1, help="competing processes (default: one a core)")
    ap.add_argument("--settings", default="default,ort")
    ap.add_argument("--out", type=Path, help="write results.json there")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one setting in this process, print its JSON
    args = ap.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.one:
        print(json.dumps(measure(args.model, contexts[0], args.new_tokens, args.rounds, args.load, args.one)))
        return
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)  # before any measuring: a bad path fails now
    rows = run(args.model, contexts, args.new_tokens, args.rounds, args.load, args.settings.split(","))
    if args.out is not None:
        write_atomic(args.out / "results.json", json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
