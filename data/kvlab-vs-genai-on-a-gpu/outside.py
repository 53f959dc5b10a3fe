"""The CI guard's loop (tests/test_guards.py) on a GPU: kvlab's default decode step against onnxruntime-genai's on
the WebGPU EP, each timed from outside its whole generate call ((T(1+K) - T(1)) / K, data/cpu-default/per_token.py),
paired and interleaved in one process, tokens compared.

    python data/kvlab-vs-genai-on-a-gpu/outside.py OUT.json DEVICE [MODEL:PRECISION ...]

DEVICE webgpu: at 1,024 and 4,096 tokens of context; cpu: at 256 and 2,048 (the CI guard's contexts, here on the GPU
machine's own CPU). Default cells: smollm2-shape fp32 and fp16; 64 new tokens, 5 rounds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvlab.ort import load
from kvlab.ort.runtime.device import backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-default"))
from per_token import per_token_vs_genai, summary  # noqa: E402  (the CI guard's loop, in data/cpu-default/)

CONTEXTS = {"webgpu": (1024, 4096), "cpu": (256, 2048)}


def main(out: str, device: str, cells: list[str]) -> None:
    rows = []
    for cell in cells or ["smollm2-shape:fp32", "smollm2-shape:fp16"]:
        name, _, precision = cell.partition(":")
        model = load(name, precision=precision or "fp32")
        for context in CONTEXTS[device]:
            result = per_token_vs_genai(model, context, new_tokens=64, rounds=5, device=device)
            result["package"] = " ".join(backend().label_for(device))
            print(summary(result), flush=True)
            rows.append(result)
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
