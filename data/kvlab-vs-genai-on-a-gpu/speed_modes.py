"""Is a run's decode speed fixed by the buffers it allocates? kvlab's static cache and onnxruntime-genai, run after
run in one process, each run's median decode step printed:

    python data/kvlab-vs-genai-on-a-gpu/speed_modes.py OUT.json [--runs 8] [--model phi4-kv] [--precision int4]
        [--device webgpu] [--context 1024] [--new-tokens 256]

Four blocks, in order: ``A_kept`` (one StaticCache kept over every run: the same KV buffers), ``B_fresh`` (a fresh
cache per run), ``G_genai`` (genai alone), then ``AG_kept`` / ``AG_genai`` (the kept cache and genai alternating).
If the kept cache always ran at one speed while fresh caches spread, the allocation would decide the speed; if
both spread alike, something outside the runs does (recorded: int4-1024-two-speeds.json beside this script).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kvlab.bench.plan import prompt_ids
from kvlab.bench.variants import GenaiPeer
from kvlab.ort import StaticCache, generate, load, open_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--model", default="phi4-kv")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--device", default="webgpu")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    model = load(args.model, precision=args.precision, progress=False)
    device = open_device(args.device)
    ids = prompt_ids(model, args.context)
    peer = GenaiPeer(model, args.device)
    length = len(ids) + args.new_tokens

    def kvlab_run(cache: StaticCache) -> float:
        g = generate(model, ids, cache=cache, device=device, max_new_tokens=args.new_tokens, stop_on_eos=False)
        return float(np.median([r.wall_ms for r in g.records[2:]]))  # the decode steps after the first

    def genai_run() -> float:
        return peer.run(ids, args.new_tokens).decode_ms

    with StaticCache(length) as warm:  # the first run of each pays for pipelines and pools
        kvlab_run(warm)
    genai_run()
    out: dict[str, list[float]] = {"A_kept": [], "B_fresh": [], "G_genai": [], "AG_kept": [], "AG_genai": []}
    with StaticCache(length) as kept:
        out["A_kept"] = [kvlab_run(kept) for _ in range(args.runs)]
        for _ in range(args.runs):
            with StaticCache(length) as fresh:
                out["B_fresh"].append(kvlab_run(fresh))
        out["G_genai"] = [genai_run() for _ in range(args.runs)]
        for _ in range(args.runs):
            out["AG_kept"].append(kvlab_run(kept))
            out["AG_genai"].append(genai_run())
    for name, ms in out.items():
        print(name, [round(x, 2) for x in ms], "median", round(float(np.median(ms)), 2))
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "median_step_ms_per_run": out}, f, indent=1)


if __name__ == "__main__":
    main()
