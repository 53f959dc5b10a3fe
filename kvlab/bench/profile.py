"""``kvlab profile``'s two modes: where a static-cache decode step's time goes, by ONNX operator type from ONNX
Runtime's own profiler (``op_profile``), or phase by phase beside onnxruntime-genai's step on the same model, prompt
and device, in paired rounds of one process (``step_phases``).

``step_phases`` times each phase by wrapping the kvlab method that does it for the duration of a run (binding, ONNX
Runtime's copies of host inputs and its run, the in-place read-back, the commit, the choice of token); a wrapper adds
well under a microsecond to its phase. The step's wall time and ONNX Runtime's run time are the record's own
(exact); "rest of the step" is the step's wall time less the phases timed inside it (checks, slicing); "between
steps" is the token-to-token time less the step's wall time (the record, hooks, settling, the generation loop)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from ..core import generation
from ..core.errors import check_int
from ..core.records import StepRecord
from ..ort import Model, StaticCache, close_device, generate, load, open_device
from ..ort.decode.greedy import AUTO, reduction_for
from ..ort.runtime.session import Binding
from .plan import prompt_ids
from .variants import GenaiPeer


def op_profile(
    model: Model | str, device: str = "cpu", context: int = 256, new_tokens: int = 16, **device_options: Any
) -> list[dict[str, Any]]:
    """Where a static-cache decode step's time goes, by ONNX operator type, from ONNX Runtime's own profiler.

    Opens a profiled device of its own (the process's open device of that name is closed first: its caches must
    be disposed), prefills ``context`` tokens, decodes ``new_tokens`` and averages the decode runs after the
    first. Rows: each op type's kernel time per step, "(between nodes)" (the run's time outside every node:
    scheduling, thread hand-offs) and "(run)" (the whole run). Profiling itself adds a little to each node. On
    WebGPU a node's time is its CPU-side submission, not GPU execution. ConfigError for fewer than 3
    ``new_tokens``."""
    check_int(new_tokens, "new_tokens", 3, note=" (the prefill and the first decode run are not profiled)")
    model = load(model)
    close_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        dev = open_device(device, profile=os.path.join(tmp, "ort"), **device_options)
        try:
            with StaticCache(context + new_tokens) as cache:
                generate(
                    model,
                    prompt_ids(model, context),
                    cache=cache,
                    device=dev,
                    max_new_tokens=new_tokens,
                    stop_on_eos=False,
                )
        finally:
            close_device(device)
        # the one session the steps ran on: the model's graph, or its greedy graph (the token on the device)
        ran = [p for key, p in dev.profiles.items() if Path(key.split(" ")[0]).name.startswith(model.onnx_path.stem)]
        events = json.loads(Path(max(ran, key=lambda p: Path(p).stat().st_size)).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][2:]  # skip the prefill and the first decode
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(a <= e["ts"] <= b for a, b in spans):
            per_op.setdefault(e["args"]["op_name"], []).append(e["dur"])
    n, run_us = len(runs), sum(r["dur"] for r in runs) / len(runs)
    rows = [{"op": op, "ms_per_step": sum(d) / n / 1e3, "nodes_per_step": len(d) / n} for op, d in per_op.items()]
    rows.sort(key=lambda r: -r["ms_per_step"])
    inside = sum(r["ms_per_step"] for r in rows)
    rows += [
        {"op": "(between nodes)", "ms_per_step": run_us / 1e3 - inside, "nodes_per_step": 0.0},
        {"op": "(run)", "ms_per_step": run_us / 1e3, "nodes_per_step": sum(r["nodes_per_step"] for r in rows)},
    ]
    for r in rows:
        r["share"] = r["ms_per_step"] / (run_us / 1e3)
    return rows


IN_STEP = ("bind cache", "bind inputs", "runtime binds inputs", "ort run", "read back", "commit", "choose")
PHASES = IN_STEP + ("rest of the step", "between steps")


class _Phases:
    """Per-step seconds of each phase, closed by the step's record."""

    def __init__(self) -> None:
        self.open: dict[str, float] = dict.fromkeys(IN_STEP, 0.0)
        self.steps: list[dict[str, float]] = []
        self._last_record: float | None = None

    def timed(self, phase: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.open[phase] += time.perf_counter() - start

        return wrapper

    def run(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """Binding.run: ONNX Runtime's run (the result's own clock) and what follows it (reading back buffers); the
        runtime's copies of host inputs made while binding them (the result's ``bind_seconds``) are taken out of
        "bind inputs"."""

        def wrapper(binding: Binding, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = real(binding, *args, **kwargs)
            whole = time.perf_counter() - start
            self.open["ort run"] += result.seconds
            self.open["read back"] += whole - result.seconds
            self.open["runtime binds inputs"] += result.bind_seconds
            self.open["bind inputs"] -= result.bind_seconds
            return result

        return wrapper

    def record(self, rec: StepRecord) -> None:
        now = time.perf_counter()
        if rec.phase == "decode" and self._last_record is not None:
            wall = rec.wall_ms / 1e3
            self.steps.append({
                **self.open,
                "rest of the step": wall - sum(self.open.values()),
                "between steps": (now - self._last_record) - wall,
                "wall": wall,
                "token to token": now - self._last_record,
                "python": rec.overhead_ms / 1e3,
            })  # fmt: skip
        self._last_record = now
        self.open = dict.fromkeys(IN_STEP, 0.0)


@contextmanager
def _wrapped(p: _Phases) -> Iterator[None]:
    targets = [
        (StaticCache, "binding", p.timed("bind cache", StaticCache.binding)),
        (StaticCache, "commit", p.timed("commit", StaticCache.commit)),
        (Binding, "input", p.timed("bind inputs", Binding.input)),
        (Binding, "output", p.timed("bind inputs", Binding.output)),
        (Binding, "run", p.run(Binding.run)),
        (generation, "greedy", p.timed("choose", generation.greedy)),
    ]
    with ExitStack() as stack:
        for owner, name, wrapper in targets:  # undone at the end: an inherited one (the cache's contract) is deleted
            stack.enter_context(mock.patch.object(owner, name, wrapper))
        yield


def _median_ms(steps: list[dict[str, float]], key: str) -> float:
    return float(np.median([s[key] for s in steps])) * 1e3


def step_phases(
    model: Model | str,
    device: str = "webgpu",
    context: int = 1024,
    new_tokens: int = 32,
    rounds: int = 3,
    check_every: int | None = None,
    genai: bool = True,
    token_on_device: bool | str = AUTO,
) -> dict[str, Any]:
    """Rounds of (kvlab static cache, onnxruntime-genai), each a generation of ``new_tokens`` after ``context``
    prompt tokens (its own prefill, not timed). Returns per-phase median ms per decode step (steps after the first
    decode step, all rounds), kvlab's and genai's step and token-to-token medians with their ratios paired by
    round, and whether the tokens agree. ``token_on_device`` as ``generate`` takes it (default "auto", generate's):
    kvlab's steps keep the greedy token on the device (``kvlab.ort.decode.greedy``; "choose" is then part of the
    run) or choose it on the host; the result names the reduction that ran. ConfigError for a bad count or
    setting."""
    for name, value, least in (("context", context, 1), ("new_tokens", new_tokens, 3), ("rounds", rounds, 1)):
        check_int(value, name, least)
    model = load(model)
    reduction = reduction_for(token_on_device, model.info.vocab_size, open_device(device))  # "": the host path
    ids = prompt_ids(model, context)
    peer = GenaiPeer(model, device) if genai else None
    steps: list[dict[str, float]] = []
    kv_tokens, genai_tokens, pairs = [], [], []  # pairs: per round (kvlab step, genai step, kvlab t2t, genai t2t)
    for _ in range(rounds):
        mine, tokens = _kvlab_round(model, ids, device, new_tokens, check_every, reduction or False)
        steps += mine
        kv_tokens.append(tokens)
        if peer is not None:
            tokens, pair = _genai_round(peer, ids, new_tokens, mine)
            genai_tokens.append(tokens)
            pairs.append(pair)
    out: dict[str, Any] = {
        "model": model.name,
        "precision": model.info.dtype_name,  # the KV cache's
        "weights": model.info.weights,
        "device": device,
        "context": context,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "check_every": check_every,
        "token_on_device": bool(reduction),
        "greedy_reduction": reduction,
        **_kvlab_medians(steps),
        "kvlab_tokens_repeat": all(t == kv_tokens[0] for t in kv_tokens),
    }
    if peer is not None:
        out.update(
            genai_version=peer.version,
            **_paired(pairs),
            tokens_equal_genai=all(t == kv_tokens[0] for t in genai_tokens),
        )
    return out


def _kvlab_round(
    model: Model,
    ids: np.ndarray,
    device: str,
    new_tokens: int,
    check_every: int | None,
    token_on_device: bool | str,
) -> tuple[list[dict[str, float]], list[int]]:
    """One kvlab generation on a static cache with every phase timed: the steps after the first decode step (as
    genai's are counted) and the tokens."""
    p = _Phases()
    with StaticCache(len(ids) + new_tokens, check_every=check_every) as cache, _wrapped(p):
        g = generate(
            model,
            ids,
            cache=cache,
            device=device,
            max_new_tokens=new_tokens,
            stop_on_eos=False,
            on_step=p.record,
            token_on_device=token_on_device,
        )
    return p.steps[1:], g.token_ids


def _genai_round(
    peer: GenaiPeer, ids: np.ndarray, new_tokens: int, mine: list[dict[str, float]]
) -> tuple[list[int], tuple[float, float, float, float]]:
    """One onnxruntime-genai generation after kvlab's round ``mine``: its tokens, and the round's pair (kvlab step,
    genai step, kvlab token to token, genai token to token; genai's after its first decode call), in ms."""
    stamps: list[float] = []
    run = peer.run(ids, new_tokens, hooks=[lambda: stamps.append(time.perf_counter())])
    pair = (
        _median_ms(mine, "wall"),
        run.decode_ms,
        _median_ms(mine, "token to token"),
        float(np.median(np.diff(stamps[1:]))) * 1e3,
    )
    return run.token_ids, pair


def _kvlab_medians(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Each phase's median ms per step and its share of the token-to-token time, and the step's own medians."""
    rows = [{"phase": ph, "ms_per_step": _median_ms(steps, ph)} for ph in PHASES]
    t2t = _median_ms(steps, "token to token")
    for r in rows:
        r["share"] = r["ms_per_step"] / t2t
    return {
        "rows": rows,
        "per_step_ms": [{key: s * 1e3 for key, s in step.items()} for step in steps],  # each step's phases
        "kvlab_step_ms": _median_ms(steps, "wall"),
        "kvlab_token_to_token_ms": t2t,
        "python_ms": _median_ms(steps, "python"),  # the records' overhead_ms: wall less the runtime's time
        "python_share": _median_ms(steps, "python") / _median_ms(steps, "wall"),
    }


def _paired(pairs: list[tuple[float, float, float, float]]) -> dict[str, Any]:
    """genai's medians, and kvlab's step and token-to-token times over genai's, paired by round."""
    k_step, g_step, k_t2t, g_t2t = (np.array(c) for c in zip(*pairs))
    return {
        "genai_step_ms": float(np.median(g_step)),
        "genai_token_to_token_ms": float(np.median(g_t2t)),
        "step_ratio": float(np.median(k_step / g_step)),  # paired by round
        "token_to_token_ratio": float(np.median(k_t2t / g_t2t)),
        "step_ratios": (k_step / g_step).tolist(),
        "token_to_token_ratios": (k_t2t / g_t2t).tolist(),
    }
