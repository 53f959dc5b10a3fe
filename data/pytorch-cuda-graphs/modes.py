"""What ``record.py`` measures, one function per kind of mode: eager generation with a
transformers cache (``eager``), kvlab's GraphRunner (``graph``) and transformers' own generate (``hf``), each
returning that mode's result dict; and the checks beside them (``top2_margins``, ``teacher_forced``). torch loads on
first call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cuda_counters import allocator_requests, allocator_segments, kernel_profile

from kvlab.pytorch.generate import sync


@dataclass(frozen=True)
class Workload:
    """One configuration's model, device and prompt, and how each mode runs on them."""

    model: Any  # a kvlab.pytorch.TorchModel
    dev: Any  # its torch.device
    ids: list[int]  # the prompt's token ids
    new: int  # tokens each mode generates (never stopping early)
    repeats: int  # timed repetitions where a mode takes the best
    attention: str  # decode attention of the fused graph modes
    compile_mode: str  # torch.compile mode of the compiled graph modes

    @property
    def max_len(self) -> int:
        """Positions a run needs: the prompt and every new token (the static caches' size)."""
        return len(self.ids) + self.new

    @property
    def cuda(self) -> bool:
        return self.dev.type == "cuda"


def top2_margins(work: Workload, tokens: list[int]) -> list[float]:
    """Logit gap between the best and second-best token at each generated position (teacher-forced, one forward
    over prompt + tokens): near-ties (tiny gaps) are where rounding can flip a greedy choice."""
    import torch

    x = torch.tensor([work.ids + tokens[:-1]], device=work.dev)
    with torch.inference_mode():
        logits = work.model.hf(input_ids=x, use_cache=False).logits[0, len(work.ids) - 1 :].float()  # [new, V]
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def eager(work: Workload, cache: str) -> dict[str, Any]:
    """kvlab.pytorch.generate with a transformers ``cache`` ("dynamic" or "static"): a short warm-up (the first
    call), then one timed generation, per decode step's medians; on CUDA a static cache's step kernels too."""
    import kvlab.pytorch as tb

    t = time.perf_counter()
    tb.generate(work.model, work.ids[:16], cache=cache, max_new_tokens=4, stop_on_eos=False)  # warm-up
    first = time.perf_counter() - t
    g = tb.generate(work.model, work.ids, cache=cache, max_new_tokens=work.new, stop_on_eos=False)
    f = g.frame()
    d = f[f.phase == "decode"]
    out = {
        "first_call_s": first,
        "ms_per_token": float(d.wall_ms.median()),
        "ms_per_token_mean": float(d.wall_ms.mean()),
        "tokens_per_s": 1e3 / float(d.wall_ms.median()),
        "prefill_ms": float(f.wall_ms.iloc[0]),
        "alloc_requests_per_step": float(d.alloc_requests.median()),
        "alloc_bytes_per_step": float(d.alloc_bytes.median()),
        "segments_decode_total": int(d.segments.sum()) if work.cuda else None,
        "kv_tensors_created_per_step": float(d.cache_tensors_allocated.median()),
        "tokens": g.token_ids,
    }
    if cache == "static" and work.cuda:
        out["profile"] = _static_step_profile(work)
    return out


def _static_step_profile(work: Workload) -> dict[str, Any]:
    """The kernels of 10 eager decode steps on a transformers StaticCache filled with the prompt."""
    import torch

    from kvlab.pytorch.generate import make_cache
    from kvlab.pytorch.models import cache_kwarg

    model, dev = work.model, work.dev
    hf_cache = make_cache(model, "static", work.max_len)
    kw = cache_kwarg(model.hf)
    with torch.inference_mode():
        model.hf(input_ids=torch.tensor([work.ids], device=dev), use_cache=True, logits_to_keep=1, **{kw: hf_cache})
        tok = torch.tensor([[work.ids[-1]]], device=dev)
        return kernel_profile(
            lambda: model.hf(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: hf_cache}), 10, dev
        )


def graph(work: Workload, mode: str, fuse: bool, reference: list[int] | None, margins: list[float]) -> dict[str, Any]:
    """kvlab's GraphRunner in ``mode`` ("capture", "compile" or "eager"), fused or not: its setup and first run,
    the best of ``repeats`` replay loops, the generate API's per-step cost, agreement with eager DynamicCache's
    ``reference`` tokens when there are some, and on CUDA the kernels of 20 replays."""
    from attention import use

    from kvlab.pytorch.graphs import GraphRunner

    t = time.perf_counter()
    attention = use(work.model, work.attention) if fuse else 0  # fused: the decode attention asked for
    runner = GraphRunner(
        work.model,
        work.max_len,
        mode=mode,
        fuse=fuse,
        keep_logits=not fuse,  # fused: the lean step
        compile_mode=work.compile_mode,
    )
    setup = time.perf_counter() - t
    tokens = runner.decode_greedy(work.ids, work.new)
    first = time.perf_counter() - t
    dt, allocs, segs, lean = min((_replay_loop(work, runner) for _ in range(work.repeats)), key=lambda r: r[0])
    g = runner.generate(work.ids, max_new_tokens=work.new, stop_on_eos=False)  # kvlab contract: per-step sync
    f = g.frame()
    d = f[f.phase == "decode"]
    out = {
        "setup_s": setup,
        **runner.setup_s,
        "fused": {**runner.fused, "attention": attention} if fuse else {},
        "first_call_s": first,
        "ms_per_token": dt * 1e3,
        "tokens_per_s": 1 / dt,
        "alloc_requests_per_step": allocs,
        "segments_decode_total": segs,
        "lean_tokens_equal_first_run": lean == tokens,
        "generate_api_ms_per_token": float(d.wall_ms.median()),
        "generate_api_alloc_requests_per_step": float(d.alloc_requests.median()),
        "generate_api_tokens_equal": g.token_ids == tokens,
        "tokens": tokens,
    }
    if reference is not None:
        out["teacher_forced"] = teacher_forced(work, runner, reference, margins)
    if work.cuda:  # 20 replays from the prompt: well inside max_cache_len
        runner.prefill(work.ids)
        out["profile"] = kernel_profile(runner.replay, 20, work.dev)
    return out


def _replay_loop(work: Workload, runner: Any) -> tuple[float, float | None, int | None, list[int]]:
    """One timed decode from the prompt by bare replays: seconds per step, allocator requests per step and new
    segments (None off CUDA), and the tokens it chose."""
    dev, new = work.dev, work.new
    sync(dev)
    runner.start(work.ids)
    sync(dev)
    a0, s0, t1 = allocator_requests(dev), allocator_segments(dev), time.perf_counter()
    for _ in range(new - 1):
        runner.replay()
    sync(dev)
    dt = (time.perf_counter() - t1) / (new - 1)
    allocs = (allocator_requests(dev) - a0) / (new - 1) if work.cuda else None
    segs = allocator_segments(dev) - s0 if work.cuda else None
    return dt, allocs, segs, runner.history[len(work.ids) : len(work.ids) + new].tolist()


def teacher_forced(work: Workload, runner: Any, ref: list[int], margins: list[float]) -> dict[str, Any]:
    """Feed eager DynamicCache's tokens instead of the runner's own and compare each step's argmax with eager's
    next token: agreement per step, without one early flip changing everything after it."""
    ids = work.ids
    logits = runner.prefill(ids)
    own = [int(logits.argmax())]
    for i in range(work.new - 1):
        runner.tok.fill_(ref[i])
        runner.replay()
        own.append(int(runner.history[len(ids) + i + 1]))  # this step's argmax (a host sync)
    differ = [i for i, (a, b) in enumerate(zip(own, ref)) if a != b]
    return {
        "steps": len(own),
        "agree": len(own) - len(differ),
        "differ_at": differ,
        "eager_top2_margin_at_differ": [round(margins[i], 4) for i in differ if i < len(margins)],
    }


def hf(work: Workload, static: bool) -> dict[str, Any]:
    """transformers' own generate: default DynamicCache (eager), or cache_implementation="static" (auto-compile).
    The per-token cost is the best full run less the best one-token run, over the decode steps."""
    import torch

    dev, new, model = work.dev, work.new, work.model
    x = torch.tensor([work.ids], device=dev)
    kwargs = dict(attention_mask=torch.ones_like(x), do_sample=False, pad_token_id=0, eos_token_id=None)
    if static:
        kwargs["cache_implementation"] = "static"

    def call(n: int) -> tuple[float, int, Any]:
        sync(dev)
        a, t = allocator_requests(dev), time.perf_counter()
        with torch.inference_mode():
            o = model.hf.generate(x, max_new_tokens=n, min_new_tokens=n, **kwargs)
        sync(dev)
        return time.perf_counter() - t, allocator_requests(dev) - a, o

    first, _, o = call(new)
    full = [call(new) for _ in range(work.repeats if static else 1)]
    one = [call(1) for _ in range(work.repeats if static else 1)]
    tf, af, o = min(full, key=lambda r: r[0])
    t1, a1, _ = min(one, key=lambda r: r[0])
    per = (tf - t1) / (new - 1)
    return {
        "first_call_s": first,
        "ms_per_token": per * 1e3,
        "tokens_per_s": 1 / per,
        "total_s_best": tf,
        "one_token_s_best": t1,
        "alloc_requests_per_step": (af - a1) / (new - 1),
        "tokens": o[0, len(work.ids) :].tolist(),
    }
