"""Why kvlab's rounds spread more than genai's: does kvlab's step depend on what ran just before it in the process
(genai's generation, a read of the weights' size, an idle gap), or does it drift with the machine?

Usage: python data/cpu-default/drift.py OUT.json [MODEL:PRECISION] [CONTEXT] [ROUNDS]

One process, one CPU device with kvlab's default, one StaticCache. Every round measures, in this order, each timed
from outside as ``per_token.py`` does ((T(1 + 64) - T(1)) / 64):
- ``bandwidth``: the machine's read bandwidth now (``floor.py``'s probe, 3 passes) and the floor it puts on a step;
- ``after_read``: kvlab's step right after that read of the weights' size;
- ``again``: kvlab's step again, back to back;
- ``genai``: onnxruntime-genai's step (same prompt ids);
- ``after_genai``: kvlab's step right after genai's;
- ``after_idle``: kvlab's step after 2 s asleep.
If kvlab's step depended on what ran before it, ``again`` would differ from the others within a round; if it drifts
with the machine, the columns move together from round to round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from floor import read_bandwidth, weight_bytes  # noqa: E402
from per_token import _genai_tokens, per_token_ms  # noqa: E402

from kvlab.ort import StaticCache, generate, load, open_device  # noqa: E402
from kvlab.ort.checks.references import genai_model  # noqa: E402

NEW = 64
KVLAB_COLUMNS = ("after_read", "again", "after_genai", "after_idle")


def main(out: str, cell: str = "smollm2:fp32", context: str = "256", rounds: str = "12") -> None:
    name, _, precision = cell.partition(":")
    model = load(name, precision=precision or "fp32")
    nbytes, cores = weight_bytes(Path(model.onnx_path).parent), len(os.sched_getaffinity(0))
    dev = open_device("cpu")
    peer = genai_model(model, dev.name)
    ids = np.random.default_rng(0).integers(0, model.info.vocab_size, int(context)).astype(np.int64)
    cache = StaticCache(int(context) + NEW + 1)
    tokens: dict[str, list[int]] = {}

    def kvlab_call(n: int) -> float:
        start = time.perf_counter()
        tokens["kvlab"] = generate(model, ids, cache=cache, device=dev, max_new_tokens=n, stop_on_eos=False).token_ids
        return time.perf_counter() - start

    def genai_call(n: int) -> float:
        start = time.perf_counter()
        tokens["genai"] = _genai_tokens(peer, ids, n)
        return time.perf_counter() - start

    def kvlab_ms() -> float:
        return per_token_ms(kvlab_call, NEW)

    rows, equal = [], True
    try:
        kvlab_ms(), per_token_ms(genai_call, NEW)  # warm-up
        start = time.time()
        for r in range(int(rounds)):
            row: dict[str, float] = {"t_s": round(time.time() - start, 1)}
            row["floor"] = nbytes / read_bandwidth(nbytes, cores, passes=3) * 1e3
            row["after_read"] = kvlab_ms()
            row["again"] = kvlab_ms()
            row["genai"] = per_token_ms(genai_call, NEW)
            row["after_genai"] = kvlab_ms()
            time.sleep(2)
            row["after_idle"] = kvlab_ms()
            equal = equal and tokens["kvlab"] == tokens["genai"]
            rows.append(row)
            print(f"round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    finally:
        cache.dispose()
    columns = ("floor", *KVLAB_COLUMNS, "genai")
    medians = {c: float(np.median([row[c] for row in rows])) for c in columns}
    kvlab_by_round = [float(np.median([row[c] for c in KVLAB_COLUMNS])) for row in rows]
    within = [max(row[c] for c in KVLAB_COLUMNS) - min(row[c] for c in KVLAB_COLUMNS) for row in rows]
    result = {
        "model": model.name,
        "precision": model.info.dtype_name,
        "context": int(context),
        "new_tokens": NEW,
        "device": str(dev.label),
        "tokens_equal": equal,
        "rows": rows,
        "medians_ms": medians,
        "kvlab_round_medians_range_ms": [min(kvlab_by_round), max(kvlab_by_round)],
        "kvlab_within_round_spread_ms_median": float(np.median(within)),
    }
    Path(out).write_text(json.dumps(result, indent=1))
    print(
        f"medians (ms a token): {', '.join(f'{c} {v:.1f}' for c, v in medians.items())}; kvlab's round medians "
        f"{min(kvlab_by_round):.1f}-{max(kvlab_by_round):.1f}, its spread within a round (median) "
        f"{result['kvlab_within_round_spread_ms_median']:.1f}; tokens equal: {equal}; {dev.label}",
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
