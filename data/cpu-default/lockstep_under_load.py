"""kvlab's static-cache loop and onnxruntime-genai's in turns (data/kvlab-vs-genai-on-a-gpu/lockstep.py), every
round run quiet and with N CPU-bound processes competing for the cores (was ``kvlab profile --lockstep --under-load
N``).

    .venv/bin/python data/cpu-default/lockstep_under_load.py --load N [--model smollm2] [--context 1024]
        [--new-tokens 64] [--rounds 7] [--block 16] [--out loadN.json]

Quiet first in even rounds, loaded first in odd ones. Loaded, a step takes one of two times (its process has a core,
or shares one with a competitor), and a median jumps between them, so both conditions are summarized by means: the
time per token, which follows the share of the cores a loop got. The result describes the quiet rounds and adds
``under_load``: the loaded rounds' pairs, and per round each side's loaded over quiet time per token and the first
side's slowdown over the second's (below 1: the first slows down less).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from competing import check_load, competing

from kvlab.bench.results import write_recording

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kvlab-vs-genai-on-a-gpu"))
from lockstep import pair_rounds, prepare, summary  # noqa: E402  (the lockstep recording's script)


def under_load(load: int, rounds: int, model: str = "smollm2", **settings: Any) -> dict[str, Any]:
    """``rounds`` rounds quiet and as many with ``load`` competing processes (``prepare``'s ``settings``, on the CPU
    EP): the quiet rounds' result with ``under_load`` (module docstring)."""
    check_load(load)
    what, one = prepare(model, "cpu", **settings)
    quiet, loaded = [], []
    for r in range(rounds):
        for busy in (False, True) if r % 2 == 0 else (True, False):
            with competing(load) if busy else nullcontext():
                (loaded if busy else quiet).append(one(np.mean))
    slowdown = {
        side: [float(np.mean(hot[key]) / np.mean(calm[key])) for calm, hot in zip(quiet, loaded)]
        for side, key in (("first", "a_ms"), ("second", "b_ms"))
    }
    relative = [a / b for a, b in zip(slowdown["first"], slowdown["second"])]
    return {
        **what,
        "rounds": rounds,
        **pair_rounds(quiet),
        "under_load": {
            "processes": load,
            "first_slowdown": float(np.median(slowdown["first"])),
            "second_slowdown": float(np.median(slowdown["second"])),
            "relative_slowdown": float(np.median(relative)),  # below 1: the first side slows down less
            "rounds": {**slowdown, "relative": relative},
            **pair_rounds(loaded),
        },
    }


def loaded_line(r: dict[str, Any]) -> str:
    """The loaded rounds in one line."""
    (a, b), busy = r["sides"], r["under_load"]
    rounds = ", ".join(f"x{x:.3f}" for x in busy["rounds"]["relative"])
    return (
        f"with {busy['processes']} competing processes: {a} x{busy['first_slowdown']:.3f} of its quiet time per token, "
        f"{b} x{busy['second_slowdown']:.3f}; {a}'s slowdown over {b}'s x{busy['relative_slowdown']:.3f} (rounds "
        f"{rounds}); {a}/{b} loaded x{busy['ratio_median']:.3f}"
    )


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=int, required=True, help="competing processes")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--out", type=Path, help="write the result there as JSON")
    a = ap.parse_args(argv)
    r = under_load(a.load, a.rounds, a.model, context=a.context, new_tokens=a.new_tokens, block=a.block)
    print(summary(r) + "\n" + loaded_line(r))
    if a.out:
        write_recording(a.out, r, note="not measured by lockstep_under_load.py")


if __name__ == "__main__":
    main()
