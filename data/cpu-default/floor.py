"""What no CPU decode step of a model can beat: streaming its weights from memory once. Prints (and writes to
OUT.json) the machine's read bandwidth (numpy reading an array of the weights' size, split over the cores in
threads, the fastest of several passes), the weights' bytes, the floor they give (bytes / bandwidth), and, beside
it, kvlab's default step and onnxruntime-genai's, timed from outside as the CI guard does (per_token.py),
paired and interleaved:

    python data/cpu-default/floor.py OUT.json [MODEL[:PRECISION]] [CONTEXT,...]

A decode step must read every weight once (the MatMuls' B, the tied embedding as the LM head), so its time is at
least the floor; at the floor, kvlab's step over genai's is at least floor / genai's step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from per_token import per_token_vs_genai, summary

from kvlab.ort import load


def weight_bytes(model_dir: Path) -> int:
    """Bytes of every initializer of the model's graph (external data included), each counted once."""
    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    total = 0
    for t in graph.initializer:
        n = int(np.prod(t.dims)) if t.dims else 1
        total += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def read_bandwidth(nbytes: int, threads: int, passes: int = 7) -> float:
    """Bytes per second of the fastest of ``passes`` reads of a fresh ``nbytes`` float32 array, in ``threads``
    slices read at once (numpy releases the GIL), each pass by two reading kernels (a max and a dot product): the
    fastest read this machine gave numpy."""
    data = np.ones(nbytes // 4, np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            for read in (np.max, lambda p: np.dot(p, p)):
                start = time.perf_counter()
                list(pool.map(read, parts))
                best = min(best, time.perf_counter() - start)
    return nbytes / best


def main(out: str, cell: str = "smollm2:fp32", contexts: str = "256,2048") -> None:
    name, _, precision = cell.partition(":")
    model = load(name, precision=precision or "fp32")
    nbytes = weight_bytes(Path(model.onnx_path).parent)
    cores = len(os.sched_getaffinity(0))
    bandwidth = read_bandwidth(nbytes, cores)
    floor_ms = nbytes / bandwidth * 1e3
    print(
        f"{model.name}: weights {nbytes / 2**20:.0f} MiB; read bandwidth {bandwidth / 1e9:.1f} GB/s over {cores} "
        f"threads; floor {floor_ms:.1f} ms a step",
        flush=True,
    )
    rows = []
    for context in map(int, contexts.split(",")):
        result = per_token_vs_genai(model, context, new_tokens=64, rounds=5)
        genai_ms = float(np.median(result["ms_per_token"]["genai"]))
        print(f"{context}: {summary(result)}; floor / genai's step x{floor_ms / genai_ms:.2f}", flush=True)
        rows.append({"context": context, "floor_over_genai": floor_ms / genai_ms, **result})
    Path(out).write_text(
        json.dumps(
            {
                "model": model.name,
                "weight_bytes": nbytes,
                "cores": cores,
                "read_bandwidth": bandwidth,
                "floor_ms": floor_ms,
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
