"""``kvlab profile --lockstep``: kvlab's static-cache decode step and onnxruntime-genai's, taken in turns, one step
each, in one loop.

Why: on a GPU, whole runs of either loop can sit at one speed or another for reasons outside both loops (measured on
an NVIDIA H200: runs of 4.4 or 6.5-8.3 ms a step, switching between runs). A ratio paired by round then compares two
runs that may sit at different speeds. Here every kvlab step is paired with the genai step taken right before or
after it (the order swapped every pair, so neither always goes first): whatever slows the machine for a while slows
both sides of a pair.

Both loops run as they do alone: kvlab's steps are ``generate()``'s (``Stepper.step`` on the last token, the token
chosen as ``token_on_device`` says, "auto" by default), genai's are ``generate_next_token`` and ``get_next_tokens``.
Each step is timed from the call to the token in hand (``time.perf_counter``, exact wall time of the call). Each
round starts both from their own prefill of the same prompt on the same device (not timed); the tokens are compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import ConfigError, check_flag, check_int
from ..core.generation import positions_needed
from ..ort import CapturedStaticCache, Model, StaticCache, Stepper, load, open_device
from ..ort.checks.references import genai_generator
from ..ort.decode.greedy import AUTO, reduction_for
from .plan import prompt_ids
from .variants import GenaiPeer


def lockstep(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    rounds: int = 3,
    token_on_device: bool | str = AUTO,
    graph_capture: bool = False,
    check_every: int = 1,
) -> dict[str, Any]:
    """``rounds`` rounds of kvlab's static cache and onnxruntime-genai decoding ``new_tokens`` tokens after the same
    ``context`` prompt tokens, one step each in turn.

    ``precision``: as ``load`` takes it, for a model given by name. ``graph_capture`` (WebGPU): both captured
    (kvlab's ``CapturedStaticCache`` on the built-in model built for capture, genai with ``enableGraphCapture``; the
    token on the host, as ``generate`` chooses for a captured cache). ``check_every``: the static cache's (how often
    it reads back its presents' buffer identities). Returns the pairs' ratios (kvlab step / genai step): their
    median, quartiles and share below 1 over every pair, each round's median, both sides' median steps, whether the
    tokens are equal, and what ran (model, device, adapter, runtime). ConfigError for a bad count or setting."""
    _check(device, context, new_tokens, rounds, token_on_device, graph_capture, check_every)
    model = load(model, precision=precision, graph_capture=graph_capture)
    dev = open_device(device)
    reduction = "" if graph_capture else reduction_for(token_on_device, model.info.vocab_size, dev)
    ids = prompt_ids(model, context)
    peer = GenaiPeer(model, device, graph_capture=True if graph_capture else None)
    make = CapturedStaticCache if graph_capture else StaticCache
    needed = positions_needed(len(ids), new_tokens)
    rounds_out = [
        _round(model, dev, peer, ids, new_tokens, reduction, make(needed, check_every)) for _ in range(rounds)
    ]
    return {
        "model": model.name,
        "weights": model.info.weights,
        "precision": model.info.dtype_name,  # the KV cache's
        "device": device,
        "adapter": str(dev.label.adapter),  # its name and whether hardware or software
        "runtime": dev.label.runtime,
        "context": context,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "graph_capture": graph_capture,
        "check_every": check_every,
        "token_on_device": bool(reduction),
        "greedy_reduction": reduction,
        "genai_version": peer.version,
        **_paired(rounds_out),
    }


def _check(
    device: str,
    context: int,
    new_tokens: int,
    rounds: int,
    token_on_device: bool | str,
    graph_capture: bool,
    check_every: int,
) -> None:
    counts = (("context", context, 1), ("new_tokens", new_tokens, 3), ("rounds", rounds, 1))
    for name, value, least in (*counts, ("check_every", check_every, 1)):
        check_int(value, name, least)
    check_flag("graph_capture", graph_capture)
    if graph_capture and device != "webgpu":
        raise ConfigError(f"graph_capture runs on webgpu, not on {device!r}")
    if graph_capture and not (token_on_device is False or token_on_device == AUTO):
        raise ConfigError(
            f"token_on_device={token_on_device!r}: a captured cache runs a session of its own, where the greedy "
            "graph cannot run; leave it 'auto' (the host chooses) or give False"
        )


def _paired(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairs of every round together: the ratios' median, quartiles and share below 1; per round its median
    ratio and both median steps."""
    ratios = np.concatenate([r["ratios"] for r in rounds])
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        "pairs": int(ratios.size),
        "ratio_median": float(median),
        "ratio_quartiles": [float(q1), float(q3)],
        "below_one": float(np.mean(ratios < 1.0)),
        "round_medians": [float(np.median(r["ratios"])) for r in rounds],
        "kvlab_step_ms": float(np.median(np.concatenate([r["kvlab_ms"] for r in rounds]))),
        "genai_step_ms": float(np.median(np.concatenate([r["genai_ms"] for r in rounds]))),
        "round_steps_ms": [[float(np.median(r["kvlab_ms"])), float(np.median(r["genai_ms"]))] for r in rounds],
        "tokens_equal": all(r["tokens_equal"] for r in rounds),
    }


def _round(
    model: Model, dev: Any, peer: GenaiPeer, ids: np.ndarray, new: int, reduction: str, cache: StaticCache
) -> dict[str, Any]:
    """One round on a new ``cache``: both prefill, then ``new - 1`` decode steps each, in turns; per pair the two
    step times (ms)."""
    gen = genai_generator(peer.model, ids, new)
    with cache, Stepper(model, cache, dev, cache.max_cache_len, token_on_device=reduction or False) as stepper:
        _, first = stepper.step(ids, logits_out="none")  # the prefill and the first token, as generate() makes them
        gen.generate_next_token()  # genai's first call samples its prefill's logits: no forward pass
        mine, theirs = [first.token], [int(gen.get_next_tokens()[0])]
        kvlab_ms, genai_ms = [], []

        def kvlab_step() -> None:
            start = time.perf_counter()
            _, record = stepper.step(np.array([mine[-1]], np.int64), logits_out="none")
            kvlab_ms.append((time.perf_counter() - start) * 1e3)
            mine.append(record.token)

        def genai_step() -> None:
            start = time.perf_counter()
            gen.generate_next_token()
            token = int(gen.get_next_tokens()[0])
            genai_ms.append((time.perf_counter() - start) * 1e3)
            theirs.append(token)

        turns: tuple[Callable[[], None], Callable[[], None]] = (kvlab_step, genai_step)
        for i in range(new - 1):
            for step in turns if i % 2 == 0 else turns[::-1]:
                step()
    kvlab, genai = np.array(kvlab_ms), np.array(genai_ms)
    return {"ratios": kvlab / genai, "kvlab_ms": kvlab, "genai_ms": genai, "tokens_equal": mine == theirs}


def summary(r: dict[str, Any]) -> str:
    """The result in a few lines, with its label."""
    token = f"the token on the device ({r['greedy_reduction']})" if r["token_on_device"] else "the token on the host"
    kind = "captured static cache vs genai captured" if r["graph_capture"] else "static cache vs genai"
    kind += f" (check_every={r['check_every']})"
    q1, q3 = r["ratio_quartiles"]
    rounds = ", ".join(f"x{m:.3f}" for m in r["round_medians"])
    return (
        f"kvlab/genai, {r['pairs']} step pairs taken in turns: x{r['ratio_median']:.3f} (quartiles x{q1:.3f}-"
        f"x{q3:.3f}; kvlab faster in {100 * r['below_one']:.0f}% of pairs); per round {rounds}\n"
        f"kvlab step {r['kvlab_step_ms']:.3f} ms, genai {r['genai_version']} step {r['genai_step_ms']:.3f} ms; "
        f"tokens equal: {r['tokens_equal']}\n"
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {r['device']} ({r['adapter']}, "
        f"{r['runtime']}); {kind}, {token}; context {r['context']}, {r['new_tokens']} new tokens x {r['rounds']} "
        "rounds)"
    )
