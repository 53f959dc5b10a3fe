"""``generate``: prefill, then decode one token at a time, one hook call per step."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.errors import ConfigError, check_flag
from ...core.generation import (
    Generation,
    Sampling,
    attach_partial,
    check_new_tokens,
    check_sampling,
    positions_needed,
    stop_reason,
)
from ...core.labels import RunLabel
from ...core.records import StepHook, StepRecord, hook_list
from ..models.model import Model, load
from ..runtime.device import Device, open_device
from .caches.dynamic import DynamicCache
from .caches.ort_cache import OrtCache
from .greedy import AUTO, reduction_of, tokens_per_read_for
from .stepper import Stepper


def generate(
    model: Model | str,
    prompt: Any,
    *,
    cache: OrtCache | None = None,
    device: Device | str = "cpu",
    max_new_tokens: int = 32,
    chat: bool = False,
    sampling: Sampling | None = None,
    stop_on_eos: bool = True,
    on_step: StepHook | Iterable[StepHook] | None = None,
    prefill_device: Device | str | None = None,
    prefill_model: Model | str | None = None,
    token_on_device: bool | str = AUTO,
    tokens_per_read: int | str = AUTO,
) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, chat messages or token ids), from an empty
    cache (default: dynamic; a StaticCache keeps its buffers). ``prefill_device="cpu"``: the prefill runs on the CPU EP
    (``prefill_model``, default the same model) and its KV is copied into ``cache`` on ``device`` (a 'handoff' step).

    ``token_on_device`` (greedy only: True, False, "auto" or one of ``kvlab.ort.decode.greedy.REDUCTIONS``): the
    decode graph picks each token and the next step reads it from the device; "auto" (default) where that pays
    (``auto_reduction``). ``tokens_per_read``: steps run before their tokens are read back together
    (``Stepper.decode``; steps past an EOS are undone); "auto": ``TOKENS_PER_READ``, 1 for a captured cache. The label
    says which ran.

    Returns a ``Generation`` (tokens, text, one record per step, the run's label). Raises ConfigError (a bad
    argument), CapacityError (the tokens do not fit the model or the cache), ModelError, DeviceError; an error at
    step N carries the tokens of steps 1..N-1 as ``exc.partial``."""
    new_tokens = check_new_tokens(max_new_tokens)
    check_flag("chat", chat)
    check_flag("stop_on_eos", stop_on_eos)
    model, dev = load(model), open_device(device)
    user_hooks = hook_list(on_step)
    ids = model.encode(prompt, chat=chat)
    own_cache = cache is None  # a default cache nobody else can reach: disposed when the generation ends
    cache = DynamicCache() if own_cache else cache
    if not isinstance(cache, OrtCache):
        raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r}")
    choose, reduction = _choice(model, sampling, token_on_device, dev, cache)
    per_read = tokens_per_read_for(tokens_per_read, reduction, cache)
    run = _Run(model, dev, cache, ids, new_tokens, stop_on_eos, reduction, per_read)
    hooks = [*user_hooks, run.records.append, run.took]  # the generation's own last: a failed step is never in them
    run.pre = _prefill_stepper(model, cache, ids, hooks, prefill_device, prefill_model, dev)
    try:
        positions = positions_needed(len(ids), new_tokens)
        with (
            cache if own_cache else nullcontext(),
            Stepper(model, cache, dev, positions, hooks, reduction or False, tokens_per_read=per_read or 1) as stepper,
        ):
            _decode(stepper, run, None if reduction else choose, choose)
    except BaseException as exc:
        if run.tokens:  # a failure at step N keeps the tokens of steps 1..N-1
            attach_partial(exc, run.generation("error"))
        raise
    return run.generation(run.stop())


@dataclass
class _Run:
    """One generation's tokens and records as they come, and what it says when it stops."""

    model: Model
    device: Device
    cache: OrtCache
    ids: np.ndarray
    new_tokens: int
    stop_on_eos: bool
    reduction: str
    tokens_per_read: int  # 0: the token on the host
    pre: Stepper | None = None  # the prefill's, on another device
    tokens: list[int] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)

    def stop(self) -> str:
        """Why the generation stops now ("" while it goes on)."""
        eos = self.model.info.eos_token_ids
        return stop_reason(self.tokens, self.new_tokens, self.stop_on_eos, eos) if self.tokens else ""

    def took(self, record: StepRecord) -> None:
        """A hook: the token of each step that chose one, as it comes."""
        if record.phase in ("prefill", "decode"):
            self.tokens.append(record.token)

    def generation(self, stop: str) -> Generation:
        """The ``Generation`` so far, labelled, stopped for ``stop``."""
        m, pre, r = self.model, self.pre.device.label if self.pre else None, self.reduction
        label = RunLabel(
            m.name, m.info.dtype_name, self.device.label, self.cache.spec, pre, bool(r), r, self.tokens_per_read
        )
        return Generation(label, self.ids.tolist(), list(self.tokens), m.decode(self.tokens), stop, list(self.records))


def _choice(
    model: Model, sampling: Sampling | None, token_on_device: bool | str, dev: Device, cache: OrtCache
) -> tuple[Any, str]:
    """How each token is chosen: the host's chooser, and the greedy graph's reduction ("" for none). "auto" picks
    the host when sampling, else what the cache says (``OrtCache.auto_reduction``)."""
    choose = check_sampling(sampling, model.info.vocab_size).chooser()
    sampled = sampling is not None and sampling.do_sample
    if isinstance(token_on_device, str) and token_on_device == AUTO:
        return choose, "" if sampled else cache.auto_reduction(model.info.vocab_size, dev)
    reduction = reduction_of(token_on_device)
    if reduction and sampled:
        raise ConfigError(
            "token_on_device picks the greedy token on the device; sampling (do_sample=True) needs "
            "the logits on the host: use token_on_device=False"
        )
    return choose, reduction


def _prefill_stepper(
    model: Model,
    cache: OrtCache,
    ids: np.ndarray,
    hooks: list[StepHook],
    prefill_device: Device | str | None,
    prefill_model: Model | str | None,
    dev: Device,
) -> Stepper | None:
    """The stepper of a prefill on another device (on an empty cache like ``cache``), or None."""
    pre_dev = None if prefill_device is None else open_device(prefill_device)
    if pre_dev is None or pre_dev is dev:
        if prefill_model is not None:
            raise ConfigError("prefill_model needs a prefill_device other than the decode device")
        return None
    pre_model = model if prefill_model is None else load(prefill_model)
    return Stepper(pre_model, cache.empty_like(), pre_dev, len(ids), hooks)


def _decode(stepper: Stepper, run: _Run, choose: Any, prefill_choose: Any) -> None:
    """The prefill (on ``run.pre``'s device and handed off, or on the stepper's), then the decode until ``run.stop()``
    names a reason: in bursts where the token stays on the device, else one step at a time."""
    next_ids = run.ids
    if run.pre is not None:
        with run.pre.cache, run.pre:
            _, record = run.pre.step(run.ids, prefill_choose, logits_out="none")
            stepper.receive(run.pre.cache)
        next_ids = np.array([record.token], np.int64)
    while not run.stop():
        if run.tokens and choose is None and stepper.tokens_per_read > 1:
            until = run.model.info.eos_token_ids if run.stop_on_eos else ()  # the tokens a decode stops after
            stepper.decode(run.tokens[-1], run.new_tokens - len(run.tokens), until)
            continue
        _, record = stepper.step(next_ids, choose, logits_out="none")
        next_ids = np.array([record.token], np.int64)
