"""Measured device memory against context, per architecture preset and precision, on WebGPU: the GPU memory the
driver accounts to this process (NVML, ``kvlab.ort.runtime.gpu_memory.GpuMemory``) beside kvlab's exact KV bytes
(its step records) and the bytes predicted from the model's config and from its graph's memory report.

    python data/memory-on-a-gpu/record_memory.py --out OUT [--presets toy,phi4-kv] [--precisions fp32,fp16]
        [--contexts 256,1024,4096,16384] [--new 16] [--budget-s 500]

Per preset and precision, contexts ascending, a StaticCache(context + new) and then a DynamicCache each run one
greedy generation of ``new`` tokens after a prompt of ``context`` tokens (real text, data/prompts/long.txt, repeated)
with kvlab's Stepper on WebGPU, the prompt fed in two steps: its first token (a StaticCache allocates every
buffer at its first step, so NVML then shows the cache with one token's activations), then the rest (the prefill, on
WebGPU too). NVML is read before the cache, once the Stepper's block is open, after each of those two steps, after
every decode step, and after the cache is released. A context the model cannot hold (context + new > its context
length) is replaced by the longest one it holds, and the row says so (``capped_from``). A packed KV precision
(int8 / int4) is tried once per model and its refusal recorded. ``results.json`` under ``--out`` is rewritten after
every row, so a run stopped by a time limit keeps what it measured; ``--budget-s``: start no new row after that.

NVML counts the whole process (weights, Dawn's buffer pools, the prefill's activations, kernels) in the driver's
allocation granularity; where there is no NVIDIA GPU or no pynvml its readings are None (the rest still runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import kvlab
from kvlab import DynamicCache, KvlabError, StaticCache, Stepper
from kvlab.lab.memory import config_bytes_per_token
from kvlab.ort.runtime.gpu_memory import GpuMemory
from kvlab.presets.recipes import checkpoint_dir, recipe

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "data" / "prompts" / "long.txt").read_text()
DEVICE: Any = "webgpu"  # or the Device opened with --buffer-cache-mode


def prompt_ids(model: kvlab.Model, n: int) -> list[int]:
    """``n`` token ids of real text (the prompt file, repeated)."""
    ids = model.encode(TEXT).tolist()
    return (ids * (n // len(ids) + 1))[:n]


def contexts_for(model: kvlab.Model, contexts: list[int], new: int) -> list[tuple[int, int | None]]:
    """(context, capped_from): the asked contexts that fit the model's context length with ``new`` tokens, then the
    longest that does in place of the first one that does not."""
    limit = model.info.context_length - new
    out: list[tuple[int, int | None]] = [(c, None) for c in contexts if c <= limit]
    dropped = [c for c in contexts if c > limit]
    if dropped and (not out or out[-1][0] < limit):
        out.append((limit, dropped[0]))
    return out


def run_cache(model: kvlab.Model, cache: Any, prompt: list[int], new: int, nvml: GpuMemory) -> dict[str, Any]:
    """One greedy generation through ``cache`` with NVML read around and inside it."""
    needed = len(prompt) + new
    before = nvml.read()
    records, decode_nvml = [], []
    with cache:
        with Stepper(model, cache, DEVICE, needed) as s:
            opened = nvml.read()
            _, rec = s.step(prompt[:1])  # a StaticCache allocates every buffer here, with one token's activations
            first = nvml.read()
            records.append(rec)
            _, rec = s.step(prompt[1:])  # the rest of the prefill
            records.append(rec)
            after_prefill = nvml.read()
            for _ in range(new - 1):
                _, rec = s.step([rec.token])
                records.append(rec)
                decode_nvml.append(nvml.read())
    after_close = nvml.read()
    decode = records[2:]
    report = cache.memory_report(model.info) if isinstance(cache, StaticCache) else None
    return {
        "positions": needed,
        "max_cache_len": cache.max_cache_len if isinstance(cache, StaticCache) else None,
        "nvml_before_bytes": before,
        "nvml_opened_bytes": opened,
        "nvml_first_step_bytes": first,
        "nvml_after_prefill_bytes": after_prefill,
        "nvml_decode_max_bytes": max(decode_nvml) if decode_nvml and decode_nvml[0] is not None else None,
        "nvml_decode_last_bytes": decode_nvml[-1] if decode_nvml else None,
        "nvml_after_close_bytes": after_close,
        "nvml_decode_bytes": decode_nvml,
        # kvlab's own, exact: what the cache's tensors hold and what each step allocated (requested sizes)
        "first_step_allocated_bytes": records[0].cache_bytes_allocated,
        "first_step_allocated_tensors": records[0].cache_tensors_allocated,
        "prefill_allocated_bytes": records[1].cache_bytes_allocated,
        "live_cache_bytes_after_prefill": records[1].live_cache_bytes,
        "live_cache_bytes_last": records[-1].live_cache_bytes,
        "used_cache_bytes_last": records[-1].used_cache_bytes,
        "decode_allocated_bytes_per_step": statistics.median(r.cache_bytes_allocated for r in decode),
        "decode_allocated_tensors_per_step": statistics.median(r.cache_tensors_allocated for r in decode),
        "decode_new_buffers_total": sum(r.new_buffers for r in decode),
        "memory_report_bytes": report.total_bytes if report else None,
        "prefill_ms": records[1].wall_ms,
        "step_ms_median": statistics.median(r.wall_ms for r in decode),
        "run_ms_median": statistics.median(r.run_ms for r in decode),
        "tokens": [r.token for r in records],
    }


def packed_kv_probe(model: kvlab.Model, prompt: list[int]) -> dict[str, str]:
    """A StaticCache with packed int8 / int4 KV, one short run: what happened (a refusal's message, or 'ran')."""
    out = {}
    for kv in ("int8", "int4"):
        try:
            with (
                StaticCache(len(prompt) + 4, kv_precision=kv) as cache,
                Stepper(model, cache, DEVICE, len(prompt) + 4) as s,
            ):
                _, rec = s.step(prompt)
                s.step([rec.token])
            out[kv] = "ran"
        except (KvlabError, RuntimeError) as exc:
            out[kv] = f"{type(exc).__name__}: {str(exc)[:240]}"
    return out


def describe_model(name: str, model: kvlab.Model) -> dict[str, Any]:
    info, layout = model.info, model.info.layout
    r = recipe(name)
    kinds: dict[str, int] = {}
    for layer in layout.layers:
        kinds[layer.kind.name] = kinds.get(layer.kind.name, 0) + 1
    config_path = checkpoint_dir(name) / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else None
    return {
        "preset": name,
        "recipe": type(r).__name__,
        "layer_kinds": kinds,
        "layout": str(layout),
        "layers": info.num_layers,
        "heads": info.num_heads,
        "kv_heads": info.num_kv_heads,
        "head_dim": info.head_dim,
        "vocab": info.vocab_size,
        "context_length": info.context_length,
        "dtype": info.dtype.name,
        "weights": info.weights,
        "graph_bytes_per_token": layout.bytes_per_token,
        "graph_fixed_bytes": layout.fixed_bytes,
        "config_bytes_per_token": config_bytes_per_token(config, info.dtype.itemsize) if config else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument(
        "--presets",
        default="toy,kv-heavy,phi4-kv,smollm2-shape,sliding-toy,gemma2-toy,mistral-toy,"
        "hybrid-toy,conv-toy,kv-shared-toy",
    )
    p.add_argument("--precisions", default="fp32,fp16")
    p.add_argument("--contexts", default="256,1024,4096,16384")
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--budget-s", type=float, default=float("inf"))
    p.add_argument("--caches", default="static,dynamic", help="which caches each context runs, in order")
    p.add_argument("--warm", type=int, default=64, help="the warm-up prompt's length (4 new tokens after it)")
    p.add_argument(
        "--buffer-cache-mode", default=None, help="WebGPU storage buffer pool: bucket (default), simple, ..."
    )
    args = p.parse_args()
    global DEVICE
    if args.buffer_cache_mode:
        DEVICE = kvlab.open_device("webgpu", buffer_cache_mode=args.buffer_cache_mode)
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    nvml = GpuMemory()
    from kvlab.bench.results import environment

    result: dict[str, Any] = {
        "args": vars(args),
        "device": "webgpu",
        "buffer_cache_mode": args.buffer_cache_mode or "default (bucket)",
        "nvml": nvml.describe(),
        "environment": environment({"note": "not measured by this script"}),
        "adapter": None,
        "models": [],
        "rows": [],
        "skipped": [],
        "complete": False,
    }

    def save() -> None:
        (out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")

    contexts = sorted(int(c) for c in args.contexts.split(","))
    for name in args.presets.split(","):
        for precision in args.precisions.split(","):
            if time.monotonic() - start > args.budget_s:
                result["skipped"].append({"preset": name, "precision": precision, "why": "time budget"})
                continue
            t0 = time.monotonic()
            try:
                model = kvlab.load(name, precision=precision, progress=False)
            except KvlabError as exc:
                result["skipped"].append(
                    {"preset": name, "precision": precision, "why": f"{type(exc).__name__}: {exc}"}
                )
                save()
                continue
            desc = {**describe_model(name, model), "precision": precision, "load_s": time.monotonic() - t0}
            if result["adapter"] is None:
                result["adapter"] = kvlab.open_device(DEVICE).adapter.name
            warm = prompt_ids(model, args.warm)
            try:
                for cache in (
                    StaticCache(args.warm + 4),
                    DynamicCache(),
                ):  # shaders compiled, sessions made: not measured
                    run_cache(model, cache, warm, 4, nvml)
            except KvlabError as exc:
                result["skipped"].append(
                    {"preset": name, "precision": precision, "why": f"{type(exc).__name__}: {exc}"}
                )
                save()
                continue
            desc["packed_kv"] = packed_kv_probe(model, warm[:8])
            desc["nvml_after_load_bytes"] = nvml.read()
            result["models"].append(desc)
            save()
            for context, capped in contexts_for(model, contexts, args.new):
                if time.monotonic() - start > args.budget_s:
                    result["skipped"].append(
                        {"preset": name, "precision": precision, "context": context, "why": "time budget"}
                    )
                    continue
                prompt = prompt_ids(model, context)
                pair = {}
                for kind in args.caches.split(","):
                    cache = StaticCache(context + args.new) if kind == "static" else DynamicCache()
                    base = {"preset": name, "precision": precision, "context": context, "capped_from": capped}
                    try:
                        row = {**base, "cache": kind, **run_cache(model, cache, prompt, args.new, nvml)}
                    except (KvlabError, RuntimeError) as exc:
                        result["skipped"].append({**base, "cache": kind, "why": f"{type(exc).__name__}: {exc}"})
                        continue
                    positions = row["positions"]
                    row["predicted_config_bytes"] = (
                        desc["config_bytes_per_token"] * positions if desc["config_bytes_per_token"] else None
                    )
                    row["predicted_graph_bytes"] = model.info.layout.report(positions).total_bytes
                    pair[kind] = row
                    result["rows"].append(row)
                    print(
                        f"{name} {precision} ctx {context} {kind}: nvml before {row['nvml_before_bytes']}, opened "
                        f"{row['nvml_opened_bytes']}, prefill {row['nvml_after_prefill_bytes']}, decode max "
                        f"{row['nvml_decode_max_bytes']}; exact live {row['live_cache_bytes_last']:,} B; step "
                        f"{row['step_ms_median']:.2f} ms",
                        flush=True,
                    )
                if len(pair) == 2:
                    equal = pair["static"]["tokens"] == pair["dynamic"]["tokens"]
                    pair["static"]["tokens_equal"] = pair["dynamic"]["tokens_equal"] = equal
                save()
            del model
    result["complete"] = not result["skipped"] or all(s["why"] != "time budget" for s in result["skipped"])
    result["seconds"] = time.monotonic() - start
    save()
    print(f"wrote {out / 'results.json'} ({len(result['rows'])} rows, {time.monotonic() - start:.0f} s)")
    sys.exit(0)


if __name__ == "__main__":
    main()
