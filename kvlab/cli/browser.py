"""``kvlab browser-bench``: the dynamic and static caches on onnxruntime-web's WebGPU in headless Chromium (or Node
with Dawn), written as ``kvlab bench`` writes its results. Every flag value is checked by the parser (a bad one:
one line, exit 2); the rest of the runner's settings are ``kvlab.web.bench.browser_bench``'s keyword arguments."""

from __future__ import annotations

import argparse

from ..web.chromium import ADAPTERS
from ..web.run import HOSTS
from . import flags

# --set KEY=VALUE: browser_bench's keywords beyond the flags, and how each value is read
SETTINGS = {
    "timeout": flags.positive(float, "a number"),  # seconds per page (default 600)
    "warmup": flags.ON_OFF.__getitem__,  # a round before the measured ones (default on)
    "reference": flags.nonempty,  # tokens compared with kvlab's CPU EP run (cpu) or between the page's caches (caches)
    "dynamic_impl": flags.nonempty,  # who runs the dynamic cache: transformers.js where it can (auto), or ort-web
    "buffer_cache_mode": flags.nonempty,  # the page's WebGPU storage buffer cache mode
    "validation_mode": flags.nonempty,  # the page's WebGPU EP validation mode (default disabled, as native)
    "charts": flags.ON_OFF.__getitem__,  # not browser_bench's: whether the command draws its charts (default on)
}


def add(sub: argparse._SubParsersAction) -> None:
    """The ``browser-bench`` subcommand."""
    p = sub.add_parser(
        "browser-bench",
        help="the caches on onnxruntime-web's WebGPU in headless Chromium (or Node + Dawn), results.json like bench",
    )
    flags.model(p, several=True)
    p.add_argument("--contexts", type=flags.positive_ints, default=[32], help="comma-separated prompt lengths")
    flags.counts(p, new_tokens=(16, "new tokens per run"), reps=(2, "measured rounds per page, after a warm-up"))
    flags.caches(p, "dynamic,static", "comma-separated: dynamic, static (sized to fit each context), static@N")
    p.add_argument("--host", choices=HOSTS, default="chromium", help="chromium, or node (Dawn in Node: not a browser)")
    p.add_argument(
        "--adapter",
        choices=ADAPTERS,
        default="auto",
        help="swiftshader, the host's default, or auto: SwiftShader when no hardware Vulkan driver is installed",
    )
    flags.settings(p, "kvlab.web.bench.browser_bench", SETTINGS)
    flags.out(p, "artifacts/browser-bench", "output folder (default artifacts/browser-bench)", folder=True)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the pages, print where they ran and write the results; returns 0. ``--cache graph`` is the page's captured
    cache (every model then loaded as built for capture)."""
    from ..bench.results import write  # imported here: they load plotting and benchmark code
    from ..ort import load
    from ..web.bench import browser_bench

    names = args.cache or flags.cache_names("dynamic,static")
    captured = any(kind == "graph" for kind, _ in names)  # the page's "captured" cache needs the capture build
    settings = flags.key_values(args.set, "--set", SETTINGS)
    result = browser_bench(
        [load(name, precision=precision, graph_capture=captured) for name, precision in flags.model_names(args.models)],
        args.contexts,
        new_tokens=args.new_tokens,
        caches=[("captured" if kind == "graph" else kind) + (f"@{size}" if size else "") for kind, size in names],
        reps=args.reps,
        host=args.host,
        adapter=args.adapter,
        **{k: v for k, v in settings.items() if k != "charts"},
    )
    env = result["environment"]
    print(f"host: {env['host']}; adapter: {env['adapter']}; onnxruntime-web {env['backend_version']}")
    if env.get("transformers_js") and env["transformers_js"].get("error"):
        print(f"transformers.js: {env['transformers_js']['error']}")
    for r in result["refused"]:
        print(f"{r['model']} context {r['context']}: {r['cache']} refused: {r['why']}")
    files = write(result, args.out, charts=settings.get("charts", True))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
