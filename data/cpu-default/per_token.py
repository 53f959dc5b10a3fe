"""kvlab's decode step against onnxruntime-genai's, timed from outside both: the wall time of whole calls (the CI
guard's loop, tests/test_guards.py, and this folder's recordings; was ``kvlab.bench.outside``).

One call is a whole generation from a fresh start (kvlab: ``generate`` with its defaults and a static cache; genai:
a new generator, its prefill, then its tokens). A side's time per token is ``(T(1 + new) - T(1)) / new``: two calls
that differ only in their decode steps, so the prefill, the setup and whatever either library records about itself
cancel out. The sides take turns within each round (the order swapped every round) and a round's ratio pairs the
two sides' figures of that round, so a machine that slows down for a while slows both sides of a pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvlab.core.errors import check_int
from kvlab.ort import Device, Model, StaticCache, generate, load, open_device
from kvlab.ort.checks.references import genai_generator, genai_model


def per_token_vs_genai(
    model: Model | str,
    context: int,
    new_tokens: int = 48,
    rounds: int = 5,
    device: str | Device = "cpu",
    seed: int = 0,
    **generate_kwargs: Any,
) -> dict[str, Any]:
    """``rounds`` paired rounds (after one warm-up round) of kvlab's and onnxruntime-genai's time per decode token,
    both timed from outside (module docstring), after the same ``context`` random prompt ids (``seed``), generating
    ``new_tokens`` greedy tokens each, on ``device`` (a name, or a ``Device``: e.g. a private CPU device with other
    settings). ``generate_kwargs`` go to kvlab's ``generate`` (its defaults otherwise; the
    cache is a ``StaticCache`` just large enough). Returns the per-round ms per token of each side, the per-round
    ratios (kvlab / genai), their median and quartiles, whether the tokens were equal in every call, and the device's
    label. Raises ConfigError for a bad count, ModelError when onnxruntime-genai is missing."""
    model = load(model)
    context = check_int(context, "context", 1, model.info.context_length - 2)
    new_tokens = check_int(new_tokens, "new_tokens", 1, model.info.context_length - context - 1)
    rounds = check_int(rounds, "rounds", 1)
    ids = np.random.default_rng(seed).integers(0, model.info.vocab_size, context).astype(np.int64)
    dev = open_device(device)
    peer = genai_model(model, dev.name)
    cache = StaticCache(context + new_tokens + 1)
    tokens: dict[str, list[int]] = {}

    def kvlab_call(n: int) -> float:
        start = time.perf_counter()
        g = generate(model, ids, cache=cache, device=dev, max_new_tokens=n, stop_on_eos=False, **generate_kwargs)
        tokens["kvlab"] = g.token_ids
        return time.perf_counter() - start

    def genai_call(n: int) -> float:
        start = time.perf_counter()
        tokens["genai"] = _genai_tokens(peer, ids, n)
        return time.perf_counter() - start

    sides: dict[str, Callable[[int], float]] = {"kvlab": kvlab_call, "genai": genai_call}
    ms: dict[str, list[float]] = {"kvlab": [], "genai": []}
    equal = True
    try:
        for r in range(rounds + 1):
            for name in ("kvlab", "genai") if r % 2 else ("genai", "kvlab"):
                per_token = per_token_ms(sides[name], new_tokens)
                if r:  # round 0 warms both up (sessions, buffers, caches of the CPU)
                    ms[name].append(per_token)
            equal = equal and tokens["kvlab"] == tokens["genai"]
    finally:
        cache.dispose()
    ratios = [k / g for k, g in zip(ms["kvlab"], ms["genai"])]
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        "model": model.name,
        "precision": model.info.dtype_name,
        "context": context,
        "new_tokens": new_tokens,
        "device": str(dev.label),
        "settings": dev.label.settings,
        "ms_per_token": ms,
        "ratios": ratios,
        "ratio": float(median),
        "ratio_quartiles": (float(q1), float(q3)),
        "tokens_equal": equal,
    }


def per_token_ms(call: Callable[[int], float], new_tokens: int) -> float:
    """A side's time per decode token, timed from outside (module docstring): ``call(n)`` runs a whole generation of
    ``n`` tokens and returns its wall seconds; returns ``(T(1 + new_tokens) - T(1)) / new_tokens`` in ms."""
    one = call(1)
    return (call(1 + new_tokens) - one) * 1e3 / new_tokens


def _genai_tokens(og_model: Any, ids: np.ndarray, n: int) -> list[int]:
    """A whole onnxruntime-genai generation of ``n`` greedy tokens after ``ids`` (its generator made and prefilled
    here)."""
    gen, out = genai_generator(og_model, ids, n), []
    while len(out) < n:
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def summary(result: dict[str, Any]) -> str:
    """One line: the median ratio, its quartiles, both sides' median ms per token, what ran."""
    ms = {k: float(np.median(v)) for k, v in result["ms_per_token"].items()}
    q1, q3 = result["ratio_quartiles"]
    return (
        f"{result['model']} {result['precision']} at {result['context']} tokens: kvlab/genai x{result['ratio']:.2f} "
        f"(quartiles {q1:.2f}-{q3:.2f}, {len(result['ratios'])} rounds), {ms['kvlab']:.1f} vs {ms['genai']:.1f} ms "
        f"a token, timed from outside; tokens equal: {result['tokens_equal']}; {result['device']}"
    )
