"""The ``kvlab`` command: doctor, generate, compare, bench, profile. Errors exit non-zero with the message on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .caches import check_max_cache_len, make_cache
from .errors import ConfigError, KvlabError
from .generate import Generation, Sampling, generate
from .models import BUILTIN_NAMES, load
from .runtime import BUFFER_CACHE_MODES, DEVICES, open_device

DEFAULT_PROMPT = "Explain in two sentences why a language model keeps a cache of keys and values."


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="toy", help=f"built-in name ({', '.join(BUILTIN_NAMES)}) or a model directory")
    p.add_argument("--device", default="cpu", choices=DEVICES)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from a file")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    _cpu_flags(p)
    p.add_argument("--buffer-cache-mode", choices=BUFFER_CACHE_MODES, help="WebGPU storage buffer cache mode")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def _cpu_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="CPU EP intra-op threads (default: ORT's, one per physical core)")
    p.add_argument("--no-spinning", action="store_true", help="CPU EP pool threads sleep instead of spinning")
    p.add_argument("--no-huge-pages", action="store_true", help="leave the CPU sessions' weights in 4 KiB pages "
                   "(default: collapsed into 2 MiB transparent huge pages, see kvlab.memory)")


def _cpu_options(args: argparse.Namespace) -> dict[str, Any]:
    """open_device keyword arguments for --threads / --no-spinning / --no-huge-pages (only those given)."""
    options: dict[str, Any] = {}
    if args.threads is not None:
        options["threads"] = args.threads
    if args.no_spinning:
        options["spinning"] = False
    if args.no_huge_pages:
        options["huge_pages"] = False
    return options


def _open_cpu(args: argparse.Namespace) -> None:
    options = _cpu_options(args)
    if options:
        open_device("cpu", **options)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvlab", description="See and measure KV caches in LLM decoding.")
    sub = ap.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="what kvlab found: versions, backend, adapters, a tiny run per device")
    doc.add_argument("--json", action="store_true")
    gen = sub.add_parser("generate", help="generate text with one cache")
    _shared(gen)
    gen.add_argument("--cache", choices=("dynamic", "static"), default="static")
    gen.add_argument("--max-cache-len", type=int, help="static cache size (default: what the run needs, rounded "
                                                       "up to a multiple of 256)")
    cmp_ = sub.add_parser("compare", help="run the dynamic and the static cache on one prompt, side by side")
    _shared(cmp_)
    cmp_.add_argument("--max-cache-len", type=int, help="static cache size (default as for generate)")
    b = sub.add_parser("bench", help="paired decode benchmarks: caches, onnxruntime-genai, memory roofline")
    b.add_argument("--quick", action="store_true", help="a small smoke run (toy model, CPU and WebGPU)")
    b.add_argument("--models", help="comma-separated models (default: smollm2 on cpu, kv-heavy on webgpu)")
    b.add_argument("--devices", help="comma-separated devices, crossed with --models")
    b.add_argument("--contexts", help="comma-separated prefill lengths (all devices)")
    b.add_argument("--new-tokens", type=int, help="new tokens per run (all devices)")
    b.add_argument("--max-cache-lens", help="comma-separated static cache sizes (a size that fits is always added)")
    b.add_argument("--reps", type=int, help="paired repetitions after the warm-up")
    b.add_argument("--buffer-cache-modes", help=f"comma-separated WebGPU modes from {BUFFER_CACHE_MODES}")
    b.add_argument("--no-genai", action="store_true", help="skip the onnxruntime-genai peer row")
    b.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="output directory")
    b.add_argument("--no-charts", action="store_true")
    _cpu_flags(b)
    pr = sub.add_parser("profile", help="where a static-cache decode step's time goes, by ONNX operator type "
                                        "(ONNX Runtime's own profiler)")
    pr.add_argument("--model", default="toy", help=f"built-in name ({', '.join(BUILTIN_NAMES)}) or a model directory")
    pr.add_argument("--device", default="cpu", choices=DEVICES)
    pr.add_argument("--context", type=int, default=256, help="prefill length before the profiled decode steps")
    pr.add_argument("--new-tokens", type=int, default=16, help="tokens decoded (the first decode step is skipped)")
    pr.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    _cpu_flags(pr)
    return ap


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r} must be comma-separated positive ints") from exc
    if any(v <= 0 for v in values):
        raise ConfigError(f"{flag} {text!r} must be comma-separated positive ints")
    return values


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    plan = bench.Plan.quick() if args.quick else bench.Plan()
    if args.models or args.devices:
        models = (args.models or ",".join(sorted({m for m, _ in plan.targets}))).split(",")
        devices = (args.devices or "cpu").split(",")
        bad = [d for d in devices if d not in DEVICES]
        if bad:
            raise ConfigError(f"--devices {bad[0]!r} is not valid; choose from {DEVICES}")
        plan.targets = [(m, d) for m in models for d in devices]
    if args.contexts:
        plan.contexts = {d: _ints(args.contexts, "--contexts") for d in DEVICES}
    if args.new_tokens is not None:
        plan.new_tokens = {d: _ints(str(args.new_tokens), "--new-tokens")[0] for d in DEVICES}
    if args.max_cache_lens:
        plan.static_lens = _ints(args.max_cache_lens, "--max-cache-lens")
    if args.reps is not None:
        plan.reps = _ints(str(args.reps), "--reps")[0]
    if args.buffer_cache_modes:
        plan.buffer_cache_modes = args.buffer_cache_modes.split(",")
    plan.genai = plan.genai and not args.no_genai
    _open_cpu(args)
    result = bench.run_plan(plan)
    files = bench.write(result, args.out, charts=not args.no_charts)
    print("\n" + bench.report(result))
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def _profile(args: argparse.Namespace) -> int:
    from . import bench

    context = _ints(str(args.context), "--context")[0]
    new_tokens = _ints(str(args.new_tokens), "--new-tokens")[0]
    rows = bench.op_profile(args.model, args.device, context, new_tokens, **_cpu_options(args))
    lines = [["op", "ms/step", "nodes/step", "share"]] + [
        [r["op"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_step']:g}", f"{100 * r['share']:.1f}%"] for r in rows]
    widths = [max(len(row[i]) for row in lines) for i in range(4)]
    print("\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                    for row in lines))
    print(f"({args.model} on {args.device}, static cache, context {context}; ONNX Runtime's profiler, which adds "
          f"a little to every node; mean of {new_tokens - 2} decode runs)")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            import csv

            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text()
        except OSError as exc:
            raise ConfigError(f"--prompt-file {str(args.prompt_file)!r}: {exc.strerror}") from exc
    return DEFAULT_PROMPT if args.prompt is None else args.prompt


def default_max_cache_len(needed: int, context_length: int) -> int:
    return min(context_length, -(-needed // 256) * 256)


def _runs(args: argparse.Namespace, kinds: Sequence[str]) -> dict[str, Any]:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    _open_cpu(args)
    device = open_device(args.device, buffer_cache_mode=args.buffer_cache_mode)
    model = load(args.model, progress=not args.json)
    ids = model.encode(_prompt(args), chat=args.chat)
    needed = len(ids) + args.max_new_tokens - 1
    size = (check_max_cache_len(args.max_cache_len) if args.max_cache_len is not None
            else default_max_cache_len(needed, model.info.context_length))
    sampling = Sampling(do_sample=args.sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed)
    memory = str(make_cache("static", size).memory_report(model.info)) if "static" in kinds else ""
    runs: dict[str, Generation] = {}
    for kind in kinds:
        with make_cache(kind, size if kind == "static" else None) as cache:
            runs[kind] = generate(model, ids, cache=cache, device=device, max_new_tokens=args.max_new_tokens,
                                  sampling=sampling, stop_on_eos=not args.ignore_eos)
    return {"model": model.name, "device": device.label, "dtype": model.info.dtype_name,
            "prompt_tokens": len(ids), "max_cache_len": size, "static_memory": memory, "runs": runs}


def _summary(g: Generation) -> dict[str, Any]:
    dec = [r for r in g.records if r.phase == "decode"]
    edge = max(1, min(3, len(dec) // 2))
    median = lambda rs, key: float(np.median([getattr(r, key) for r in rs])) if rs else float("nan")  # noqa: E731
    return {
        "cache": g.cache, "new_tokens": len(g.token_ids),
        "tokens_per_s": 1e3 / median(dec, "wall_ms") if dec else float("nan"),
        "first_steps_ms": median(dec[:edge], "wall_ms"), "last_steps_ms": median(dec[-edge:], "wall_ms"),
        "tensors_per_step": median(dec, "cache_tensors_allocated"),
        "bytes_per_step": median(dec, "cache_bytes_allocated"),
        "new_buffers_per_step": median(dec, "new_buffers"),
        "overhead_ms": median(dec, "overhead_ms"),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = ["cache", "tok/s", "first ms", "last ms", "tensors/step", "MiB/step", "new bufs/step", "py ms/step"]
    lines = [head]
    for r in rows:
        lines.append([r["cache"], f"{r['tokens_per_s']:.1f}", f"{r['first_steps_ms']:.1f}", f"{r['last_steps_ms']:.1f}",
                      f"{r['tensors_per_step']:g}", f"{r['bytes_per_step'] / 2**20:.3f}",
                      f"{r['new_buffers_per_step']:g}", f"{r['overhead_ms']:.2f}"])
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in lines)


def _emit(result: dict[str, Any], as_json: bool) -> None:
    runs: dict[str, Generation] = result["runs"]
    if as_json:
        out = {k: v for k, v in result.items() if k != "runs"}
        out["runs"] = {k: {**g.to_dict(), "summary": _summary(g)} for k, g in runs.items()}
        if len(runs) == 2:
            out["identical"] = _identical(runs)
        json.dump(out, sys.stdout, indent=1, default=float)
        print()
        return
    print(f"model {result['model']} ({result['dtype']}), device {result['device']}, prompt {result['prompt_tokens']} "
          f"tokens, static max_cache_len {result['max_cache_len']}")
    if result["static_memory"]:
        print(result["static_memory"])
    for kind, g in runs.items():
        print(f"\n[{g.cache}] {g.text!r}  ({len(g.token_ids)} tokens, stopped by {g.stop_reason})")
    print("\n" + _table([_summary(g) for g in runs.values()]))
    print("(decode steps only; medians; tensors/MiB per step are cache tensors the runtime allocated, exact; new "
          "bufs counts never-seen buffer identities, a proxy)")
    if len(runs) == 2:
        print(f"\noutputs identical: {_identical(runs)}")


def _identical(runs: dict[str, Generation]) -> bool:
    a, b = runs.values()
    return a.token_ids == b.token_ids


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "doctor":
            from .doctor import doctor

            return doctor(as_json=args.json)
        if args.command == "bench":
            return _bench(args)
        if args.command == "profile":
            return _profile(args)
        kinds = ("dynamic", "static") if args.command == "compare" else (args.cache,)
        if args.command == "generate" and args.cache == "dynamic" and args.max_cache_len is not None:
            raise ConfigError("--max-cache-len applies to --cache static only")
        _emit(_runs(args, kinds), args.json)
        return 0
    except KvlabError as exc:
        print(f"kvlab: error: {exc}", file=sys.stderr)
        return 1

