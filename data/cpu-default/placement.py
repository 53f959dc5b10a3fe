"""Does kvlab's step depend on where its session's memory lands? A 515 MiB array (the weights' size) allocated and
touched before the session is made, after it, or not at all; then kvlab's step alone, back to back.

Usage: python data/cpu-default/placement.py OUT.json [MODEL:PRECISION] [CONTEXT] [PROCESSES_PER_MODE] [ROUNDS]

Each process runs one mode (the modes interleaved across processes, so a machine that drifts drifts over all of
them): it loads the model, makes the array (``before``), runs one warm-up generation (which makes the session and
collapses its weights into huge pages, ``kvlab.ort.runtime.memory``), makes the array (``after``), then times
``ROUNDS`` steps from outside as ``per_token.py`` does. Nothing else runs in the process during the steps; the
array is only held. Run as ``--child MODE CELL CONTEXT ROUNDS`` it is one such process and prints one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NEW = 64
MODES = ("none", "before", "after")


def child(mode: str, cell: str, context: int, rounds: int) -> dict:
    from per_token import per_token_ms  # this folder's outside timing (the child runs with it on sys.path)

    from kvlab.ort import StaticCache, generate, load, open_device
    from kvlab.ort.runtime import memory

    name, _, precision = cell.partition(":")
    block = np.ones(515 << 18, np.float32) if mode == "before" else None
    model = load(name, precision=precision or "fp32")
    dev = open_device("cpu")
    ids = np.random.default_rng(0).integers(0, model.info.vocab_size, context).astype(np.int64)
    cache = StaticCache(context + NEW + 1)

    def call(n: int) -> float:
        start = time.perf_counter()
        generate(model, ids, cache=cache, device=dev, max_new_tokens=n, stop_on_eos=False)
        return time.perf_counter() - start

    try:
        call(1 + NEW)
        if mode == "after":
            block = np.ones(515 << 18, np.float32)
        ms = [per_token_ms(call, NEW) for _ in range(rounds)]
    finally:
        cache.dispose()
    del block
    return {"mode": mode, "ms": ms, "huge_page_mib": memory.state()["anon_huge_mib"], "device": str(dev.label)}


def main(out: str, cell: str = "smollm2:fp32", context: str = "256", per_mode: str = "3", rounds: str = "8") -> None:
    runs = []
    for i in range(int(per_mode)):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:  # the order rotates every pass
            line = (
                subprocess.run(
                    [sys.executable, __file__, "--child", mode, cell, context, rounds],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            run = json.loads(line)
            runs.append(run)
            print(
                f"{mode:6s} median {np.median(run['ms']):.1f} ms ({min(run['ms']):.1f}-{max(run['ms']):.1f})",
                flush=True,
            )
    by_mode = {m: [float(np.median(r["ms"])) for r in runs if r["mode"] == m] for m in MODES}
    result = {"model": cell, "context": int(context), "new_tokens": NEW, "runs": runs, "process_medians_ms": by_mode}
    Path(out).write_text(json.dumps(result, indent=1))
    print(
        "process medians, ms a token: "
        + "; ".join(f"{m} {', '.join(f'{v:.1f}' for v in vs)}" for m, vs in by_mode.items())
    )


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        main(*sys.argv[1:6])
