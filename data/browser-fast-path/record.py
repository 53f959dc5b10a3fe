"""Record the browser fast path on this machine's GPU: onnxruntime-web's WebGPU code in Node with Dawn (as
``kvlab browser-bench --host node`` runs it), dynamic vs static vs captured, with the token on the GPU read back in
bursts, beside today's path (static, the token chosen by the page from the logits) and kvlab's native static step
(onnxruntime-webgpu from Python, the same GPU), at each context, paired and interleaved: every round runs every
context, and every context runs the browser page (its caches interleaved, after a warm-up round), the host-token
page and the native run, in that order. Writes results.json next to itself (or to --out) and prints one line per
context. ``--tiny`` is the same on the toy model, a 3-token context, one round, in headless Chromium (Node with Dawn
compiles its shaders on a software adapter for minutes a page; ``--tiny --host node`` runs it there too): a check
that the script runs, on SwiftShader, written to artifacts/ rather than here.

    python data/browser-fast-path/record.py [--tiny] [--out DIR] [--model phi4-kv --precision fp32]
        [--contexts 1024,2048,4096,8192] [--new-tokens 64] [--reps 3] [--adapter auto] [--host node]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import kvlab
from kvlab.bench.plan import prompt_ids
from kvlab.web.bench import browser_bench

HERE = Path(__file__).resolve().parent
SEED = {  # transformers.js #1745's published gain of its static cache, tokens/s over the dynamic cache's
    "model": "Phi-4-mini q4f16, an Intel iGPU (transformers.js #1745)",
    "static_over_dynamic": {"2048": 2.51, "4096": 3.71},  # +151% and +271% tokens/s
}


def native_static(model: Any, context: int, new_tokens: int) -> dict[str, Any]:
    """kvlab's native static step on this machine's WebGPU: the token on the device, read back in bursts (the
    default), a StaticCache sized to fit."""
    ids = prompt_ids(model, context)
    size = -(-(context + new_tokens) // 256) * 256
    g = kvlab.generate(
        model, ids, device="webgpu", cache=kvlab.StaticCache(size), max_new_tokens=new_tokens, stop_on_eos=False
    )
    return {"decode_ms": g.decode_ms(), "tokens": list(g.token_ids), "label": str(g.label.device)}


def browser(model: Any, context: int, new_tokens: int, args: argparse.Namespace, **options: Any) -> dict[str, Any]:
    """One page in Node with Dawn: browser_bench's result for one context, one measured round after a warm-up."""
    return browser_bench(
        [model],
        [context],
        new_tokens=new_tokens,
        host=args.host,
        adapter=args.adapter,
        reference="caches",
        reps=1,
        dynamic_impl="onnxruntime-web",
        on_line=lambda line: print("  " + line, flush=True),
        **options,
    )


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def paired(cells: list[dict[str, Any]], a: str, b: str) -> float | None:
    """The median over the rounds of variant a's decode step over variant b's, each round with itself."""
    return median([c["decode_ms"][a] / c["decode_ms"][b] for c in cells if a in c["decode_ms"] and b in c["decode_ms"]])


def summary(rounds: list[dict[str, Any]], contexts: list[int]) -> list[dict[str, Any]]:
    """Per context: each variant's median decode step over the rounds, the paired ratios (browser static over
    native static, captured over static, static over today's host-token static), tokens/s, tokens equal."""
    out = []
    for context in contexts:
        cells = [r for r in rounds if r["context"] == context]
        ms: dict[str, list[float]] = {}
        for cell in cells:
            for variant, value in cell["decode_ms"].items():
                ms.setdefault(variant, []).append(value)

        out.append(
            {
                "context": context,
                "decode_ms": {v: median(x) for v, x in ms.items()},
                "tokens_per_s": {v: 1000 / median(x) for v, x in ms.items()},
                "browser_static_over_native_static": paired(cells, "static", "native static"),
                "captured_over_static": paired(cells, "captured", "static"),
                "static_over_host_token_static": paired(cells, "static", "static, token on the host"),
                "static_over_dynamic_tokens_per_s": paired(cells, "dynamic", "static"),
                "tokens_equal": all(c["tokens_equal"] for c in cells),
                "refused": sorted({why for c in cells for why in c["refused"]}),
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="the toy model, one short context, one round (a check)")
    p.add_argument("--out", default="", help="folder for results.json (default: this folder; --tiny: artifacts/)")
    p.add_argument("--model", default="phi4-kv")
    p.add_argument("--precision", default="fp32", help="fp32: Dawn's Node bindings may lack shader-f16")
    p.add_argument("--contexts", default="1024,2048,4096,8192")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--adapter", default="auto", help="auto, default or swiftshader")
    p.add_argument("--host", default="", help="node (default) or chromium (--tiny's default)")
    p.add_argument("--no-native", action="store_true", help="no native row (a machine without kvlab's WebGPU EP)")
    args = p.parse_args()
    if args.tiny:
        args.model, args.precision, args.contexts, args.new_tokens, args.reps = "toy", "fp32", "3", 8, 1
    args.host = args.host or ("chromium" if args.tiny else "node")
    args.out = args.out or str(HERE.parents[1] / "artifacts" / HERE.name if args.tiny else HERE)
    contexts = [int(c) for c in args.contexts.split(",")]
    model = kvlab.load(args.model, precision=args.precision, graph_capture=True)  # one build for all three caches
    rounds, pages = [], []
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    for rep in range(args.reps):
        for context in contexts:
            print(f"round {rep + 1}/{args.reps}, context {context}", flush=True)
            fast = browser(model, context, args.new_tokens, args, caches=["dynamic", "static", "captured"])
            host = browser(model, context, args.new_tokens, args, caches=["static"], token_on_device=False)
            native = None if args.no_native else native_static(model, context, args.new_tokens)
            names = {"dynamic": "dynamic", "static": "static", "static graph": "captured"}
            decode_ms = {
                names[r["cache_kind"] + (" graph" if r["cache_variant"] else "")]: r["decode_ms"] for r in fast["rows"]
            }
            decode_ms["static, token on the host"] = host["rows"][0]["decode_ms"]
            if native is not None:
                decode_ms["native static"] = native["decode_ms"]
            tokens = [r["tokens"] for r in fast["rows"] + host["rows"]] + ([native["tokens"]] if native else [])
            rounds.append(
                {
                    "rep": rep,
                    "context": context,
                    "decode_ms": decode_ms,
                    "buffers_per_step": {
                        names[r["cache_kind"] + (" graph" if r["cache_variant"] else "")]: {
                            "gpu_buffers": r["gpu_buffers_per_step"],
                            "storage_buffers": r["storage_buffers_per_step"],
                            "staging_buffers": r["staging_buffers_per_step"],
                        }
                        for r in fast["rows"]
                    },
                    "tokens_equal": all(t == tokens[0] for t in tokens),
                    "refused": [r["why"] for r in fast["refused"]],
                    "native": native["label"] if native else None,
                }
            )
            pages.append({"rep": rep, "context": context, "fast": fast, "host": host})
            ms = f"native static {native['decode_ms']:.2f} ms/step; " if native else ""
            print(f"  {ms}tokens equal: {rounds[-1]['tokens_equal']}", flush=True)
    table = summary(rounds, contexts)
    for row in table:
        ms = ", ".join(f"{v} {x:.2f}" for v, x in row["decode_ms"].items())
        print(
            f"context {row['context']}: {ms} ms/step; browser static / native static "
            f"{row['browser_static_over_native_static']}; captured / static {row['captured_over_static']}"
        )
    result = {
        "environment": {**pages[0]["fast"]["environment"], "started": started, "native": rounds[0]["native"]},
        "plan": {
            "model": args.model,
            "precision": args.precision,
            "contexts": contexts,
            "host": args.host,
            "new_tokens": args.new_tokens,
            "reps": args.reps,
            "adapter": args.adapter,
            "tiny": args.tiny,
        },
        "seed": SEED,
        "summary": table,
        "rounds": rounds,
        "pages": pages,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
