"""``generate``: prefill, then decode one token at a time, one hook call per step."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import numpy as np

from ..core.cache import Cache
from ..core.errors import ConfigError, check_flag
from ..core.generation import (
    Generation,
    Sampling,
    attach_partial,
    check_new_tokens,
    check_sampling,
    positions_needed,
    stop_reason,
)
from ..core.labels import RunLabel
from ..core.records import StepHook, StepRecord, hook_list
from .caches import DynamicCache
from .device import Device, open_device
from .greedy import reduction_of
from .models import Model, load
from .stepper import Stepper


def generate(
    model: Model | str,
    prompt: Any,
    *,
    cache: Cache | None = None,
    device: Device | str = "cpu",
    max_new_tokens: int = 32,
    chat: bool = False,
    sampling: Sampling | None = None,
    stop_on_eos: bool = True,
    on_step: StepHook | Iterable[StepHook] | None = None,
    prefill_device: Device | str | None = None,
    prefill_model: Model | str | None = None,
    token_on_device: bool | str = False,
) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, chat messages or token ids).

    The cache starts empty (``generate`` resets it; a StaticCache keeps its buffers). Default cache: dynamic.

    ``prefill_device="cpu"`` runs the prefill on the CPU EP (``prefill_model``, default the same model), copies
    the KV into ``cache`` on ``device`` (a 'handoff' step) and decodes there; where a package's WebGPU prefill is
    wrong (``kvlab.ort.builtin``), this one is right.

    ``token_on_device=True`` (greedy only; or a reduction name, ``kvlab.ort.greedy.REDUCTIONS``: "blocks", the
    default, or "single"): the decode device's graph picks each token and the next step reads it
    from the device, so neither the logits nor the token cross between host and device per step
    (``kvlab.ort.greedy``; the run's label says so). Opt-in: it pays on a small vocabulary and costs on a large one
    (``data/gpu/token/``).

    Returns a ``Generation`` (tokens, text, one record per step, the run's label). Raises ConfigError (a bad
    argument), CapacityError (the tokens do not fit the model or the cache), ModelError, DeviceError; an error at
    step N carries the tokens of steps 1..N-1 as ``exc.partial``.
    """
    new_tokens = check_new_tokens(max_new_tokens)
    check_flag("chat", chat)
    check_flag("stop_on_eos", stop_on_eos)
    model = load(model)
    dev = open_device(device)
    choose = check_sampling(sampling, model.info.vocab_size).chooser()
    reduction = reduction_of(token_on_device)
    if reduction and sampling is not None and sampling.do_sample:
        raise ConfigError(
            "token_on_device picks the greedy token on the device; sampling (do_sample=True) needs "
            "the logits on the host: use token_on_device=False"
        )
    user_hooks = hook_list(on_step)
    ids = model.encode(prompt, chat=chat)
    own_cache = cache is None  # a default cache nobody else can reach: disposed when the generation ends
    cache = DynamicCache() if own_cache else cache
    if not isinstance(cache, Cache):
        raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r}")
    tokens: list[int] = []
    records: list[StepRecord] = []
    hooks = [*user_hooks, records.append]  # the generation's own record last: a failed step is never in it
    pre_dev = None if prefill_device is None else open_device(prefill_device)
    if pre_dev is None or pre_dev is dev:
        if prefill_model is not None:
            raise ConfigError("prefill_model needs a prefill_device other than the decode device")
        pre = None
    else:
        pre_model = model if prefill_model is None else load(prefill_model)
        pre = Stepper(pre_model, cache.twin(), pre_dev, len(ids), hooks)
    eos = model.info.eos_token_ids

    def result(stop: str) -> Generation:
        label = RunLabel(
            model.name,
            model.info.dtype_name,
            dev.label,
            cache.spec,
            pre.device.label if pre else None,
            bool(reduction),
            reduction,
        )
        return Generation(label, ids.tolist(), list(tokens), model.decode(tokens), stop, list(records))

    try:
        with (
            cache if own_cache else nullcontext(),
            Stepper(
                model, cache, dev, positions_needed(len(ids), new_tokens), hooks, token_on_device=token_on_device
            ) as stepper,
        ):
            feed = ids
            if pre is not None:
                with pre.cache, pre:
                    _, record = pre.step(ids, choose, logits_out="none")
                    stepper.receive(pre.cache)
                tokens.append(record.token)
                feed = np.array([record.token], np.int64)
            while not tokens or not stop_reason(tokens, new_tokens, stop_on_eos, eos):
                _, record = stepper.step(feed, None if reduction else choose, logits_out="none")
                tokens.append(record.token)
                feed = np.array([record.token], np.int64)
    except BaseException as exc:
        if tokens:  # a failure at step N keeps the tokens of steps 1..N-1
            attach_partial(exc, result("error"))
        raise
    return result(stop_reason(tokens, new_tokens, stop_on_eos, eos))
