"""Eager generation on PyTorch through kvlab's contract: one forward per step with a transformers cache, one
``TorchStepRecord`` (and hook call) per step, a ``Generation`` as the ONNX Runtime path returns it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..core.cache import Cache as KvlabCache
from ..core.errors import CapacityError, ConfigError
from ..core.generation import Generation, Sampling, check_new_tokens, positions_needed, stop_reason
from ..core.labels import CacheSpec, RunLabel
from ..core.records import CacheStep, StepHook, hook_list, step_record
from .counters import KVWatch, TorchStepRecord, counting_allocs
from .models import TorchModel, cache_kwarg, need_torch
from .quantized import make_quantized, quantized_setting

if TYPE_CHECKING:  # pragma: no cover
    import torch

CACHES = ("dynamic", "static", "quantized")


def make_cache(
    model: TorchModel, cache: Any, needed: int, max_cache_len: int | None = None, kv_precision: str | None = None
) -> Any:
    """A transformers cache for ``needed`` positions from "dynamic"/"static" (``max_cache_len``, default ``needed``),
    "quantized" or a ``QuantizedKV`` (``kv_precision``), a kvlab cache (the transformers one of its kind and size) or a
    transformers Cache (used as is, reset)."""
    from transformers import Cache as HFCache
    from transformers import DynamicCache as HFDynamic
    from transformers import StaticCache as HFStatic

    setting = quantized_setting(cache, kv_precision)
    if setting is not None:
        return make_quantized(model, setting)
    if isinstance(cache, HFCache):
        if isinstance(cache, HFStatic):
            check_capacity(int(cache.get_max_length()), needed)
        with need_torch().inference_mode():
            cache.reset()
        return cache
    spec = cache.spec if isinstance(cache, KvlabCache) else CacheSpec(cache) if cache in CACHES else None
    if spec is None:
        raise ConfigError(
            f"cache={cache!r}; choose one of {CACHES}, kvlab.DynamicCache(), kvlab.StaticCache(n) or "
            "a transformers Cache"
        )
    if spec.kind == "dynamic":
        return HFDynamic(config=model.hf.config)
    size = spec.max_cache_len or max_cache_len or needed
    check_capacity(size, needed)
    return HFStatic(config=model.hf.config, max_cache_len=size)


def cache_spec(hf_cache: Any) -> CacheSpec:
    """The kvlab label of a transformers cache: its kind, size and (quantized) variant."""
    if type(hf_cache).__name__ == "QuantizedCache":
        return CacheSpec("quantized", None, getattr(hf_cache, "kvlab_variant", ""))
    if type(hf_cache).__name__ == "StaticCache":
        return CacheSpec("static", int(hf_cache.get_max_length()))
    return CacheSpec("dynamic")


def check_capacity(max_cache_len: int, needed: int) -> None:
    """CapacityError when ``needed`` positions do not fit ``max_cache_len``."""
    if needed > max_cache_len:
        raise CapacityError(
            f"{needed} positions needed (prompt + max_new_tokens - 1) but max_cache_len={max_cache_len}"
        )


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        need_torch().cuda.synchronize(device)


class StepLog:
    """The steps of one PyTorch generation: their records, the hooks each record goes to, the tokens so far and
    why the generation stops (shared by ``generate`` and ``GraphRunner.generate``)."""

    def __init__(self, model: TorchModel, hooks: Sequence[StepHook], n_new: int, stop_on_eos: bool):
        self.model, self.hooks, self.n_new, self.stop_on_eos = model, hooks, n_new, stop_on_eos
        self.records: list[TorchStepRecord] = []
        self.tokens: list[int] = []
        self.position = 0  # the cache's length before the next step

    def add(self, n: int, token: int, wall_s: float, run_s: float, memory: CacheStep, allocs: list[int]) -> str | None:
        """One step that fed ``n`` tokens and chose ``token`` (``allocs``: ``counting_allocs``'s), recorded and
        handed to every hook; returns why generation stops now (None: go on)."""
        requests, nbytes, segments = allocs
        rec = step_record(
            step=len(self.records),
            phase="prefill" if self.position == 0 else "decode",
            device=self.model.device.type,
            position=self.position,
            n_tokens=n,
            token=token,
            wall_ms=wall_s * 1e3,
            run_ms=run_s * 1e3,
            memory=memory,
            used_cache_bytes=(self.position + n) * self.model.bytes_per_token,
            kind=TorchStepRecord,
            alloc_requests=requests,
            alloc_bytes=nbytes,
            segments=segments,
        )
        self.records.append(rec)
        for hook in self.hooks:
            hook(rec)
        self.tokens.append(token)
        self.position += n
        return stop_reason(self.tokens, self.n_new, self.stop_on_eos, self.model.eos_token_ids)

    def generation(self, cache: CacheSpec, ids: list[int], stop: str) -> Generation:
        """The result, labelled like the ONNX Runtime path's."""
        m = self.model
        label = RunLabel(m.name, m.dtype_name, m.label, cache)
        return Generation(label, list(ids), self.tokens, m.decode(self.tokens), stop, self.records)


def generate(
    model: TorchModel,
    prompt: Any,
    *,
    cache: Any = "dynamic",
    max_new_tokens: int = 32,
    max_cache_len: int | None = None,
    chat: bool = False,
    sampling: Sampling | None = None,
    stop_on_eos: bool = True,
    on_step: StepHook | Iterable[StepHook] | None = None,
    count_cpu_allocs: bool = False,
    kv_precision: str | None = None,
) -> Generation:
    """Eager generation with a transformers cache, one forward and one record (and hook call) per step.
    ``cache``: "dynamic" | "static" | "quantized" | kvlab.DynamicCache() | kvlab.StaticCache(n) |
    kvlab.pytorch.QuantizedKV(...) | a transformers Cache; ``kv_precision`` with "quantized" (default int8). A static
    cache defaults to prompt + max_new_tokens - 1 positions. ``count_cpu_allocs``: the CPU allocation proxy (slow).
    Returns a ``Generation`` of ``TorchStepRecord`` s. Raises ConfigError for a bad argument, CapacityError when the
    tokens do not fit the cache."""
    torch = need_torch()  # fails with its own message where torch is missing, before anything else
    if not isinstance(model, TorchModel):
        raise ConfigError(f"model must be a kvlab.pytorch.TorchModel (kvlab.pytorch.load(...)), got {model!r}")
    n_new = check_new_tokens(max_new_tokens)
    ids = model.encode(prompt, chat=chat)
    needed = positions_needed(len(ids), n_new)
    hf_cache = make_cache(model, cache, needed, max_cache_len, kv_precision)
    choose = (sampling or Sampling()).chooser()
    log = StepLog(model, hook_list(on_step), n_new, stop_on_eos)
    kw, dev = cache_kwarg(model.hf), model.device
    watch = KVWatch()
    feed, stop = torch.tensor([ids], dtype=torch.long, device=dev), None
    with torch.inference_mode():
        while stop is None:
            start = time.perf_counter()
            with counting_allocs(dev, count_cpu_allocs) as allocs:
                t0 = time.perf_counter()
                out = model.hf(input_ids=feed, use_cache=True, logits_to_keep=1, **{kw: hf_cache})
                sync(dev)
                run = time.perf_counter() - t0
                logits = out.logits[0, -1].float().cpu().numpy()  # the last position's, on the host
            token = choose(logits)
            wall = time.perf_counter() - start
            stop = log.add(int(feed.shape[1]), token, wall, run, watch.diff(hf_cache), allocs)
            feed = torch.tensor([[token]], dtype=torch.long, device=dev)
    return log.generation(cache_spec(hf_cache), ids, stop)
