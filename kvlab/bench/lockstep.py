"""``kvlab profile lockstep``: kvlab's static-cache decode loop and onnxruntime-genai's, taken in turns, a block of
steps each, in one process.

Why: on a GPU, whole runs of either loop can sit at one speed or another for reasons outside both loops, so a ratio
paired by round may compare two runs at different speeds. Here each block of one loop's steps is paired with the
other loop's block taken right before or after it (the order swapped every pair, so neither always goes first):
whatever slows the machine for a while slows both sides of a pair. The first quarter of each block is left out of
the pair's ratio: the first step after a switch carries the other loop's state on the shared device. With blocks of
one step every step is such a first step, so single-step turns misplace time between the loops even though two
loops of the same kind read alike: ``block=1`` is for that check, not for comparing kvlab with genai
(docs/benchmarks.md has the measurements).

Either side can be kvlab or genai: "kvlab" against "genai" is the measurement, "kvlab" against "kvlab" (two caches)
or "genai" against "genai" (two generators) checks that the pairing itself favours neither side.

Each loop runs as it does alone (``kvlab.bench.loops``): kvlab's steps are ``generate()``'s (``Stepper.step`` on the
last token, the token chosen as ``token_on_device`` says, "auto" by default; with the token on the device, bursts of
``tokens_per_read`` steps read back together, ``Stepper.decode``), genai's are ``generate_next_token`` and
``get_next_tokens``. Each step is timed from the call to the token in hand (``time.perf_counter``: exact wall time of
the call; a burst's steps share its time). Each round starts both from their own prefill of the same prompt on the
same device (not timed); the tokens are compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.cache import check_every_of, check_every_text
from ..core.errors import ConfigError, check_choice, check_flag, check_int
from ..core.generation import positions_needed
from ..core.labels import read_back_text
from ..ort import CapturedStaticCache, Model, StaticCache, load, open_device
from ..ort.decode.caches.captured import CAPTURED_REDUCTIONS
from ..ort.decode.greedy import AUTO, reduction_of, tokens_per_read_for
from ..ort.runtime.options import webgpu_options
from .loops import GenaiLoop, KvlabLoop
from .plan import prompt_ids
from .variants import GenaiPeer

SIDES = ("kvlab", "genai")


def prepare(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    token_on_device: bool | str = AUTO,
    graph_capture: bool = False,
    check_every: int | None = None,
    block: int = 32,
    sides: tuple[str, str] = SIDES,
    buffer_cache_mode: str | None = None,
    validation_mode: str | None = None,
    tokens_per_read: int | str = AUTO,
) -> tuple[dict[str, Any], Callable[..., dict[str, Any]]]:
    """The two loops of ``lockstep`` set up (the arguments as it takes them): (what runs and its settings, a function
    running one round, ``stat`` summarizing each block's steps, the median by default, into that round's pairs). The
    device and genai's model open here; each round makes fresh loops and disposes of them. ConfigError for a bad
    setting."""
    _check(device, (context, new_tokens, block), token_on_device, graph_capture, sides)
    check_every_of(check_every)
    model = load(model, precision=precision, graph_capture=graph_capture)
    dev = open_device(device, buffer_cache_mode=buffer_cache_mode, validation_mode=validation_mode)
    make = CapturedStaticCache if graph_capture else StaticCache
    reduction = _reduction(make, token_on_device, model, dev)
    per_read = tokens_per_read_for(tokens_per_read, reduction, make)
    ids, genai_options = prompt_ids(model, context), webgpu_options(buffer_cache_mode, validation_mode)
    peer = GenaiPeer(model, device, True if graph_capture else None, genai_options) if "genai" in sides else None
    needed = positions_needed(len(ids), new_tokens)

    def side(name: str) -> KvlabLoop | GenaiLoop:
        if name == "genai":
            return GenaiLoop(peer, ids, new_tokens)
        return KvlabLoop(model, dev, ids, reduction, make(needed, check_every), max(per_read, 1))

    def one(stat: Callable[..., Any] = np.median) -> dict[str, Any]:
        return _round(side(sides[0]), side(sides[1]), new_tokens - 1, block, stat)

    settings = {"context": context, "new_tokens": new_tokens, "sides": list(sides), "block": block}
    settings |= {"left_out_per_block": block // 4, "graph_capture": graph_capture, "check_every": check_every}
    return {**_what_ran(model, dev, reduction, peer), "tokens_per_read": per_read, **settings}, one


def lockstep(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    rounds: int = 3,
    **settings: Any,
) -> dict[str, Any]:
    """``rounds`` rounds of two decode loops (``sides``, each "kvlab" or "genai"; default kvlab's static cache and
    onnxruntime-genai) generating ``new_tokens`` tokens after the same ``context`` prompt tokens, ``block`` (32)
    steps each in turn. ``precision``: as ``load`` takes it, for a model given by name. ``settings`` (``prepare``'s):
    ``graph_capture`` (WebGPU): both captured (kvlab's ``CapturedStaticCache`` on the built-in model built for
    capture, genai with ``enableGraphCapture``; the token on the host, as ``generate`` chooses for a captured cache);
    ``check_every``: the static cache's (how often it reads back its presents' buffer identities);
    ``buffer_cache_mode``, ``validation_mode`` (WebGPU): both loops run in them (kvlab's device opened with them,
    DeviceError when it is open with others; genai's sessions given them), unset each its own default (genai: its
    genai_config.json's); ``token_on_device``, ``tokens_per_read``: kvlab's, as ``generate`` takes them.

    Returns the block pairs' ratios (first side / second side, each a median of its block's steps after the first
    quarter): their median, quartiles and share below 1, each round's median, both sides' median steps, every
    step's time, whether the tokens are equal, and what ran (model, device, adapter, runtime). ConfigError for a bad
    setting."""
    check_int(rounds, "rounds", 1)
    what, one = prepare(model, device, precision, context, new_tokens, **settings)
    return {**what, "rounds": rounds, **pair_rounds([one() for _ in range(rounds)])}


def _reduction(make: type[StaticCache], token_on_device: bool | str, model: Model, dev: Any) -> str:
    """The greedy graph's reduction kvlab's side runs ("" for the host): what the cache kind picks for "auto";
    ConfigError for one a captured step cannot run."""
    on_auto = isinstance(token_on_device, str) and token_on_device == AUTO
    reduction = make.auto_reduction(model.info.vocab_size, dev) if on_auto else reduction_of(token_on_device)
    if make is CapturedStaticCache and reduction not in ("", *CAPTURED_REDUCTIONS):
        raise ConfigError(
            f"token_on_device={reduction!r}: a captured step keeps the token on the device with "
            f"{' or '.join(map(repr, CAPTURED_REDUCTIONS))} (its ids stay int64), or chooses it on the host (False)"
        )
    return reduction


def _what_ran(model: Model, dev: Any, reduction: str, peer: GenaiPeer | None) -> dict[str, Any]:
    """The labels of a result: the model as built, the device, adapter and runtime, the token's path, genai's
    version."""
    return {
        "model": model.name,
        "weights": model.info.weights,
        "precision": model.info.dtype_name,  # the KV cache's
        "device": dev.name,
        "adapter": str(dev.label.adapter),  # its name and whether hardware or software
        "runtime": dev.label.runtime,
        "buffer_cache_mode": dev.label.buffer_cache_mode,  # kvlab's WebGPU device's (genai's too where asked for)
        "validation_mode": dev.label.validation_mode,  # kvlab's WebGPU device's
        "genai_options": peer.options if peer else {},  # WebGPU EP options genai ran with beyond its config's
        "token_on_device": bool(reduction),
        "greedy_reduction": reduction,
        "genai_version": peer.version if peer else "",
    }


def _check(
    device: str, counts: tuple[int, ...], token_on_device: bool | str, graph_capture: bool, sides: tuple[str, str]
) -> None:
    for name, value, least in zip(("context", "new_tokens", "block"), counts, (1, 3, 1)):
        check_int(value, name, least)
    check_flag("graph_capture", graph_capture)
    if not isinstance(sides, (tuple, list)) or len(sides) != 2:
        raise ConfigError(f"sides={sides!r} must be two of {SIDES}, e.g. ('kvlab', 'genai')")
    for s in sides:
        check_choice(s, SIDES, "sides: ")
    if graph_capture and device != "webgpu":
        raise ConfigError(f"graph_capture runs on webgpu, not on {device!r}")


def _round(
    a: KvlabLoop | GenaiLoop, b: KvlabLoop | GenaiLoop, steps: int, block: int, stat: Callable[..., Any] = np.median
) -> dict[str, Any]:
    """Both sides prefilled, then ``steps`` decode steps each, ``block`` at a time in turns; the ratio of each pair
    of blocks (``stat``, the median by default, of their steps after the first quarter)."""
    ratios = []
    with a, b:
        for pair, start in enumerate(range(0, steps, block)):
            n = min(block, steps - start)
            for side in (a, b) if pair % 2 == 0 else (b, a):
                side.steps(n)
            skip = n // 4
            ratios.append(stat(a.ms[start + skip : start + n]) / stat(b.ms[start + skip : start + n]))
    times = {"a_ms": a.ms, "b_ms": b.ms, "a_cpu_ms": a.cpu_ms, "b_cpu_ms": b.cpu_ms}
    return {"ratios": np.array(ratios), **times, "tokens_equal": a.tokens == b.tokens}


def pair_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairs of every round together: the ratios' median, quartiles and share below 1; per round its median
    ratio and both median steps; every step's time, and its calling thread's CPU time."""
    ratios = np.concatenate([r["ratios"] for r in rounds])
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        "pairs": int(ratios.size),
        "ratio_median": float(median),
        "ratio_quartiles": [float(q1), float(q3)],
        "below_one": float(np.mean(ratios < 1.0)),
        "round_medians": [float(np.median(r["ratios"])) for r in rounds],
        "first_step_ms": float(np.median(np.concatenate([r["a_ms"] for r in rounds]))),
        "second_step_ms": float(np.median(np.concatenate([r["b_ms"] for r in rounds]))),
        "round_steps_ms": [[float(np.median(r["a_ms"])), float(np.median(r["b_ms"]))] for r in rounds],
        "first_cpu_ms": float(np.median(np.concatenate([r["a_cpu_ms"] for r in rounds]))),
        "second_cpu_ms": float(np.median(np.concatenate([r["b_cpu_ms"] for r in rounds]))),
        "steps_ms": [[r["a_ms"], r["b_ms"]] for r in rounds],  # per round, each side's steps in order
        "steps_cpu_ms": [[r["a_cpu_ms"], r["b_cpu_ms"]] for r in rounds],  # the calling thread's CPU time
        "tokens_equal": all(r["tokens_equal"] for r in rounds),
    }


def summary(r: dict[str, Any]) -> str:
    """The result in a few lines, with its label."""
    a, b = r["sides"]
    token = f"the token on the device ({r['greedy_reduction']})" if r["token_on_device"] else "the token on the host"
    token += read_back_text(r["tokens_per_read"])
    cache = "captured static cache" if r["graph_capture"] else "static cache"
    peer = f"genai {r['genai_version']}" + (" captured" if r["graph_capture"] else "")
    names = {"kvlab": f"kvlab's {cache} ({check_every_text(r['check_every'])}, {token})", "genai": peer}
    q1, q3 = r["ratio_quartiles"]
    rounds = ", ".join(f"x{m:.3f}" for m in r["round_medians"])
    unit = "step pairs" if r["block"] == 1 else f"pairs of {r['block']}-step blocks"
    return (
        f"{a}/{b}, {r['pairs']} {unit} taken in turns: x{r['ratio_median']:.3f} (quartiles x{q1:.3f}-x{q3:.3f}; "
        f"{a} faster in {100 * r['below_one']:.0f}% of pairs); per round {rounds}\n"
        f"{a} step {r['first_step_ms']:.3f} ms, {b} step {r['second_step_ms']:.3f} ms (the calling thread's CPU time: "
        f"{a} {r['first_cpu_ms']:.3f} ms, {b} {r['second_cpu_ms']:.3f} ms); tokens equal: {r['tokens_equal']}\n"
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {r['device']} ({r['adapter']}, "
        f"{r['runtime']}{_mode(r)}); {' against '.join(names[s] for s in dict.fromkeys(r['sides']))}; context "
        f"{r['context']}, {r['new_tokens']} new tokens x {r['rounds']} rounds)"
    )


def _mode(r: dict[str, Any]) -> str:
    """ ", buffer cache mode M, validation mode V (genai: W)" where kvlab's device has WebGPU modes."""
    mode = f", buffer cache mode {r['buffer_cache_mode']}" if r["buffer_cache_mode"] else ""
    if r["validation_mode"]:
        genai = r["genai_options"].get("validationMode", "its config's")
        mode += f", validation mode {r['validation_mode']} (genai: {genai})"
    return mode
