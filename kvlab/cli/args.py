"""The ``kvlab`` command's arguments: one parser, flags shared by the subcommands, and their conversion to options."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.devices import BUFFER_CACHE_MODES, DEVICES
from ..core.errors import ConfigError
from ..ort import open_device
from ..ort.runtime.options import VALIDATION_MODES
from ..presets import BUILTIN_NAMES, PRECISIONS
from .browser import add_browser_bench
from .chat import add_chat
from .types import path_arg


def _shared(p: argparse.ArgumentParser) -> None:
    _model_flags(p)
    p.add_argument("--device", default="cpu", choices=DEVICES)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=path_arg, help="read the prompt from a file")
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
    p.add_argument(
        "--token-on-device",
        action="store_true",
        help="keep the greedy token on the device (kvlab.ort.decode.greedy) instead of choosing it on the host",
    )
    p.add_argument(
        "--kv-precision",
        choices=("model", "int8", "int4"),
        default="model",
        help="KV held in the model's dtype (default) or packed int8 / int4 (the WebGPU plugin EP only: "
        "kvlab.ort.decode.caches.kv_precision; elsewhere refused, naming what runs it)",
    )
    p.add_argument(
        "--graph-capture",
        action="store_true",
        help="WebGPU graph capture of the decode step (a static "
        "cache on the model built for capture; compare adds it as a third row: static + graph)",
    )


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="toy", help=f"built-in name ({', '.join(BUILTIN_NAMES)}) or a model directory")
    _precision_flag(p)


def _precision_flag(p: argparse.ArgumentParser, several: bool = False) -> None:
    what = "comma-separated precisions" if several else "precision"
    p.add_argument(
        "--precisions" if several else "--precision",
        help=f"{what} of the built-in models: {', '.join(PRECISIONS)} (default fp32)",
    )


def _cpu_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=int, help="CPU EP intra-op threads (default: kvlab's, chosen by how busy the cores are)"
    )
    p.add_argument(
        "--spinning",
        action=argparse.BooleanOptionalAction,
        help="whether CPU EP pool threads spin while idle (default: on where the cores were idle when the device "
        "opened, off where other processes kept them busy)",
    )
    p.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="leave the CPU sessions' weights in 4 KiB pages "
        "(default: collapsed into 2 MiB transparent huge pages, see kvlab.ort.runtime.memory)",
    )


def cpu_options(args: argparse.Namespace) -> dict[str, Any]:
    """open_device keyword arguments for --threads / --[no-]spinning / --no-huge-pages (only those given)."""
    options: dict[str, Any] = {}
    if args.threads is not None:
        options["threads"] = args.threads
    if args.spinning is not None:
        options["spinning"] = args.spinning
    if args.no_huge_pages:
        options["huge_pages"] = False
    return options


def open_cpu(args: argparse.Namespace, devices: Iterable[str] = ("cpu",)) -> None:
    """Open the CPU EP with the CPU flags given; ConfigError when they are given but none of ``devices`` (the run's)
    is the CPU EP (they would change nothing)."""
    options = cpu_options(args)
    if options and "cpu" not in devices:
        raise ConfigError(
            f"--threads, --[no-]spinning and --no-huge-pages set the CPU EP; this run uses {', '.join(devices)}: "
            "drop them or run on --device cpu"
        )
    if options:
        open_device("cpu", **options)


def applies_only_with(given: dict[str, bool], needs: str, present: bool) -> None:
    """ConfigError naming the flags in ``given`` that were given (True) although ``needs`` is absent: flags that do
    nothing without it are refused, not ignored."""
    if not present and any(given.values()):
        flags = ", ".join(f for f, g in given.items() if g)
        raise ConfigError(f"{flags} applies only with {needs}")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (``kvlab: error: ...``, exit 2), not usage plus error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        where = "" if self.prog == "kvlab" else self.prog.removeprefix("kvlab ") + ": "
        self.exit(2, f"kvlab: error: {where}{message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """The ``kvlab`` parser: one subparser per subcommand, each added by its own function (in ``--help`` order)."""
    ap = _OneLineParser(prog="kvlab", description="See and measure KV caches in LLM decoding.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    subcommands = (_add_doctor, _add_generate, _add_compare, _add_bench, _add_trace, _add_conformance, _add_profile)
    for add in (*subcommands, add_browser_bench, add_chat):
        add(sub)
    return ap


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser("doctor", help="what kvlab found: versions, backend, adapters, a tiny run per device")
    doc.add_argument("--json", action="store_true")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="generate text with one cache")
    _shared(gen)
    gen.add_argument("--cache", choices=("dynamic", "static"), default="static")
    gen.add_argument(
        "--max-cache-len",
        type=int,
        help="static cache size (default: what the run needs, rounded up to a multiple of 256)",
    )


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cmp_ = sub.add_parser("compare", help="run the dynamic and the static cache on one prompt, side by side")
    _shared(cmp_)
    cmp_.add_argument("--max-cache-len", type=int, help="static cache size (default as for generate)")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="paired decode benchmarks: caches, onnxruntime-genai, memory roofline")
    b.add_argument("--quick", action="store_true", help="a small smoke run (toy model, CPU and WebGPU)")
    b.add_argument("--models", help="comma-separated models (default: smollm2 on cpu, kv-heavy on webgpu)")
    b.add_argument("--devices", help="comma-separated devices, crossed with --models")
    _precision_flag(b, several=True)
    b.add_argument("--contexts", help="comma-separated prefill lengths (all devices)")
    b.add_argument("--new-tokens", type=int, help="new tokens per run (all devices)")
    b.add_argument("--max-cache-lens", help="comma-separated static cache sizes (a size that fits is always added)")
    b.add_argument("--reps", type=int, help="paired repetitions after the warm-up")
    b.add_argument(
        "--check-every",
        help="comma-separated: static caches that read back all their presents' buffers every k steps (default: "
        "the cache's own, all at a binding's first run, then one a step)",
    )
    b.add_argument("--buffer-cache-modes", help=f"comma-separated WebGPU modes from {BUFFER_CACHE_MODES}")
    b.add_argument("--no-genai", action="store_true", help="skip the onnxruntime-genai peer row")
    b.add_argument(
        "--token-on-device",
        action=argparse.BooleanOptionalAction,
        help="each static cache also with the greedy token kept on the device (kvlab.ort.decode.greedy), "
        "beside its twin that chooses it on the host (default: on WebGPU, off on the CPU EP)",
    )
    b.add_argument(
        "--graph-capture",
        action="store_true",
        help="WebGPU rows also run kvlab's captured static cache "
        "and, where the genai peer runs on WebGPU, genai with graph capture (both on the model built "
        "for capture)",
    )
    b.add_argument(
        "--genai-on",
        help="comma-separated devices with the genai peer row (default: cpu; on WebGPU it prefills there itself)",
    )
    b.add_argument(
        "--prefill-on",
        choices=("cpu", "webgpu"),
        help="where WebGPU rows prefill, once per cache kind "
        "(default cpu, handed off; webgpu: on the GPU, handed off GPU to GPU)",
    )
    kv_help = "comma-separated packed KV precisions (int8, int4): each cache again with its KV packed, beside its twin"
    b.add_argument("--kv-precision", default="", metavar="PRECISIONS", help=kv_help + " (the WebGPU plugin EP only)")
    b.add_argument(
        "--under-load",
        type=int,
        metavar="N",
        help="instead: the CPU EP's static step against genai's, each quiet and with N CPU-bound processes "
        "competing (kvlab.bench.load; one --models entry, each --contexts, --reps rounds, --load-settings)",
    )
    b.add_argument(
        "--load-settings",
        help="with --under-load: comma-separated CPU EP settings (default: kvlab's; ort: ONNX Runtime's; "
        "spinning=off: ONNX Runtime's threads, not spinning; threads=1; default: default,ort)",
    )
    b.add_argument("--out", type=path_arg, default=Path("artifacts/bench"), help="output directory")
    b.add_argument("--no-charts", action="store_true")
    _cpu_flags(b)


def _add_trace(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser(
        "trace",
        help="one long generation per cache: every step recorded, with the GPU memory the "
        "process holds (NVML, on NVIDIA)",
    )
    _model_flags(tr)
    tr.add_argument("--device", default="webgpu", choices=DEVICES)
    tr.add_argument("--context", type=int, default=1024, help="prompt length before the traced decode steps")
    tr.add_argument("--steps", type=int, default=1000, help="decode steps per cache")
    tr.add_argument("--prefill-on", choices=DEVICES, help="prefill on this device and hand off (default: --device)")
    tr.add_argument("--out", type=path_arg, default=Path("artifacts/trace.json"))
    _cpu_flags(tr)


def _add_conformance(sub: argparse._SubParsersAction) -> None:
    co = sub.add_parser("conformance", help="a device's prefill and decode logits against the CPU EP, per model")
    co.add_argument("--models", default="toy", help="comma-separated built-in models or directories")
    _precision_flag(co, several=True)
    co.add_argument("--device", default="webgpu", choices=DEVICES)
    co.add_argument("--prompt-tokens", type=int, default=48)
    co.add_argument("--out", type=path_arg, help="also write the rows as JSON")


def _add_profile(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser(
        "profile",
        help="where a static-cache decode step's time goes, by ONNX operator type (ONNX Runtime's own profiler)",
    )
    _model_flags(pr)
    pr.add_argument("--device", default="cpu", choices=DEVICES)
    pr.add_argument("--context", type=int, default=256, help="prefill length before the profiled decode steps")
    pr.add_argument("--new-tokens", type=int, default=16, help="tokens decoded (the first decode step is skipped)")
    pr.add_argument("--csv", type=path_arg, help="also write the rows to this CSV file")
    pr.add_argument(
        "--phases",
        action="store_true",
        help="time the phases of kvlab's whole step (binding, run, read-back, commit, loop) instead, "
        "beside onnxruntime-genai's step in paired rounds",
    )
    _lockstep_flags(pr)
    pr.add_argument("--rounds", type=int, help="--phases, --lockstep: rounds of kvlab and genai (default 3)")
    pr.add_argument(
        "--check-every",
        type=int,
        help="--phases, --lockstep: the static cache reads back all its presents' buffers every k steps (default: "
        "the cache's own, one a step)",
    )
    pr.add_argument("--no-genai", action="store_true", help="--phases: kvlab's rounds only")
    pr.add_argument(
        "--token-on-device",
        action=argparse.BooleanOptionalAction,
        help="--phases, --lockstep: kvlab's steps keep the greedy token on the device (kvlab.ort.decode.greedy), or "
        "choose it on the host; default: as generate() does (token_on_device='auto': on a hardware WebGPU adapter, on "
        "the device)",
    )
    pr.add_argument(
        "--greedy-reduction",
        choices=("blocks", "single", "rows"),
        help="--phases, --lockstep: how the graph finds the largest logit: in blocks (--token-on-device's), one ArgMax "
        "over the vocabulary, or the row holding it and then within that row (default: what 'auto' picks)",
    )
    pr.add_argument("--json", type=path_arg, help="--phases, --lockstep: also write the result as JSON")
    _cpu_flags(pr)


def _lockstep_flags(pr: argparse.ArgumentParser) -> None:
    pr.add_argument(
        "--lockstep",
        action="store_true",
        help="kvlab's static-cache loop and onnxruntime-genai's taken in turns, blocks of steps, in one process: "
        "each ratio pairs two blocks run next to each other",
    )
    pr.add_argument(
        "--graph-capture",
        action="store_true",
        help="--lockstep: both captured (kvlab's CapturedStaticCache, genai with enableGraphCapture; WebGPU)",
    )
    pr.add_argument(
        "--block", type=int, help="--lockstep: steps each loop takes per turn, the first quarter left out (default 32)"
    )
    pr.add_argument(
        "--tokens-per-read",
        type=int,
        metavar="N",
        help="--lockstep: kvlab's greedy steps whose tokens stay on the device until read back together (default: as "
        "generate() does, 8 with the token on the device; 1 reads each step's)",
    )
    pr.add_argument(
        "--sides",
        help="--lockstep: the two loops, comma-separated (default kvlab,genai; kvlab,kvlab or genai,genai check that "
        "the turns favour neither side)",
    )
    pr.add_argument(
        "--under-load",
        type=int,
        metavar="N",
        help="--lockstep: every round also with N CPU-bound processes competing for the cores; each loop's "
        "loaded/quiet time per token and kvlab's slowdown over genai's",
    )
    pr.add_argument(
        "--buffer-cache-mode",
        choices=BUFFER_CACHE_MODES,
        help="--lockstep on webgpu: the WebGPU storage buffer cache mode both loops run in (default: bucket)",
    )
    pr.add_argument(
        "--validation-mode",
        choices=VALIDATION_MODES,
        help="--lockstep on webgpu: the WebGPU EP's validation mode both loops run in (default: each its own)",
    )


def ints(text: str, flag: str) -> list[int]:
    """The comma-separated positive ints of ``text``; ConfigError naming ``flag`` otherwise."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r} must be comma-separated positive ints") from exc
    if any(v <= 0 for v in values):
        raise ConfigError(f"{flag} {text!r} must be comma-separated positive ints")
    return values
