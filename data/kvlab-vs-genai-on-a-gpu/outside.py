"""The CI guard's loop (tests/test_guards.py) on a GPU: kvlab's default decode step against onnxruntime-genai's on
the WebGPU EP, each timed from outside its whole generate call ((T(1+K) - T(1)) / K, kvlab.bench.outside), paired
and interleaved in one process, tokens compared.

    python data/kvlab-vs-genai-on-a-gpu/outside.py OUT.json [MODEL:PRECISION ...]

Default cells: smollm2-shape fp32 and fp16 at 1,024 and 4,096 tokens of context, 64 new tokens, 5 rounds."""

from __future__ import annotations

import json
import sys

from kvlab.bench.outside import per_token_vs_genai, summary
from kvlab.ort import load
from kvlab.ort.runtime.device import backend

CONTEXTS = (1024, 4096)


def main(out: str, cells: list[str]) -> None:
    rows = []
    for cell in cells or ["smollm2-shape:fp32", "smollm2-shape:fp16"]:
        name, _, precision = cell.partition(":")
        model = load(name, precision=precision or "fp32")
        for context in CONTEXTS:
            result = per_token_vs_genai(model, context, new_tokens=64, rounds=5, device="webgpu")
            result["package"] = " ".join(backend().label_for("webgpu"))
            print(summary(result), flush=True)
            rows.append(result)
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
