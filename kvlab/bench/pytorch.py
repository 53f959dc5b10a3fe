"""Benchmark the PyTorch decode paths on one device: eager DynamicCache, eager StaticCache, transformers'
``generate(cache_implementation="static")`` (with its auto-compile) and kvlab's GraphRunner (capture-only and
compiled step + graph). Random weights, batch 1. Writes one JSON per configuration.

    python -m kvlab.bench.pytorch --out OUT_DIR [--configs smollm2-135m:float16,llama-1b:bfloat16]
                                  [--prompt 512] [--new 256] [--modes ...] [--device cuda]

Each configuration runs in its own subprocess with inductor's caches disabled, so every compile is cold and
first-call latencies are honest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..pytorch.generate import sync
from .cuda import (
    allocator_requests,
    allocator_segments,
    copy_bandwidth,
    environment,
    kernel_profile,
    peak,
    peak_reset,
    set_inductor,
)

MODES = (
    "eager-dynamic",
    "eager-static",
    "graph-capture",
    "graph-compile",
    "hf-dynamic",
    "hf-static-compile",
    "graph-capture-fused",
    "graph-compile-fused",
    "graph-eager",
)
DEFAULT_MODES = MODES[:8]  # graph-*-fused rewrite the model, so they run last; graph-eager: a CPU plumbing check
DEFAULT_CONFIGS = "smollm2-135m:float16,smollm2-135m:bfloat16,llama-1b:bfloat16"


def run_config(
    shape: str,
    dtype: str,
    prompt_len: int,
    new: int,
    modes: list[str],
    device: str,
    repeats: int = 3,
    attention: str = "sdpa",
    compile_mode: str = "default",
    inductor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import torch

    from .. import pytorch as tb
    from ..core.generation import first_divergence
    from ..pytorch.generate import make_cache
    from ..pytorch.graphs import GraphRunner
    from ..pytorch.models import cache_kwarg

    dev = torch.device(device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = tb.random_model(shape, device=device, dtype=dtype)
    model.hf.generation_config.eos_token_id = None  # never stop early: every mode makes exactly `new` tokens
    info = {
        "shape": shape,
        "dtype": dtype,
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "batch": 1,
        "params": sum(p.numel() for p in model.hf.parameters()),
        "weight_bytes": sum(p.nbytes for p in model.hf.parameters()),
        "model_build_s": time.perf_counter() - t0,
        "fused_attention": attention,
        "compile_mode": compile_mode,
        "inductor": inductor or {},
    }
    set_inductor(inductor or {})
    L = prompt_len + new
    info["kv_bytes_per_token"] = model.bytes_per_token
    if dev.type == "cuda":
        bw = copy_bandwidth(dev)
        info["copy_bandwidth_GBps"] = bw / 1e9
        info["roofline_ms_per_token"] = (info["weight_bytes"] + L * model.bytes_per_token) / bw * 1e3
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.vocab_size, (prompt_len,), generator=gen).tolist()
    results: dict[str, Any] = {}
    reference: list[int] | None = None
    margins: list[float] = []

    def top2_margins(tokens: list[int]) -> list[float]:
        """Logit gap between the best and second-best token at each generated position (teacher-forced, one
        forward over prompt + tokens): near-ties (tiny gaps) are where rounding can flip a greedy choice."""
        x = torch.tensor([ids + tokens[:-1]], device=dev)
        with torch.inference_mode():
            logits = model.hf(input_ids=x, use_cache=False).logits[0, len(ids) - 1 :].float()  # [new, V]
        top = logits.topk(2, dim=-1).values
        return (top[:, 0] - top[:, 1]).tolist()

    def record(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        nonlocal reference
        if name not in modes:
            return
        print(f"[{shape} {dtype}] {name} ...", flush=True)
        try:
            sync(dev)
            peak_reset(dev)
            res = fn()
            res["peak_bytes"] = peak(dev)
            if reference is None and name == "eager-dynamic":
                reference = res["tokens"]
            if reference is not None:
                res["first_divergence_vs_eager_dynamic"] = first_divergence(res["tokens"], reference)
                res["tokens_equal_eager_dynamic"] = res["first_divergence_vs_eager_dynamic"] is None
                i = res["first_divergence_vs_eager_dynamic"]
                if i is not None and margins and i < len(margins):
                    res["eager_dynamic_top2_margin_at_divergence"] = margins[i]
            if "eager-static" in results and name != "eager-static":
                res["first_divergence_vs_eager_static"] = first_divergence(
                    res["tokens"], results["eager-static"]["tokens"]
                )
            if name == "eager-dynamic":
                margins[:] = top2_margins(res["tokens"])
                res["top2_margin"] = {
                    "min": min(margins),
                    "median": sorted(margins)[len(margins) // 2],
                    "steps_below_0.05": sum(m < 0.05 for m in margins),
                    "first_20": [round(m, 4) for m in margins[:20]],
                }
            results[name] = res
            print(
                f"[{shape} {dtype}] {name}: {res.get('ms_per_token'):.3f} ms/token, allocs/step "
                f"{res.get('alloc_requests_per_step')}, first call {res.get('first_call_s', float('nan')):.2f} s, "
                f"equal {res.get('tokens_equal_eager_dynamic')}",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - one failing mode must not lose the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            print(f"[{shape} {dtype}] {name} FAILED: {exc}", flush=True)

    def eager(cache: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            t = time.perf_counter()
            tb.generate(model, ids[:16], cache=cache, max_new_tokens=4, stop_on_eos=False)  # warm-up
            first = time.perf_counter() - t
            g = tb.generate(model, ids, cache=cache, max_new_tokens=new, stop_on_eos=False)
            f = g.frame()
            d = f[f.phase == "decode"]
            out = {
                "first_call_s": first,
                "ms_per_token": float(d.wall_ms.median()),
                "ms_per_token_mean": float(d.wall_ms.mean()),
                "tokens_per_s": 1e3 / float(d.wall_ms.median()),
                "prefill_ms": float(f.wall_ms.iloc[0]),
                "alloc_requests_per_step": float(d.alloc_requests.median()),
                "alloc_bytes_per_step": float(d.alloc_bytes.median()),
                "segments_decode_total": int(d.segments.sum()) if dev.type == "cuda" else None,
                "kv_tensors_created_per_step": float(d.cache_tensors_allocated.median()),
                "tokens": g.token_ids,
            }
            if cache == "static" and dev.type == "cuda":
                hf_cache = make_cache(model, "static", L)
                kw = cache_kwarg(model.hf)
                with torch.inference_mode():
                    model.hf(
                        input_ids=torch.tensor([ids], device=dev), use_cache=True, logits_to_keep=1, **{kw: hf_cache}
                    )
                    tok = torch.tensor([[ids[-1]]], device=dev)
                    out["profile"] = kernel_profile(
                        lambda: model.hf(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: hf_cache}), 10, dev
                    )
            return out

        return go

    def graph(mode: str, fuse: bool = False) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            t = time.perf_counter()
            runner = GraphRunner(
                model,
                L,
                mode=mode,
                fuse=fuse,
                keep_logits=not fuse,  # fused: the lean step
                attention=attention if fuse else "sdpa",
                compile_mode=compile_mode,
            )
            setup = time.perf_counter() - t
            tokens = runner.decode_greedy(ids, new)
            first = time.perf_counter() - t
            best = None
            for _ in range(repeats):
                sync(dev)
                runner.start(ids)
                sync(dev)
                a0, s0, t1 = allocator_requests(dev), allocator_segments(dev), time.perf_counter()
                for _ in range(new - 1):
                    runner.replay()
                sync(dev)
                dt = (time.perf_counter() - t1) / (new - 1)
                allocs = (allocator_requests(dev) - a0) / (new - 1) if dev.type == "cuda" else None
                segs = allocator_segments(dev) - s0 if dev.type == "cuda" else None
                lean = runner.history[len(ids) : len(ids) + new].tolist()
                if best is None or dt < best[0]:
                    best = (dt, allocs, segs, lean)
            g = runner.generate(ids, max_new_tokens=new, stop_on_eos=False)  # kvlab contract: per-step sync
            f = g.frame()
            d = f[f.phase == "decode"]
            out = {
                "setup_s": setup,
                **runner.setup_s,
                "fused": runner.fused,
                "first_call_s": first,
                "ms_per_token": best[0] * 1e3,
                "tokens_per_s": 1 / best[0],
                "alloc_requests_per_step": best[1],
                "segments_decode_total": best[2],
                "lean_tokens_equal_first_run": best[3] == tokens,
                "generate_api_ms_per_token": float(d.wall_ms.median()),
                "generate_api_alloc_requests_per_step": float(d.alloc_requests.median()),
                "generate_api_tokens_equal": g.token_ids == tokens,
                "tokens": tokens,
            }
            if reference is not None:
                out["teacher_forced"] = teacher_forced(runner, reference)
            if dev.type == "cuda":  # 20 replays from the prompt: well inside max_cache_len
                runner.prefill(ids)
                out["profile"] = kernel_profile(runner.replay, 20, dev)
            del runner
            return out

        return go

    def teacher_forced(runner: Any, ref: list[int]) -> dict[str, Any]:
        """Feed eager DynamicCache's tokens instead of the runner's own and compare each step's argmax with
        eager's next token: agreement per step, without one early flip changing everything after it."""
        logits = runner.prefill(ids)
        own = [int(logits.argmax())]
        for i in range(new - 1):
            runner.tok.fill_(ref[i])
            runner.replay()
            own.append(int(runner.history[len(ids) + i + 1]))  # this step's argmax (a host sync)
        differ = [i for i, (a, b) in enumerate(zip(own, ref)) if a != b]
        return {
            "steps": len(own),
            "agree": len(own) - len(differ),
            "differ_at": differ,
            "eager_top2_margin_at_differ": [round(margins[i], 4) for i in differ if i < len(margins)],
        }

    def hf_generate(static: bool) -> Callable[[], dict[str, Any]]:
        return lambda: hf_run(static)

    def hf_run(static: bool) -> dict[str, Any]:
        """transformers' own generate: default DynamicCache (eager), or cache_implementation="static" (auto-compile)."""
        x = torch.tensor([ids], device=dev)
        kwargs = dict(attention_mask=torch.ones_like(x), do_sample=False, pad_token_id=0, eos_token_id=None)
        if static:
            kwargs["cache_implementation"] = "static"

        def call(n: int) -> tuple[float, int, Any]:
            sync(dev)
            a, t = allocator_requests(dev), time.perf_counter()
            with torch.inference_mode():
                o = model.hf.generate(x, max_new_tokens=n, min_new_tokens=n, **kwargs)
            sync(dev)
            return time.perf_counter() - t, allocator_requests(dev) - a, o

        first, _, o = call(new)
        full = [call(new) for _ in range(repeats if static else 1)]
        one = [call(1) for _ in range(repeats if static else 1)]
        tf, af, o = min(full, key=lambda r: r[0])
        t1, a1, _ = min(one, key=lambda r: r[0])
        per = (tf - t1) / (new - 1)
        return {
            "first_call_s": first,
            "ms_per_token": per * 1e3,
            "tokens_per_s": 1 / per,
            "total_s_best": tf,
            "one_token_s_best": t1,
            "alloc_requests_per_step": (af - a1) / (new - 1),
            "tokens": o[0, len(ids) :].tolist(),
        }

    record("eager-dynamic", eager("dynamic"))
    record("eager-static", eager("static"))
    record("graph-capture", graph("capture"))
    record("graph-compile", graph("compile"))
    record("hf-dynamic", hf_generate(False))
    record("hf-static-compile", hf_generate(True))
    record("graph-capture-fused", graph("capture", fuse=True))
    record("graph-compile-fused", graph("compile", fuse=True))
    record("graph-eager", graph("eager"))
    return {"config": info, "results": results, "environment": environment()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvlab.bench.pytorch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON files")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated shape:dtype list")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {MODES}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix for the JSON file names")
    ap.add_argument(
        "--attention", default="sdpa", help="decode attention of the fused graph modes (kvlab.pytorch.fuse.ATTENTIONS)"
    )
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of graph-compile*")
    ap.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a torch._inductor.config entry for this run, e.g. coordinate_descent_tuning=True",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one config in this process
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; choose from {MODES}")
    bad = [kv for kv in a.inductor if "=" not in kv]
    if bad:
        ap.error(f"--inductor takes KEY=VALUE, got {bad}")
    inductor = {k: _literal(v) for k, v in (kv.split("=", 1) for kv in a.inductor)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.one:
        shape, dtype = a.one.split(":")
        res = run_config(
            shape, dtype, a.prompt, a.new, modes, a.device, a.repeats, a.attention, a.compile_mode, inductor
        )
        res["command"] = " ".join([Path(sys.executable).name, "-m", "kvlab.bench.pytorch", *sys.argv[1:]])
        (out / f"{shape}_{dtype}{a.tag}.json").write_text(json.dumps(res, indent=1))
        return 0
    rc = 0
    for config in a.configs.split(","):
        if config.count(":") != 1:
            ap.error(f"config {config!r} must be shape:dtype, e.g. smollm2-135m:float16")
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}  # cold compiles: honest first calls
        cmd = [
            sys.executable,
            "-m",
            "kvlab.bench.pytorch",
            "--one",
            config,
            "--out",
            str(out),
            "--prompt",
            str(a.prompt),
            "--new",
            str(a.new),
            "--modes",
            a.modes,
            "--device",
            a.device,
            "--repeats",
            str(a.repeats),
            "--tag",
            a.tag,
            "--attention",
            a.attention,
            "--compile-mode",
            a.compile_mode,
            *(f"--inductor={kv}" for kv in a.inductor),
        ]
        rc |= subprocess.run(cmd, env=env).returncode
    summary = summarize(out)
    print(summary)
    (out / "summary.md").write_text(summary)
    return rc


def _literal(text: str) -> Any:
    """A Python literal (True, 3, 'x') where the text is one, else the text itself."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def summarize(out: Path) -> str:
    """A markdown table of every JSON in ``out``."""
    lines = [
        "| file | mode | ms/token | tokens/s | allocs/step | first call s | peak MiB | first divergence from "
        "eager | teacher-forced agreement |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in sorted(out.glob("*.json")):
        for mode, r in json.loads(f.read_text())["results"].items():
            if "error" in r:
                lines.append(f"| {f.stem} | {mode} | error: {r['error'][:60]} | | | | | | |")
                continue
            tf = r.get("teacher_forced")
            agree = f"{tf['agree']}/{tf['steps']}" if tf else "-"
            lines.append(
                f"| {f.stem} | {mode} | {r['ms_per_token']:.3f} | {r['tokens_per_s']:.0f} "
                f"| {_num(r['alloc_requests_per_step'])} | {r.get('first_call_s', float('nan')):.2f} | "
                f"{_num(r['peak_bytes'] / 2**20 if r['peak_bytes'] >= 0 else None)} | "
                f"{r.get('first_divergence_vs_eager_dynamic', '-')} | "
                f"{agree} |"
            )
    return "\n".join(lines)


def _num(x: Any) -> str:
    return "-" if x is None or x == -1 else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())
