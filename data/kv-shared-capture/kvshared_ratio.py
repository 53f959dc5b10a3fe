"""kv-shared-toy on WebGPU: the uncaptured StaticCache vs CapturedStaticCache (its graph-capture build), paired and
interleaved, within the window (prompt + new tokens <= 16), then mobius's own static graph on the CPU EP beside
kvlab's StaticCache there. One JSON object to stdout and to ``--out``: median one-token step per cache, the
captured/uncaptured ratio, the tokens, the packages; a refusal is recorded with its message.

    python data/kv-shared-capture/kvshared_ratio.py --out OUT/kvshared.json [--reps 5]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import kvlab
from kvlab import DeviceError, StaticCache, generate
from kvlab.ort.decode.caches.captured import CapturedStaticCache
from kvlab.ort.runtime.backend import versions

PROMPT, NEW = [7, 81, 190, 33], 12  # 16 positions: the window


def steps(model, cache_type, reps):
    times, tokens = [], None
    for _ in range(reps):
        with cache_type(16) as cache:
            g = generate(
                model, PROMPT, cache=cache, device="webgpu", prefill_device="cpu", max_new_tokens=NEW, stop_on_eos=False
            )
        times += [r.run_ms for r in g.records[2:]]  # the capturing step (and the prefill) left out
        tokens = g.token_ids
    return float(np.median(times)), tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    model = kvlab.load("kv-shared-toy", graph_capture=True, progress=False)
    result = {"versions": versions(), "prompt": PROMPT, "new_tokens": NEW, "reps": args.reps}
    static_ms, static_tokens = steps(model, StaticCache, 1)  # warm-up, then paired rounds below
    rounds = []
    try:
        for _ in range(args.reps):
            s, static_tokens = steps(model, StaticCache, 1)
            c, captured_tokens = steps(model, CapturedStaticCache, 1)
            rounds.append((s, c))
        result.update(
            static_ms=float(np.median([s for s, _ in rounds])),
            captured_ms=float(np.median([c for _, c in rounds])),
            captured_over_static=float(np.median([c / s for s, c in rounds])),
            tokens_identical=captured_tokens == static_tokens,
            tokens=static_tokens,
        )
    except DeviceError as exc:
        result.update(capture_refused=str(exc), static_ms=static_ms, tokens=static_tokens)
    try:
        from kvlab.ort.checks.mobius_static import MobiusStatic, build_static

        plain = kvlab.load("kv-shared-toy", progress=False)
        run = MobiusStatic(build_static(plain, 64), "cpu")
        for _ in range(args.reps):
            mobius = run.generate(PROMPT, NEW)
        with StaticCache(16) as cache:
            g = generate(plain, PROMPT, cache=cache, device="cpu", max_new_tokens=NEW, stop_on_eos=False)
        result["cpu"] = {
            "mobius_static_ms": mobius.step_ms,
            "kvlab_static_ms": float(np.median([r.run_ms for r in g.records[1:]])),
            "tokens_identical": mobius.token_ids == g.token_ids,
        }
    except ImportError as exc:  # mobius is needed to build it once
        result["cpu"] = {"skipped": str(exc)}
    text = json.dumps(result, indent=1)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
