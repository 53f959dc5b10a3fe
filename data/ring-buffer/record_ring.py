"""A sliding layer's ring buffer against a StaticCache that holds every position, measured: the exact cache bytes of
every step, the tokens and the step time, on the CPU EP of onnxruntime 1.31.1 (the package whose GroupQueryAttention
evicts inside the op; run it with the plugin environment's Python).

    .venv-plugin/bin/python data/ring-buffer/record_ring.py [--model sliding-toy] [--prompt 40] [--new 200] [--out FILE]

Both caches run the same greedy generation (one after the other, twice, alternating), each a fresh cache of
prompt + new positions. Per step: the cache length, ``used_cache_bytes`` (what the held tokens need) and
``live_cache_bytes`` (what the cache's tensors hold, as requested from the runtime), both exact. Writes one JSON
file with the environment.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import kvlab
from kvlab.bench.results import write_recording


def run(model: kvlab.Model, cache: kvlab.Cache, prompt: list[int], new: int) -> dict:
    """One greedy generation on ``cache`` (CPU EP): its tokens, per-step bytes and the median decode step."""
    with cache:
        g = kvlab.generate(model, prompt, cache=cache, device="cpu", max_new_tokens=new, stop_on_eos=False)
    decode = [r.wall_ms for r in g.records if r.phase == "decode"]
    return {
        "cache": str(cache.spec),
        "tokens": g.token_ids,
        "length": [r.position + r.n_tokens for r in g.records],
        "used_cache_bytes": [r.used_cache_bytes for r in g.records],
        "live_cache_bytes": [r.live_cache_bytes for r in g.records],
        "decode_ms_median": statistics.median(decode),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="sliding-toy")
    ap.add_argument("--prompt", type=int, default=40, help="prompt tokens (ids 5, 6, ...)")
    ap.add_argument("--new", type=int, default=200, help="new tokens")
    ap.add_argument("--out", type=Path, default=Path("ring.json"))
    args = ap.parse_args()
    model = kvlab.load(args.model)
    prompt, size = list(range(5, 5 + args.prompt)), args.prompt + args.new
    runs = {"static": [], "ring": []}
    for _ in range(2):  # alternating, so a drift of the machine shows in both
        runs["static"].append(run(model, kvlab.StaticCache(size), prompt, args.new))
        runs["ring"].append(run(model, kvlab.RingStaticCache(size), prompt, args.new))
    windows = {layer.kind.window for layer in model.info.layout.layers if hasattr(layer.kind, "window")}
    out = {
        "model": model.name,
        "windows": sorted(windows),
        "prompt_tokens": args.prompt,
        "new_tokens": args.new,
        "tokens_equal": all(r["tokens"] == runs["static"][0]["tokens"] for rs in runs.values() for r in rs),
        "static": runs["static"][0] | {"decode_ms_medians": [r["decode_ms_median"] for r in runs["static"]]},
        "ring": runs["ring"][0] | {"decode_ms_medians": [r["decode_ms_median"] for r in runs["ring"]]},
    }
    write_recording(args.out, out)
    for kind in ("static", "ring"):
        r = out[kind]
        print(
            f"{r['cache']}: {r['used_cache_bytes'][0]:,} -> {r['used_cache_bytes'][-1]:,} bytes used, "
            f"{r['live_cache_bytes'][-1]:,} held; decode step {r['decode_ms_medians']} ms"
        )
    print(f"tokens equal: {out['tokens_equal']}; wrote {args.out}")


if __name__ == "__main__":
    main()
