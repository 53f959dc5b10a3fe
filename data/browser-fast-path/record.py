"""Record the browser fast path on this machine's GPU: onnxruntime-web's WebGPU code in Node with Dawn (as
``kvlab browser-bench --host node`` runs it), dynamic vs static vs captured, with the token on the GPU read back in
bursts, in kvlab's setting (the WebGPU EP's validation mode "disabled", Dawn made with skip_validation and
disable_robustness, as native ONNX Runtime makes its device then), beside the page's static step under the old
setting (onnxruntime-web's default validation mode "basic", Dawn validating every call) and kvlab's native static
step (onnxruntime-webgpu from Python, the same GPU, where it is installed), at each context, paired and interleaved:
every round runs every context, and every context runs the page (its caches interleaved, after a warm-up round),
the old-setting page, optionally the host-token page (``--host-token``: static, the token chosen by the page from
the logits) and the native run, in that order. Writes results.json next to itself (or to --out) after every round,
prints one line per context and a summary table at the end. ``--budget-s``: no round is started that would end
past that many seconds (judged by the longest round so far). ``--tiny`` is the same on the toy model, a 3-token
context, one round, in headless Chromium (Node with Dawn compiles its shaders on a software adapter for minutes a
page; ``--tiny --host node`` runs it there too): a check that the script runs, on SwiftShader, written to
artifacts/ rather than here.

    python data/browser-fast-path/record.py [--tiny] [--out DIR] [--model phi4-kv --precision fp32]
        [--contexts 1024,2048,4096,8192] [--new-tokens 64] [--reps 3] [--adapter auto] [--host node]
        [--host-token] [--no-native] [--budget-s S]
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


def native_available() -> bool:
    """Whether kvlab's native WebGPU runs here: onnxruntime-webgpu importable, with its WebGPU EP."""
    try:
        import onnxruntime
    except ImportError:
        return False
    return "WebGpuExecutionProvider" in onnxruntime.get_available_providers()


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


OLD = "static, old setting"  # the page's static step in onnxruntime-web's default validation, Dawn validating
HOST = "static, token on the host"
NATIVE = "native static"
NAMES = {"dynamic": "dynamic", "static": "static", "static graph": "captured"}


def summary(rounds: list[dict[str, Any]], contexts: list[int]) -> list[dict[str, Any]]:
    """Per context: each variant's median decode step over the rounds, the paired ratios (browser static over
    native static, in kvlab's setting and in the old one; static over the old setting's; captured over static;
    static over today's host-token static), tokens/s, tokens equal."""
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
                "rounds": len(cells),
                "decode_ms": {v: median(x) for v, x in ms.items()},
                "tokens_per_s": {v: 1000 / median(x) for v, x in ms.items()},
                "browser_static_over_native_static": paired(cells, "static", NATIVE),
                "old_setting_static_over_native_static": paired(cells, OLD, NATIVE),
                "static_over_old_setting_static": paired(cells, "static", OLD),
                "captured_over_static": paired(cells, "captured", "static"),
                "static_over_host_token_static": paired(cells, "static", HOST),
                "static_over_dynamic_tokens_per_s": paired(cells, "dynamic", "static"),
                "tokens_equal": all(c["tokens_equal"] for c in cells),
                "refused": sorted({why for c in cells for why in c["refused"]}),
            }
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a markdown table: ms a step per variant, then the paired ratios."""
    variants = list(dict.fromkeys(v for r in rows for v in r["decode_ms"]))
    ratios = {
        "static / native": "browser_static_over_native_static",
        "old / native": "old_setting_static_over_native_static",
        "static / old": "static_over_old_setting_static",
        "captured / static": "captured_over_static",
    }
    head = ["context", *variants, *ratios, "tokens equal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = [f"{r['decode_ms'][v]:.2f} ms" if v in r["decode_ms"] else "" for v in variants]
        xs = [f"x{r[k]:.2f}" if r[k] is not None else "" for k in ratios.values()]
        lines.append("| " + " | ".join([f"{r['context']:,}", *ms, *xs, str(r["tokens_equal"])]) + " |")
    return "\n".join(lines)


def row_names(page: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A page's rows by the recording's variant name."""
    return {NAMES[r["cache_kind"] + (" graph" if r["cache_variant"] else "")]: r for r in page["rows"]}


def one_context(model: Any, context: int, args: argparse.Namespace, native: bool, rep: int) -> tuple[dict, dict]:
    """One context of one round: the page in kvlab's setting, the old-setting page, the host-token page when asked,
    the native run when it runs here; returns the round's cell and the pages' results."""
    fast = browser(model, context, args.new_tokens, args, caches=["dynamic", "static", "captured"])
    old = browser(model, context, args.new_tokens, args, caches=["static"], validation_mode="basic")
    host = None
    if args.host_token:
        host = browser(model, context, args.new_tokens, args, caches=["static"], token_on_device=False)
    got = native_static(model, context, args.new_tokens) if native else None
    rows = row_names(fast)
    decode_ms = {name: r["decode_ms"] for name, r in rows.items()}
    decode_ms[OLD] = old["rows"][0]["decode_ms"]
    if host is not None:
        decode_ms[HOST] = host["rows"][0]["decode_ms"]
    if got is not None:
        decode_ms[NATIVE] = got["decode_ms"]
    pages = [fast, old] + ([host] if host else [])
    tokens = [r["tokens"] for p in pages for r in p["rows"]] + ([got["tokens"]] if got else [])
    cell = {
        "rep": rep,
        "context": context,
        "decode_ms": decode_ms,
        "buffers_per_step": {
            name: {
                "gpu_buffers": r["gpu_buffers_per_step"],
                "storage_buffers": r["storage_buffers_per_step"],
                "staging_buffers": r["staging_buffers_per_step"],
            }
            for name, r in {**rows, OLD: old["rows"][0]}.items()
        },
        "hosts": {"page": fast["environment"]["host"], OLD: old["environment"]["host"]},
        "dawn_validates": {"page": rows["static"]["dawn_validates"], OLD: old["rows"][0]["dawn_validates"]},
        "tokens_equal": all(t == tokens[0] for t in tokens),
        "refused": [r["why"] for r in fast["refused"]],
        "native": got["label"] if got else None,
    }
    return cell, {"rep": rep, "context": context, "fast": fast, "old": old, "host": host}


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
    p.add_argument("--host-token", action="store_true", help="also the page choosing the token from the logits")
    p.add_argument("--no-native", action="store_true", help="no native row (default: where onnxruntime-webgpu runs)")
    p.add_argument("--budget-s", type=float, default=0, help="start no round that would end past this (0: none)")
    args = p.parse_args()
    if args.tiny:
        args.model, args.precision, args.contexts, args.new_tokens, args.reps = "toy", "fp32", "3", 8, 1
    args.host = args.host or ("chromium" if args.tiny else "node")
    args.out = args.out or str(HERE.parents[1] / "artifacts" / HERE.name if args.tiny else HERE)
    contexts = [int(c) for c in args.contexts.split(",")]
    native = not args.no_native and native_available()
    print(f"native static row: {'on' if native else 'off (no onnxruntime-webgpu with its WebGPU EP here)'}")
    t0 = time.monotonic()
    model = kvlab.load(args.model, precision=args.precision, graph_capture=True)  # one build for all three caches
    rounds, pages, longest = [], [], 0.0
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rep in range(args.reps):
        elapsed = time.monotonic() - t0
        if rep and args.budget_s and elapsed + longest > args.budget_s:
            print(f"stopped after {rep} rounds: another ({longest:.0f} s) would end past --budget-s {args.budget_s:g}")
            break
        begun = time.monotonic()
        for context in contexts:
            print(f"round {rep + 1}/{args.reps}, context {context} [{time.monotonic() - t0:.0f} s]", flush=True)
            cell, page = one_context(model, context, args, native, rep)
            rounds.append(cell)
            pages.append(page)
            ms = f"native static {cell['decode_ms'][NATIVE]:.2f} ms/step; " if NATIVE in cell["decode_ms"] else ""
            ms += f"old setting {cell['decode_ms'][OLD]:.2f} ms/step; "
            print(f"  {ms}tokens equal: {cell['tokens_equal']}", flush=True)
        longest = max(longest, time.monotonic() - begun)
        write(out, args, contexts, started, rounds, pages, native)
    rows = summary(rounds, contexts)
    print(f"\n{args.model} {args.precision}, {args.new_tokens} new tokens, {len(rounds) // len(contexts)} rounds:")
    print(table(rows))
    print(f"wrote {out / 'results.json'} [{time.monotonic() - t0:.0f} s]")
    return 0


def write(
    out: Path, args: argparse.Namespace, contexts: list[int], started: str, rounds: list, pages: list, native: bool
) -> None:
    """results.json with the rounds so far (written after every round: a run stopped later keeps them)."""
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
            "host_token": args.host_token,
            "native": native,
            "setting": {"validation_mode": "disabled", "dawn": pages[0]["fast"]["rows"][0]["dawn_toggles"]},
            "old_setting": {"validation_mode": "basic", "dawn": ""},
        },
        "seed": SEED,
        "summary": summary(rounds, contexts),
        "rounds": rounds,
        "pages": pages,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
