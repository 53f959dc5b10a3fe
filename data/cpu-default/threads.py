"""kvlab's step against onnxruntime-genai's (its own default) on the CPU EP, for several intra-op thread counts of
kvlab's device (spinning), timed from outside (per_token.py), paired and interleaved:

    python data/cpu-default/threads.py OUT.json MODEL[:PRECISION] THREADS,... CONTEXT,...
"""

from __future__ import annotations

import json
import sys

from per_token import per_token_vs_genai, summary

from kvlab.ort import close_device, load, open_device


def main(out: str, cell: str, threads: str, contexts: str) -> None:
    name, _, precision = cell.partition(":")
    model, rows = load(name, precision=precision or "fp32"), []
    for context in map(int, contexts.split(",")):
        for t in map(int, threads.split(",")):
            close_device("cpu")
            device = open_device("cpu", threads=t, spinning=True)
            result = per_token_vs_genai(model, context, new_tokens=64, rounds=5, device=device)
            print(f"threads {t}: " + summary(result), flush=True)
            rows.append({"threads": t, **result})
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
