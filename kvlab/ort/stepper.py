"""One forward pass at a time: ``Stepper.step(tokens)`` binds the cache, runs the session, commits, records.

The step, in order: the cache binds its KV (``cache.binding``: capacity checked, nothing changed), the stepper
binds the token ids, the attention mask and the logits (the runtime copies host inputs to the device there: that
time is the runtime's, counted in the record's ``run_ms`` with the run), the runtime runs, the cache commits (it
checks what the runtime returned, then advances), every hook gets the step's ``StepRecord``, and the cache
settles. A step that fails anywhere (the run, the check, a hook, Ctrl-C) leaves the cache as it was, and every
tensor the runtime made in it is released: call it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.cache import Cache
from ..core.errors import ConfigError, check_choice
from ..core.generation import greedy
from ..core.records import StepHook, StepRecord, hook_list, step_record
from .caches import OrtCache
from .device import Device, open_device
from .greedy import TokenFeed, greedy_graph, reduction_of
from .models import Model, load

LOGITS_OUT = ("last", "all", "none")


class Stepper:
    """One model + one cache + one device, stepped by hand. It holds the cache for its lifetime
    (``with Stepper(model, cache, device, needed) as s:``) for at most ``needed`` positions.

    ``token_on_device=True`` (or a reduction of ``kvlab.ort.greedy.REDUCTIONS``): greedy steps that hand back no
    logits (``choose`` None, ``logits_out="none"``) take the token from the graph (``kvlab.ort.greedy``) and feed it
    to the next step from the device. ``hooks`` get
    every step's record. Raises ConfigError for a bad argument, and what the cache's ``use`` raises
    (CapacityError, CacheStateError)."""

    def __init__(
        self,
        model: Model | str,
        cache: Cache,
        device: Device | str,
        needed: int,
        hooks: Sequence[StepHook] = (),
        token_on_device: bool | str = False,
    ):
        model, device = load(model), open_device(device)
        if not isinstance(cache, OrtCache):
            raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r:.60}")
        reduction = reduction_of(token_on_device)
        self.model, self.cache, self.device, self.hooks = model, cache, device, hook_list(hooks)
        if reduction and type(cache).session is not OrtCache.session:
            raise ConfigError(
                f"token_on_device runs the model's greedy graph on the device's own session; a "
                f"{type(cache).__name__} runs a session of its own: use a DynamicCache or StaticCache"
            )
        self.token_on_device, self.greedy_reduction = bool(reduction), reduction
        self._feed: TokenFeed | None = None  # while entered, with token_on_device
        # the device's session of the model (its greedy graph with token_on_device), or the cache's own
        self.session = (
            device.session(
                greedy_graph(model, reduction), f"model {model.name} (greedy token on the device, {reduction})"
            )
            if reduction
            else cache.session(device, model)
        )
        if isinstance(needed, bool) or not isinstance(needed, (int, np.integer)) or needed < 1:
            raise ConfigError(f"needed={needed!r} must be a positive int (the positions this stepper may fill)")
        self.needed = int(needed)
        self._mask = np.ones((1, self.needed), np.int64)  # all ones; the first (position + n) are fed each step
        self._decode_logits = np.empty((1, 1, model.info.vocab_size), model.info.logits_dtype)
        self._use = cache.use(model.info, device, self.needed)
        self.steps = 0

    def __enter__(self) -> Stepper:
        self._use.__enter__()
        if self.token_on_device:
            try:
                self._feed = TokenFeed(self.device)
            except BaseException:
                self._use.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        feed, self._feed = self._feed, None
        try:
            if feed is not None:
                feed.release()
        finally:
            self._use.__exit__(*exc)

    def step(
        self, tokens: Any, choose: Callable[[np.ndarray], int] | None = None, logits_out: str = "last"
    ) -> tuple[np.ndarray | None, StepRecord]:
        """Feed ``tokens`` [n]; returns a copy of the logits ("last": [vocab], "all": [n, vocab], "none": None)
        and the step's record. ``choose`` picks the token from the last logits (default greedy). Raises ConfigError
        (bad tokens, more positions than the stepper was opened for) and what the cache and the run raise; a
        failed step leaves the cache as it was."""
        start = time.perf_counter()
        if logits_out not in LOGITS_OUT:
            check_choice(logits_out, LOGITS_OUT, "logits_out=")
        info, tokens = self.model.info, self.model.check_ids(tokens)
        n, position = int(tokens.shape[0]), self.cache.seq_length
        if position + n > self.needed:
            raise ConfigError(
                f"step of {n} tokens at position {position} exceeds the {self.needed} positions this "
                "stepper was opened for"
            )
        feed = self._feed if logits_out == "none" and choose in (None, greedy) else None  # the token on the device
        logits = self._decode_logits if n == 1 else np.empty((1, n, info.vocab_size), info.logits_dtype)
        b = self.cache.binding(self.session, n)
        held = feed.holding(tokens) if feed is not None else None
        b.input(info.input_names["input_ids"], held if held is not None else tokens.reshape(1, n))
        b.input(info.input_names["attention_mask"], self._mask[:, : position + n])
        if "position_ids" in info.input_names:  # exports whose attention does not derive positions from the mask
            b.input(info.input_names["position_ids"], np.arange(position, position + n, dtype=np.int64)[None])
        if feed is not None:
            feed.bind_outputs(b)
        else:
            b.output(info.logits_name, logits)
        try:
            result = b.run()
            memory = self.cache.commit(result, n)  # raises (and does not advance) if the run misbehaved
        finally:
            b.release_unowned()  # whatever the cache did not take: everything, when the commit failed
        try:
            if feed is not None:
                out, token = None, feed.written()
            else:
                last = logits[0, -1]
                out = None if logits_out == "none" else (last if logits_out == "last" else logits[0]).copy()
                token = (choose or greedy)(last)
            record = step_record(
                step=self.steps,
                phase="prefill" if position == 0 else "decode",
                device=self.device.name,
                position=position,
                n_tokens=n,
                token=token,
                wall_ms=(time.perf_counter() - start) * 1e3,
                run_ms=(result.seconds + result.bind_seconds) * 1e3,
                memory=memory,
                used_cache_bytes=self.cache.used_bytes,
            )
            self._emit(record)
        except BaseException:  # a hook (or Ctrl-C) failed the step after its commit: undo it
            self.cache.rollback(n)
            raise
        self.cache.settle()
        self.steps += 1
        if feed is not None:
            feed.advance()
        elif self._feed is not None:
            self._feed.forget()
        return out, record

    def receive(self, src: Cache) -> StepRecord:
        """Take over the sequence another stepper's cache holds (a prefill on another device): a 'handoff' step."""
        start = time.perf_counter()
        memory, copied = self.cache.receive(src)
        wall = (time.perf_counter() - start) * 1e3
        record = step_record(
            step=0,
            phase="handoff",
            device=self.device.name,
            copied_from=src.device.name,
            position=0,
            n_tokens=src.seq_length,
            token=-1,
            wall_ms=wall,
            run_ms=0.0,
            memory=memory,
            used_cache_bytes=self.cache.used_bytes,
            copy_bytes=copied,
        )
        self.steps = 1  # the next step is the first decode step
        if self._feed is not None:
            self._feed.forget()
        self._emit(record)
        return record

    def _emit(self, record: StepRecord) -> None:
        for hook in self.hooks:
            hook(record)
