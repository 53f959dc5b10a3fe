"""Steady under load? The CPU EP's decode step with the machine quiet and with CPU-bound processes competing for
its cores, for kvlab's static cache and onnxruntime-genai, paired by round.

    python -m kvlab.bench.load [--model smollm2] [--context 1024] [--new-tokens 16] [--rounds 3]
                               [--load N] [--settings default,ort,spinning=off,threads=1] [--out DIR]

Each setting (the CPU EP options kvlab opens its device with: ``kvlab.ort.open_device("cpu", ...)``; genai keeps
its own defaults) runs in a process of its own, since a process has one CPU device. Within it every round runs
both variants quiet and loaded, the order of conditions and of variants alternating from round to round; the
ratio loaded/quiet is taken per round (paired) and its median reported with its range. The load is ``N`` Python
processes spinning on arithmetic (default: one per core), started before and stopped after each loaded block,
exactly once whatever happens (Ctrl-C included).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.paths import write_atomic

SPIN = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush()\nwhile True: pass"
# the CPU EP options of each setting: kvlab's defaults (chosen when the device opens: kvlab.ort.runtime.options),
# ONNX Runtime's (a thread per physical core, spinning), ONNX Runtime's threads not spinning, one thread
SETTINGS = ("default", "ort", "spinning=off", "threads=1")


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux's PR_SET_PDEATHSIG),
    so that a run killed without its cleanup (SIGKILL, a timeout's SIGTERM) leaves no competing process spinning;
    None elsewhere."""
    if sys.platform != "linux":
        return None
    parent = os.getpid()

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    return arm


@contextmanager
def competing(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` CPU-bound processes, running (each has said so) for the block, then killed and reaped."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True, preexec_fn=_dies_with_parent()
                )
            )
        for p in procs:
            p.stdout.readline()
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            p.stdout.close()


def check_load(load: object, flag: str = "--load") -> int:
    """``load`` competing processes, from 1 to 4 per logical CPU; else a ConfigError naming it. More only thrashes
    the scheduler, and a slip such as 1000000000 would start processes until the machine stops."""
    top = 4 * (os.cpu_count() or 1)
    if isinstance(load, bool) or not isinstance(load, int) or not 1 <= load <= top:
        raise ConfigError(
            f"{flag} {load!r} must be at least 1 and at most {top} (competing processes: 4 per logical CPU)"
        )
    return load


def check_setting(name: str) -> dict[str, Any]:
    """The ``open_device("cpu", ...)`` arguments of setting ``name``; ConfigError for a name not in SETTINGS."""
    from ..ort.runtime.options import ort_defaults

    if name not in SETTINGS:
        raise ConfigError(f"setting {name!r} is not valid; choose from {', '.join(SETTINGS)}")
    ort = ort_defaults()
    return {"default": {}, "ort": ort, "spinning=off": {**ort, "spinning": False}, "threads=1": {"threads": 1}}[name]


def measure(model_name: str, context: int, new: int, rounds: int, load: int, setting: str) -> dict[str, Any]:
    """One setting, in this process: each variant's median decode step quiet and loaded, per round."""
    from ..ort import StaticCache, open_device
    from ..ort import load as load_model
    from .machine import memory_bandwidth
    from .plan import prompt_ids
    from .results import environment
    from .variants import GenaiPeer, run_kvlab

    check_load(load)
    device = open_device("cpu", **check_setting(setting))
    model = load_model(model_name)
    ids = prompt_ids(model, context)
    genai = GenaiPeer(model, "cpu")
    runs = {
        "kvlab static": lambda: run_kvlab(model, ids, lambda: StaticCache(context + new), device, new),
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
    v = result["variants"]
    cells = [
        f"{name} {s['quiet_ms']:.1f} -> {s['loaded_ms']:.1f} ms (x{s['loaded_over_quiet']:.2f}, "
        f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f})"
        for name, s in v.items()
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
            child = [sys.executable, "-m", "kvlab.bench.load", "--model", model, "--context", str(context)]
            child += ["--new-tokens", str(new), "--rounds", str(rounds), "--load", str(load), "--one", name]
            out = subprocess.run(
                child, capture_output=True, text=True, check=True, preexec_fn=_dies_with_parent()
            ).stdout
            rows.append({"context": context, **json.loads(out.strip().splitlines()[-1])})
            print(f"{context} tokens, {report(rows[-1])}", flush=True)
    return rows


def write(rows: list[dict[str, Any]], out: Path) -> Path:
    """results.json in ``out`` (atomically; ``write_atomic`` makes the directory if need be)."""
    return write_atomic(out / "results.json", json.dumps({"rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvlab.bench.load", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 1, help="competing processes (default: one a core)")
    ap.add_argument("--settings", default="default,ort")
    ap.add_argument("--out", type=Path, help="write results.json there")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one setting in this process, print its JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.model, args.context, args.new_tokens, args.rounds, args.load, args.one)))
        return
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)  # before any measuring: a bad path fails now
    rows = run(args.model, [args.context], args.new_tokens, args.rounds, args.load, args.settings.split(","))
    if args.out is not None:
        write(rows, args.out)


if __name__ == "__main__":
    main()
