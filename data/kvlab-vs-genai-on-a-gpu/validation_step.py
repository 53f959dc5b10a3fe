"""What the WebGPU context's validation costs a decode step: kvlab's static step and onnxruntime-genai's, each in
processes whose context was opened with ONNX Runtime's default validation ("basic": Dawn validates every call) or
with ``validation_mode="disabled"`` (Dawn's ``skip_validation``), paired by round across processes.

    python3 data/kvlab-vs-genai-on-a-gpu/validation_step.py [--models smollm2-shape,phi4-kv --contexts 1024,8000
        --rounds 3 --new-tokens 32 --out OUT.json]

A process has one WebGPU context and every session of the process joins it (genai's too), so each mode runs in
processes of its own, the modes alternating round by round. In each, a one-token kvlab generation opens the
context with the mode before genai's model loads; then ``kvlab.bench.step_phases`` (kvlab's static cache and
genai in paired rounds, the tokens compared) at each context, and kvlab alone with the presents read back every
16th step. The token is chosen as kvlab's default chooses it (``reduction_for``). Rows: per (model, context, mode)
the in-process figures; then kvlab's step in one mode over genai's in the other, paired by round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

MODES = ("default", "disabled")


def one(model_name: str, mode: str, contexts: list[int], new_tokens: int) -> dict:
    """In this process: the context opened with ``mode``, then each context's paired rounds."""
    from kvlab import generate, load, open_device
    from kvlab.bench import step_phases
    from kvlab.ort.decode.greedy import reduction_for

    dev = open_device("webgpu", validation_mode=None if mode == "default" else mode)
    model = load(model_name, progress=False)
    generate(model, [1, 2, 3], device="webgpu", max_new_tokens=1)  # the context now exists, with this mode
    reduction = reduction_for("auto", model.info.vocab_size, dev) or False
    rows = []
    for context in contexts:
        both = step_phases(model, "webgpu", context, new_tokens, rounds=2, token_on_device=reduction)
        alone = step_phases(
            model, "webgpu", context, new_tokens, rounds=2, check_every=16, genai=False, token_on_device=reduction
        )
        rows.append(
            {
                "model": model_name,
                "context": context,
                "mode": mode,
                "ep_options": dev.ep_options,
                "greedy_reduction": both["greedy_reduction"],
                "adapter": dev.adapter.name,
                "kvlab_step_ms": both["kvlab_step_ms"],
                "genai_step_ms": both["genai_step_ms"],
                "step_ratio_in_process": both["step_ratio"],
                "tokens_equal_genai": both["tokens_equal_genai"],
                "python_ms": both["python_ms"],
                "kvlab_step_ms_check_every_16": alone["kvlab_step_ms"],
            }
        )
    return {"rows": rows}


def paired(rows: list[dict], model: str, context: int, mine: str, theirs: str, key: str = "kvlab_step_ms") -> dict:
    """kvlab's ``key`` in mode ``mine`` over genai's step in mode ``theirs``, paired by round."""

    def pick(mode):
        return [r for r in rows if (r["model"], r["context"], r["mode"]) == (model, context, mode)]

    ratios = [a[key] / b["genai_step_ms"] for a, b in zip(pick(mine), pick(theirs))]
    return {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-shape,phi4-kv")
    ap.add_argument("--contexts", default="1024,8000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], contexts, args.new_tokens)))
        return
    from kvlab.bench.results import write_recording

    rows = []
    for r in range(args.rounds):
        for model in args.models.split(","):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    model,
                    mode,
                    "--contexts",
                    args.contexts,
                    "--new-tokens",
                    str(args.new_tokens),
                ]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    print(f"round {r} {model} {mode}: rc {out.returncode}\n{out.stderr[-2000:]}", flush=True)
                    continue
                for row in json.loads(out.stdout.strip().splitlines()[-1])["rows"]:
                    rows.append({"round": r, **row})
                    print(
                        f"round {r} {model} {row['context']} {mode}: kvlab {row['kvlab_step_ms']:.3f} "
                        f"(check 16: {row['kvlab_step_ms_check_every_16']:.3f}) genai {row['genai_step_ms']:.3f} "
                        f"x{row['step_ratio_in_process']:.3f} tokens equal {row['tokens_equal_genai']}",
                        flush=True,
                    )
            if args.out:  # what finished so far, should a later process not
                write_recording(args.out, {"command": " ".join(sys.argv), "rows": rows, "complete": False})
    summary = []
    for model in args.models.split(","):
        for context in contexts:
            s = {"model": model, "context": context}
            for mine in MODES:
                for theirs in MODES:
                    s[f"kvlab_{mine}_over_genai_{theirs}"] = paired(rows, model, context, mine, theirs)
            s["kvlab_disabled_check16_over_genai_default"] = paired(
                rows, model, context, "disabled", "default", "kvlab_step_ms_check_every_16"
            )
            summary.append(s)
            print(
                f"{model} {context}: "
                + "; ".join(
                    f"{k} x{v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
                    for k, v in s.items()
                    if isinstance(v, dict)
                ),
                flush=True,
            )
    if args.out:
        write_recording(args.out, {"command": " ".join(sys.argv), "rows": rows, "summary": summary, "complete": True})


if __name__ == "__main__":
    main()
