"""``kvlab browser-bench``: the dynamic and static caches on onnxruntime-web's WebGPU in headless Chromium (or Node
with Dawn), written as ``kvlab bench`` writes its results. Every flag value is checked by the parser (a bad one:
one line, exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.devices import BUFFER_CACHE_MODES
from ..presets import PRECISIONS
from ..web.chromium import ADAPTERS
from ..web.job import DYNAMIC_IMPLS
from ..web.run import HOSTS
from .types import path_arg


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _positive_ints(text: str) -> list[int]:
    try:
        return [_positive_int(v) for v in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; give comma-separated positive ints") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def _caches(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        size = name.removeprefix("static@")
        if name not in ("dynamic", "static") and not (name.startswith("static@") and size.isdigit() and int(size)):
            raise argparse.ArgumentTypeError(f"cache {name!r} is not valid; choose dynamic, static or static@N")
    return names


def add_browser_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "browser-bench",
        help="the caches on onnxruntime-web's WebGPU in headless Chromium (or Node + Dawn), results.json like bench",
    )
    p.add_argument("--models", default="toy", help="comma-separated built-in models or model directories")
    p.add_argument("--precision", choices=PRECISIONS, help="precision of the built-in models (default fp32)")
    p.add_argument("--contexts", type=_positive_ints, default=[32], help="comma-separated prompt lengths (tokens)")
    p.add_argument("--new-tokens", type=_positive_int, default=16, help="new tokens per run")
    p.add_argument(
        "--caches",
        type=_caches,
        default=["dynamic", "static"],
        help="comma-separated: dynamic, static (sized to fit each context), static@N",
    )
    p.add_argument("--reps", type=_positive_int, default=2, help="measured rounds per page (after one warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="measure from the first round (shader compilation in it)")
    p.add_argument("--host", choices=HOSTS, default="chromium", help="chromium, or node (Dawn in Node: not a browser)")
    p.add_argument(
        "--adapter",
        choices=ADAPTERS,
        default="auto",
        help="swiftshader, the host's default, or auto: SwiftShader when no hardware Vulkan driver is installed",
    )
    p.add_argument(
        "--dynamic-impl",
        choices=DYNAMIC_IMPLS,
        default="auto",
        help="who runs the dynamic cache: transformers.js (auto: where it can), or onnxruntime-web directly",
    )
    p.add_argument("--buffer-cache-mode", choices=BUFFER_CACHE_MODES, help="the WebGPU EP's storage buffer cache mode")
    p.add_argument(
        "--reference",
        choices=("cpu", "caches"),
        default="cpu",
        help="tokens compared with kvlab's CPU EP run (cpu) or between the page's caches",
    )
    p.add_argument("--timeout", type=_positive_float, default=600, help="seconds per page")
    p.add_argument("--out", type=path_arg, default=Path("artifacts/browser-bench"), help="output directory")
    p.add_argument("--no-charts", action="store_true")


def browser_bench_command(args: argparse.Namespace) -> int:
    from ..bench.results import write  # imported here: they load plotting and benchmark code
    from ..web.bench import browser_bench

    result = browser_bench(
        args.models.split(","),
        args.contexts,
        precision=args.precision,
        new_tokens=args.new_tokens,
        caches=args.caches,
        reps=args.reps,
        warmup=not args.no_warmup,
        host=args.host,
        adapter=args.adapter,
        dynamic_impl=args.dynamic_impl,
        buffer_cache_mode=args.buffer_cache_mode or "",
        reference=args.reference,
        timeout=args.timeout,
    )
    env = result["environment"]
    print(f"host: {env['host']}; adapter: {env['adapter']}; onnxruntime-web {env['backend_version']}")
    if env.get("transformers_js") and env["transformers_js"].get("error"):
        print(f"transformers.js: {env['transformers_js']['error']}")
    files = write(result, args.out, charts=not args.no_charts)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
