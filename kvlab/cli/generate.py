"""``kvlab generate`` (alias ``kvlab compare``): a generation with each cache given, as a table or as JSON. ``compare``
is the same command with ``--cache dynamic,static`` by default."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.frames import decode_median
from ..core.generation import Generation, positions_needed
from ..core.labels import read_back_text
from ..ort import CapturedStaticCache, generate, load, make_cache, open_device
from ..ort.decode.caches.captured import VARIANT, CaptureCost, capture_cost
from ..presets import BUILTIN_NAMES
from . import flags

DEFAULTS = {"generate": "static", "compare": "dynamic,static"}  # --cache, by the name the command was called


def add(sub: argparse._SubParsersAction) -> None:
    """The ``generate`` subcommand and its alias ``compare``."""
    p = sub.add_parser(
        "generate",
        aliases=["compare"],
        help="generate text with a cache; compare: the dynamic and the static cache side by side",
        description="Generate text with each cache given (--cache), side by side with their step figures; "
        "`kvlab compare` is this command with --cache dynamic,static.",
    )
    flags.model(p)
    flags.device(p)
    flags.device_options(p)
    flags.prompt(p)
    flags.counts(p, max_new_tokens=(32, "tokens to generate at most"))
    flags.caches(
        p,
        "static; compare: dynamic,static",
        "comma-separated: dynamic, static[@N] (N positions; default: what the run needs), graph[@N] (a captured "
        "WebGPU step)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    flags.sample(p)
    flags.token_on_device(p)
    p.add_argument(
        "--kv-precision",
        choices=("model", "int8", "int4"),
        default="model",
        help="KV in the model's dtype (default) or packed (the WebGPU plugin EP only)",
    )
    flags.json_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the caches asked for and print them (a table, or JSON with ``--json``); returns 0. ConfigError (and the
    other kvlab errors) for what the model, the device or the caches refuse."""
    names = args.cache or flags.cache_names(DEFAULTS[args.command])
    emit(generations(args, names), args.json)
    return 0


def generations(args: argparse.Namespace, names: list[tuple[str, int | None]]) -> dict[str, Any]:
    """One generation per cache of ``names`` (kind, size or None) on the same prompt and device: ``{"model",
    "device", "dtype", "prompt_tokens", "max_cache_len" (the first static cache's), "static_memory", "runs"}``,
    runs keyed by the cache as given on the command line. Every cache is disposed of before it returns."""
    keys = [kind + (f"@{size}" if size else "") for kind, size in names]
    if len(set(keys)) < len(keys):
        raise ConfigError(f"--cache {','.join(keys)} names a cache twice")
    kv = None if args.kv_precision == "model" else args.kv_precision
    if any(kind == "graph" for kind, _ in names):
        if args.device != "webgpu":
            raise ConfigError(
                f"--cache graph replays a captured WebGPU graph; it needs --device webgpu, not {args.device}"
            )
        if kv:
            raise ConfigError(f"--kv-precision {kv} with --cache graph: the captured cache holds the model's KV dtype")
    name, precision = flags.one_model(args.model, f"kvlab {args.command}")
    device = open_device(args.device, **flags.device_options_of(args))
    model = load(name, precision=precision, progress=not args.json)
    ids = model.encode(flags.prompt_of(args), chat=args.chat)
    needed = positions_needed(len(ids), args.max_new_tokens)
    fitted = min(model.info.context_length, -(-needed // 256) * 256)  # no size given: what the run needs, rounded up
    sizes = [size or fitted for _, size in names]
    for kind, size in names:  # a size the user gave, judged in the user's terms (the flag, not the class)
        if size is not None and size < needed <= model.info.context_length:
            raise ConfigError(
                f"--cache {kind}@{size} holds {size} positions; this run needs {needed} (a prompt of {len(ids)} "
                f"tokens and --max-new-tokens {args.max_new_tokens}): give {kind}@{needed} or more, or {kind} "
                "(sized to the run)"
            )
    statics = [s for (kind, _), s in zip(names, sizes) if kind != "dynamic"]
    memory = str(make_cache("static", statics[0], kv).memory_report(model.info)) if statics else ""
    sampling, token = flags.sampling_of(args), flags.WHERE[args.token_on_device]
    runs: dict[str, Generation] = {}
    for key, (kind, _), size in zip(keys, names, sizes):
        if kind == "graph":  # a built-in model's build for capture, or the directory given (the cache judges it)
            cache, run_model, tok = CapturedStaticCache(size), model, False
            if name in BUILTIN_NAMES:
                run_model = load(name, precision=precision, progress=not args.json, graph_capture=True)
        else:
            cache, run_model, tok = make_cache(kind, size if kind == "static" else None, kv), model, token
        with cache:
            runs[key] = generate(
                run_model,
                ids,
                cache=cache,
                device=device,
                max_new_tokens=args.max_new_tokens,
                sampling=sampling,
                stop_on_eos=not args.ignore_eos,
                token_on_device=tok,
            )
    return {
        "model": model.name,
        "device": device.label,
        "dtype": model.info.dtype_name,
        "prompt_tokens": len(ids),
        "max_cache_len": statics[0] if statics else fitted,
        "static_memory": memory,
        "runs": runs,
    }


def _summary(g: Generation) -> dict[str, Any]:
    dec = [r for r in g.records if r.phase == "decode"]
    edge = max(1, min(3, len(dec) // 2))
    return {
        "cache": str(g.label.cache),
        "new_tokens": len(g.token_ids),
        "tokens_per_s": 1e3 / decode_median(dec) if dec else float("nan"),
        "first_steps_ms": decode_median(dec[:edge]),
        "last_steps_ms": decode_median(dec[-edge:]),
        "tensors_per_step": decode_median(dec, "cache_tensors_allocated"),
        "bytes_per_step": decode_median(dec, "cache_bytes_allocated"),
        "new_buffers_per_step": decode_median(dec, "new_buffers"),
        "overhead_ms": decode_median(dec, "overhead_ms"),
    }


def table(rows: list[list[str]]) -> str:
    """``rows`` (the first a header) as aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    )


# the table of step figures: a column per (header, ``_summary``'s key, how its value is written)
COLUMNS = (
    ("cache", "cache", str),
    ("tok/s", "tokens_per_s", "{:.1f}".format),
    ("first ms", "first_steps_ms", "{:.1f}".format),
    ("last ms", "last_steps_ms", "{:.1f}".format),
    ("tensors/step", "tensors_per_step", "{:g}".format),
    ("MiB/step", "bytes_per_step", lambda n: f"{n / 2**20:.3f}"),
    ("new bufs/step", "new_buffers_per_step", "{:g}".format),
    ("py ms/step", "overhead_ms", "{:.2f}".format),
)


def emit(result: dict[str, Any], as_json: bool) -> None:
    """Print ``generations``' result: the label, each run's text and a table of their step figures (or JSON)."""
    runs: dict[str, Generation] = result["runs"]
    if as_json:
        out = {k: v for k, v in result.items() if k != "runs"}
        out["device"] = asdict(result["device"])
        out["runs"] = {k: {**g.to_dict(), "summary": _summary(g)} for k, g in runs.items()}
        for k, g in runs.items():
            if g.label.cache.variant.startswith(VARIANT):
                cost = _capture_cost(g, runs)
                out["runs"][k]["summary"]["capture"] = asdict(cost) if cost else None
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
    cells = [[write(_summary(g)[key]) for _, key, write in COLUMNS] for g in runs.values()]
    print("\n" + table([[head for head, _, _ in COLUMNS], *cells]))
    print(
        "(decode steps only; medians; tensors/MiB per step are cache tensors the runtime allocated, exact; new "
        "bufs counts never-seen buffer identities, a proxy)"
    )
    if len(runs) >= 2:
        print(f"\noutputs identical: {_identical(runs)}")
    for g in runs.values():
        if g.label.cache.variant.startswith(VARIANT):
            print(f"\n[{g.label.cache}] {_capture_cost(g, runs)}")


def _capture_cost(g: Generation, runs: dict[str, Generation]) -> CaptureCost | None:
    """A captured run's capture cost, against the median decode step of the run's plain static row (if any); None
    when it has too few decode steps to tell."""
    plain = [r for r in runs.values() if r.label.cache.kind == "static" and not r.label.cache.variant]
    steps = [r.wall_ms for r in plain[0].records if r.phase == "decode"] if plain else []
    try:
        return capture_cost(g.records, float(np.median(steps)) if steps else None)
    except ConfigError:
        return None


def _identical(runs: dict[str, Generation]) -> bool:
    first, *rest = runs.values()
    return all(g.token_ids == first.token_ids for g in rest)
