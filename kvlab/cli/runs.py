"""``kvlab generate`` and ``kvlab compare``: generations with each cache, as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from ..core.cache_layout import check_max_cache_len
from ..core.errors import ConfigError
from ..core.generation import Generation, Sampling, positions_needed
from ..core.labels import read_back_text
from ..ort import generate, load, make_cache, open_device
from ..ort.decode.caches.captured import CapturedStaticCache
from ..presets import BUILTIN_NAMES
from .args import open_cpu

DEFAULT_PROMPT = "Explain in two sentences why a language model keeps a cache of keys and values."


def prompt_text(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--prompt-file {str(args.prompt_file)!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--prompt-file {str(args.prompt_file)!r} is not UTF-8 text (byte {exc.start}: "
                f"{exc.object[exc.start : exc.start + 1]!r}); save it as UTF-8"
            ) from exc
    return DEFAULT_PROMPT if args.prompt is None else args.prompt


def default_max_cache_len(needed: int, context_length: int) -> int:
    return min(context_length, -(-needed // 256) * 256)


GRAPH = "static graph"  # the kind --graph-capture adds: a CapturedStaticCache on the model built for capture


def graph_kinds(args: argparse.Namespace, kinds: Sequence[str]) -> tuple[str, ...]:
    """The runs --graph-capture asks for: generate's static run becomes the captured one; compare adds it."""
    if args.device != "webgpu":
        raise ConfigError(
            f"--graph-capture records WebGPU command buffers; it needs --device webgpu, not {args.device}"
        )
    if args.command == "generate":
        if kinds != ("static",):
            raise ConfigError(
                "--graph-capture needs --cache static (a captured graph has fixed shapes; a dynamic "
                "cache's grow every step)"
            )
        return (GRAPH,)
    return (*kinds, GRAPH)


def _graph_model(args: argparse.Namespace, model: Any) -> Any:
    """The model a captured run uses: a built-in one's build for capture, or the directory given."""
    if args.model in BUILTIN_NAMES:
        return load(args.model, precision=args.precision, progress=not args.json, graph_capture=True)
    return model  # a directory: CapturedStaticCache says what it lacks, if anything


def run_kinds(args: argparse.Namespace, kinds: Sequence[str]) -> dict[str, Any]:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    open_cpu(args, [args.device])
    device = open_device(args.device, buffer_cache_mode=args.buffer_cache_mode)
    model = load(args.model, precision=args.precision, progress=not args.json)
    ids = model.encode(prompt_text(args), chat=args.chat)
    needed = positions_needed(len(ids), args.max_new_tokens)
    size = (
        check_max_cache_len(args.max_cache_len)
        if args.max_cache_len is not None
        else default_max_cache_len(needed, model.info.context_length)
    )
    sampling = Sampling(
        do_sample=args.sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    kv = None if args.kv_precision == "model" else args.kv_precision
    if kv and GRAPH in kinds:
        raise ConfigError(f"--kv-precision {kv} with --graph-capture: the captured cache holds the model's KV dtype")
    memory = str(make_cache("static", size, kv).memory_report(model.info)) if {"static", GRAPH} & set(kinds) else ""
    runs: dict[str, Generation] = {}
    for kind in kinds:
        if kind == GRAPH:
            cache, run_model = CapturedStaticCache(size), _graph_model(args, model)
        else:
            cache, run_model = make_cache(kind, size if kind == "static" else None, kv), model
        with cache:
            runs[kind] = generate(
                run_model,
                ids,
                cache=cache,
                device=device,
                max_new_tokens=args.max_new_tokens,
                sampling=sampling,
                stop_on_eos=not args.ignore_eos,
                token_on_device=False if kind == GRAPH else (args.token_on_device or "auto"),
            )
    return {
        "model": model.name,
        "device": device.label,
        "dtype": model.info.dtype_name,
        "prompt_tokens": len(ids),
        "max_cache_len": size,
        "static_memory": memory,
        "runs": runs,
    }


def _summary(g: Generation) -> dict[str, Any]:
    dec = [r for r in g.records if r.phase == "decode"]
    edge = max(1, min(3, len(dec) // 2))
    median = lambda rs, key: float(np.median([getattr(r, key) for r in rs])) if rs else float("nan")  # noqa: E731
    return {
        "cache": str(g.label.cache),
        "new_tokens": len(g.token_ids),
        "tokens_per_s": 1e3 / median(dec, "wall_ms") if dec else float("nan"),
        "first_steps_ms": median(dec[:edge], "wall_ms"),
        "last_steps_ms": median(dec[-edge:], "wall_ms"),
        "tensors_per_step": median(dec, "cache_tensors_allocated"),
        "bytes_per_step": median(dec, "cache_bytes_allocated"),
        "new_buffers_per_step": median(dec, "new_buffers"),
        "overhead_ms": median(dec, "overhead_ms"),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = ["cache", "tok/s", "first ms", "last ms", "tensors/step", "MiB/step", "new bufs/step", "py ms/step"]
    lines = [head]
    for r in rows:
        lines.append(
            [
                r["cache"],
                f"{r['tokens_per_s']:.1f}",
                f"{r['first_steps_ms']:.1f}",
                f"{r['last_steps_ms']:.1f}",
                f"{r['tensors_per_step']:g}",
                f"{r['bytes_per_step'] / 2**20:.3f}",
                f"{r['new_buffers_per_step']:g}",
                f"{r['overhead_ms']:.2f}",
            ]
        )
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in lines)


def emit(result: dict[str, Any], as_json: bool) -> None:
    runs: dict[str, Generation] = result["runs"]
    if as_json:
        out = {k: v for k, v in result.items() if k != "runs"}
        out["device"] = asdict(result["device"])
        out["runs"] = {k: {**g.to_dict(), "summary": _summary(g)} for k, g in runs.items()}
        if len(runs) >= 2:
            out["identical"] = _identical(runs)
        json.dump(out, sys.stdout, indent=1, default=float)
        print()
        return
    print(
        f"model {result['model']} ({result['dtype']}), device {result['device']}, prompt {result['prompt_tokens']} "
        f"tokens, static max_cache_len {result['max_cache_len']}"
    )
    if result["static_memory"]:
        print(result["static_memory"])
    for g in runs.values():
        where = "; the greedy token chosen on the device" if g.label.token_on_device else ""
        where += read_back_text(g.label.tokens_per_read)
        print(f"\n[{g.label.cache}] {g.text!r}  ({len(g.token_ids)} tokens, stopped by {g.stop_reason}{where})")
    print("\n" + _table([_summary(g) for g in runs.values()]))
    print(
        "(decode steps only; medians; tensors/MiB per step are cache tensors the runtime allocated, exact; new "
        "bufs counts never-seen buffer identities, a proxy)"
    )
    if len(runs) >= 2:
        print(f"\noutputs identical: {_identical(runs)}")


def _identical(runs: dict[str, Generation]) -> bool:
    first, *rest = runs.values()
    return all(g.token_ids == first.token_ids for g in rest)
