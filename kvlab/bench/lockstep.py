"""``kvlab profile --lockstep``: kvlab's static-cache decode loop and onnxruntime-genai's, taken in turns, a block of
steps each, in one process.

Why: on a GPU, whole runs of either loop can sit at one speed or another for reasons outside both loops (measured on
an NVIDIA H200: runs of 4.4 or 6.5-8.3 ms a step, switching between runs). A ratio paired by round then compares two
runs that may sit at different speeds. Here each block of one loop's steps is paired with the other loop's block
taken right before or after it (the order swapped every pair, so neither always goes first): whatever slows the
machine for a while slows both sides of a pair. The first quarter of each block is left out of the pair's ratio:
the first step after a switch carries the other loop's state on the shared device (measured on the H200 at 16,384
tokens: kvlab's first step of a block 12.5 ms, its others 15.1; genai's first 21.0, its others 16.1). With blocks of
one step every step is such a first step, so single-step turns misplace time between the loops (there x0.63 against
x0.94 in blocks of 32) even though two loops of the same kind read x1.00: ``block=1`` is for that check, not for
comparing kvlab with genai.

Either side can be kvlab or genai: "kvlab" against "genai" is the measurement, "kvlab" against "kvlab" (two
caches) or "genai" against "genai" (two generators) checks that the pairing itself favours neither side (x1.00).
Under a competing load (``under_load``) every round runs quiet and loaded, and each loop's slowdown is compared with
the other's.

Each loop runs as it does alone (``kvlab.bench.loops``): kvlab's steps are ``generate()``'s (``Stepper.step`` on the
last token, the token chosen as ``token_on_device`` says, "auto" by default; with the token on the device, bursts of
``tokens_per_read`` steps read back together, ``Stepper.decode``), genai's are ``generate_next_token`` and
``get_next_tokens``. Each step is timed from the call to the token in hand (``time.perf_counter``: exact wall time of
the call; a burst's steps share its time). Each
round starts both from their own prefill of the same prompt on the same device (not timed); the tokens are compared.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
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
from .load import check_load, competing
from .loops import GenaiLoop, KvlabLoop
from .plan import prompt_ids
from .variants import GenaiPeer

SIDES = ("kvlab", "genai")


def lockstep(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    rounds: int = 3,
    token_on_device: bool | str = AUTO,
    graph_capture: bool = False,
    check_every: int | None = None,
    block: int = 32,
    sides: tuple[str, str] = SIDES,
    under_load: int | None = None,
    buffer_cache_mode: str | None = None,
    validation_mode: str | None = None,
    tokens_per_read: int | str = AUTO,
) -> dict[str, Any]:
    """``rounds`` rounds of two decode loops (``sides``, each "kvlab" or "genai"; default kvlab's static cache and
    onnxruntime-genai) generating ``new_tokens`` tokens after the same ``context`` prompt tokens, ``block`` steps each
    in turn. ``precision``: as ``load`` takes it, for a model given by name. ``graph_capture`` (WebGPU): both captured
    (kvlab's ``CapturedStaticCache`` on the built-in model built for capture, genai with ``enableGraphCapture``; the
    token on the host, as ``generate`` chooses for a captured cache). ``check_every``: the static cache's (how often it
    reads back its presents' buffer identities). Returns the block pairs' ratios (first side / second side, each a
    median of its block's steps after the first quarter): their median, quartiles and share below 1, each round's
    median, both sides' median steps, every step's time, whether the tokens are equal, and what ran (model, device,
    adapter, runtime). ``under_load`` N (1 to 4 per logical CPU): every round also runs with N CPU-bound processes
    competing for the cores (``kvlab.bench.load.competing``; quiet first in even rounds, loaded first in odd ones); the
    result then describes the quiet rounds and adds ``under_load``: the loaded rounds' pairs, and per round each side's
    loaded over quiet time per token and the first side's slowdown over the second's (below 1: the first slows down
    less); blocks are summarized by means in both conditions then (``_loaded_rounds`` says why). ``buffer_cache_mode``,
    ``validation_mode`` (WebGPU): both loops run in them (kvlab's device opened with them, DeviceError when it is open
    with others; genai's sessions given them); unset, each its own default (genai: its genai_config.json's).
    ``tokens_per_read``: kvlab's, as ``generate`` takes it. ConfigError for a bad setting."""
    _check(device, (context, new_tokens, rounds, block), token_on_device, graph_capture, sides)
    check_every_of(check_every)
    if under_load is not None:
        check_load(under_load, "under_load")
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

    settings = {"context": context, "new_tokens": new_tokens, "rounds": rounds, "sides": list(sides), "block": block}
    settings |= {"left_out_per_block": block // 4, "graph_capture": graph_capture, "check_every": check_every}
    paired = _paired([one() for _ in range(rounds)]) if under_load is None else _loaded_rounds(one, rounds, under_load)
    return {**_what_ran(model, dev, reduction, peer), "tokens_per_read": per_read, **settings, **paired}


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
    for name, value, least in zip(("context", "new_tokens", "rounds", "block"), counts, (1, 3, 1, 1)):
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


def _loaded_rounds(one: Callable[[], dict[str, Any]], rounds: int, n: int) -> dict[str, Any]:
    """``rounds`` rounds quiet and as many with ``n`` competing processes, the order alternating: the quiet pairs,
    and ``under_load`` (see ``lockstep``). Loaded, a step takes one of two times (its process has a core, or shares
    one with a competitor: measured on 2 cores, 44 or 82 ms where quiet is 42), and a median jumps between them, so
    both conditions are summarized by means: the time per token, which follows the share of the cores a loop got."""
    quiet, loaded = [], []
    for r in range(rounds):
        for busy in (False, True) if r % 2 == 0 else (True, False):
            with competing(n) if busy else nullcontext():
                (loaded if busy else quiet).append(one(np.mean))
    slowdown = {
        side: [float(np.mean(hot[key]) / np.mean(calm[key])) for calm, hot in zip(quiet, loaded)]
        for side, key in (("first", "a_ms"), ("second", "b_ms"))
    }
    relative = [a / b for a, b in zip(slowdown["first"], slowdown["second"])]
    return {
        **_paired(quiet),
        "under_load": {
            "processes": n,
            "first_slowdown": float(np.median(slowdown["first"])),
            "second_slowdown": float(np.median(slowdown["second"])),
            "relative_slowdown": float(np.median(relative)),  # below 1: the first side slows down less
            "rounds": {**slowdown, "relative": relative},
            **_paired(loaded),
        },
    }


def _paired(rounds: list[dict[str, Any]]) -> dict[str, Any]:
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
    token += read_back_text(r.get("tokens_per_read", 0))
    cache = "captured static cache" if r["graph_capture"] else "static cache"
    peer = f"genai {r['genai_version']}" + (" captured" if r["graph_capture"] else "")
    names = {"kvlab": f"kvlab's {cache} ({check_every_text(r['check_every'])}, {token})", "genai": peer}
    q1, q3 = r["ratio_quartiles"]
    rounds = ", ".join(f"x{m:.3f}" for m in r["round_medians"])
    unit = "step pairs" if r["block"] == 1 else f"pairs of {r['block']}-step blocks"
    loaded = _loaded_line(r["under_load"], a, b) if "under_load" in r else ""
    return (
        f"{a}/{b}, {r['pairs']} {unit} taken in turns: x{r['ratio_median']:.3f} (quartiles x{q1:.3f}-x{q3:.3f}; "
        f"{a} faster in {100 * r['below_one']:.0f}% of pairs); per round {rounds}\n"
        f"{a} step {r['first_step_ms']:.3f} ms, {b} step {r['second_step_ms']:.3f} ms{_cpu(r, a, b)}; tokens equal: "
        f"{r['tokens_equal']}\n"
        f"{loaded}"
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {r['device']} ({r['adapter']}, "
        f"{r['runtime']}{_mode(r)}); {' against '.join(names[s] for s in dict.fromkeys(r['sides']))}; context "
        f"{r['context']}, {r['new_tokens']} new tokens x {r['rounds']} rounds)"
    )


def _cpu(r: dict[str, Any], a: str, b: str) -> str:
    """ " (calling thread's CPU: ...)" where the result has it (older results do not)."""
    if "first_cpu_ms" not in r:
        return ""
    return f" (the calling thread's CPU time: {a} {r['first_cpu_ms']:.3f} ms, {b} {r['second_cpu_ms']:.3f} ms)"


def _mode(r: dict[str, Any]) -> str:
    """ ", buffer cache mode M" for WebGPU's mode, where the result names one (older results do not), and the
    validation modes of both loops, where it names kvlab's."""
    mode = f", buffer cache mode {r['buffer_cache_mode']}" if r.get("buffer_cache_mode") else ""
    if r.get("validation_mode"):
        genai = r.get("genai_options", {}).get("validationMode", "its config's")
        mode += f", validation mode {r['validation_mode']} (genai: {genai})"
    return mode


def _loaded_line(busy: dict[str, Any], a: str, b: str) -> str:
    """The summary's line about the loaded rounds (sides ``a`` and ``b``)."""
    rounds = ", ".join(f"x{x:.3f}" for x in busy["rounds"]["relative"])
    return (
        f"with {busy['processes']} competing processes: {a} x{busy['first_slowdown']:.3f} of its quiet time per token, "
        f"{b} x{busy['second_slowdown']:.3f}; {a}'s slowdown over {b}'s x{busy['relative_slowdown']:.3f} (rounds "
        f"{rounds}); {a}/{b} loaded x{busy['ratio_median']:.3f}\n"
    )
