"""One forward pass at a time: ``Stepper.step(tokens)`` binds the cache, runs the session, commits, records.

The step, in order: the cache binds its slots (capacity checked, nothing changed), the stepper binds the token
ids, the attention mask and the logits, the runtime runs, the cache commits (it checks what the runtime returned,
then advances), every hook gets the step's ``StepRecord``, and the cache settles. A step that fails anywhere (the
run, the check, a hook, Ctrl-C) leaves the cache as it was and releases every tensor the runtime made in it.

A stepper is one ``with`` block, entered once, stepped by one thread at a time (CacheStateError otherwise)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from ...core.errors import ConfigError, check_choice, check_flag, check_int
from ...core.generation import greedy
from ...core.guards import OneBlock, atomic, check_token_ids
from ...core.records import CacheStep, StepHook, StepRecord, hook_list, step_record
from ..models.model import Model, load
from ..runtime.device import Device, open_device
from ..runtime.session import Binding, RunResult
from .burst import decode
from .caches.ort_cache import OrtCache
from .greedy import MAX_TOKENS_PER_READ, DeviceToken, ids_dtype, non_finite, not_a_token, reduction_of

LOGITS_OUT = ("last", "all", "none")


class Stepper:
    """One model + one cache + one device, stepped by hand. It holds the cache for its ``with`` block
    (``with Stepper(model, cache, device, positions) as s:``), for at most ``positions`` positions, from an empty
    sequence (``keep=True``: from the one the cache holds, counted in ``positions``).

    ``token_on_device`` (True or a reduction of ``kvlab.ort.decode.greedy.REDUCTIONS``): greedy steps that hand back
    no logits take the token from the graph and feed it to the next step from the device; ``decode`` runs such steps
    in bursts of up to ``tokens_per_read``. ``hooks`` get every step's record. Raises ConfigError for a bad argument,
    what opening the cache's session raises, and, on entering the block, what the cache's ``use`` raises."""

    def __init__(
        self,
        model: Model | str,
        cache: OrtCache,
        device: Device | str,
        positions: int,
        hooks: Sequence[StepHook] = (),
        token_on_device: bool | str = False,
        keep: bool = False,
        tokens_per_read: int = 1,
    ):
        model, device, self.keep = load(model), open_device(device), check_flag("keep", keep)
        if not isinstance(cache, OrtCache):
            raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r:.60}")
        reduction = reduction_of(token_on_device)
        self.model, self.cache, self.device, self.hooks = model, cache, device, hook_list(hooks)
        self.token_on_device, self.greedy_reduction = bool(reduction), reduction
        model.check_files()  # the files it was loaded from, unchanged: on every path, before any session
        self.session = cache.session(device, model, reduction)
        self.positions = check_int(positions, "positions", 1, note=" (the positions this stepper may fill)")
        self.tokens_per_read = check_int(
            tokens_per_read, "tokens_per_read", 1, MAX_TOKENS_PER_READ, note=" (decode steps read back together)"
        )
        self.steps = 0
        self._device_token: DeviceToken | None = None  # while open, with token_on_device
        self._ids_dtype = ids_dtype(reduction)  # the session's input ids: int64, or int32 (the "rows" graph)
        self._mask = np.ones((1, 0), np.int64)  # made when the block opens, once the positions are known to fit
        self._decode_logits = np.empty((1, 1, model.info.vocab_size), model.info.logits_dtype)
        self._cache_held: Any = None  # the cache's use, while open
        self._block = OneBlock("Stepper", "`with Stepper(...) as s:`")  # entered once, one step at a time

    def __enter__(self) -> Stepper:
        with self._block.opening():
            held = self.cache.use(self.model.info, self.device, self.positions, keep=self.keep)
            try:
                with atomic():  # the cache's use begins and is recorded here as one: a Ctrl-C lands after
                    held.__enter__()  # capacity checked: the positions fit the model and the cache
                    self._cache_held = held
                self._mask = np.ones((1, self.positions), np.int64)  # all ones; the first (position + n) are fed
                if self.token_on_device:
                    size = min(self.tokens_per_read, self.positions) + 1  # the input ids and a burst's tokens
                    self._device_token = self.cache.device_token(self.device, self._ids_dtype, size)
            except BaseException:  # the block never opens: the use ends here, once (``_leave`` ends what began)
                self._leave(None, None, None)
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._block.close()
        self._leave(*exc)

    def _leave(self, *exc: Any) -> None:
        """End the cache's use and release the device token, once; a Ctrl-C meanwhile is raised after both."""
        with atomic():
            token, self._device_token = self._device_token, None
            held, self._cache_held = self._cache_held, None
            try:
                if token is not None:
                    token.release()
            finally:
                if held is not None:
                    held.__exit__(*exc)

    def step(
        self,
        tokens: Any,
        choose: Callable[[np.ndarray], int] | None = None,
        logits_out: str = "last",
        pick: Callable[[np.ndarray], tuple[int, dict[str, Any]]] | None = None,
        **columns: Any,
    ) -> tuple[np.ndarray | None, StepRecord]:
        """Feed ``tokens`` [n]; returns a copy of the logits ("last": [vocab], "all": [n, vocab], "none": None)
        and the step's record. ``choose`` picks the token from the last logits (default greedy); ``pick``, instead,
        from every position's logits [n, vocab], returning it and record columns it decides (prompt lookup's
        verification); ``columns`` set record columns the caller knows (``phase``, ``turn``, ...). Raises ConfigError
        (bad tokens, more positions than opened for), CacheStateError (outside its with block, another thread's step
        running), ModelError (NaN/Inf logits) and what the cache and the run raise; a failed step is undone."""
        with self._block.call("step"):
            start = time.perf_counter()
            if logits_out not in LOGITS_OUT:
                check_choice(logits_out, LOGITS_OUT, "logits_out=")
            tokens = check_token_ids(tokens, self.model.info.vocab_size)
            n, position = int(tokens.shape[0]), self.cache.seq_length
            if position + n > self.positions:
                raise ConfigError(
                    f"step of {n} tokens at position {position} exceeds the {self.positions} positions this "
                    "stepper was opened for"
                )
            default = choose is None or choose is greedy  # the greedy token, which the graph can also choose
            on_device = logits_out == "none" and default and not pick and self._device_token is not None
            info = self.model.info
            logits = self._decode_logits if n == 1 else np.empty((1, n, info.vocab_size), info.logits_dtype)
            result, memory = self._run(self._input_ids(tokens, on_device), n, position, logits, ahead=int(on_device))
            try:
                if on_device:
                    out, token, picked = None, self._device_token.read()[0], {}
                    if not_a_token(token, info.vocab_size):
                        raise non_finite(self.steps, position + n - 1, self.model.name)
                else:
                    last = logits[0, -1]
                    check_finite(logits[0] if pick else last, self.steps, position + n - 1, self.model.name)
                    out = None if logits_out == "none" else (last if logits_out == "last" else logits[0]).copy()
                    token, picked = pick(logits[0]) if pick else (int(last.argmax()) if default else choose(last), {})
                fields = {"phase": "prefill" if position == 0 else "decode", **columns, **picked}
                fields.setdefault("prefilled", n if fields["phase"] == "prefill" else 0)
                fields.update(position=position, n_tokens=n, token=token)
                record = self._record(memory, (time.perf_counter() - start) * 1e3, result.run_ms, **fields)
            except BaseException:  # a hook (or Ctrl-C) failed the step after its commit: undo it
                self.cache.rollback(n)
                raise
            self.cache.settle()
            self.steps += 1
            if on_device:
                self._device_token.advance(1, token)
            elif self._device_token is not None:
                self._device_token.forget()
            return out, record

    def decode(self, token: int, n: int, until: Collection[int] = ()) -> list[StepRecord]:
        """Up to ``n`` greedy decode steps after ``token``, read back in bursts of up to ``tokens_per_read``; stops
        after the first token of ``until``. Returns the kept steps' records (``kvlab.ort.decode.burst.decode``)."""
        with self._block.call("decode"):
            return decode(self, token, n, until)

    def receive(self, src: OrtCache) -> StepRecord:
        """Take over the sequence another cache holds: a 'handoff' step 0, whose record the hooks get. Raises what
        ``cache.receive`` raises (this cache is then empty) and what a hook raises."""
        with self._block.call("receive"):
            start = time.perf_counter()
            memory, copied = self.cache.receive(src)
            if self._device_token is not None:
                self._device_token.forget()
            self.steps = 0  # the handoff is step 0, with the prefill it carries over
            handoff = {"phase": "handoff", "copied_from": src.device.name, "copy_bytes": copied}
            wall_ms = (time.perf_counter() - start) * 1e3
            record = self._record(memory, wall_ms, 0.0, **handoff, position=0, n_tokens=src.seq_length, token=-1)
            self.steps = 1
            return record

    def _run(self, ids: Any, n: int, position: int, logits: np.ndarray, ahead: int = 0) -> tuple[RunResult, CacheStep]:
        """Bind the step (the cache's slots, ``ids`` [1, n], mask, positions, and ``logits`` or, ``ahead`` > 0, the
        device token's tensor that many places along), run it, commit the cache. Raises what those raise; the cache has
        not advanced then, and what the run made is released."""
        info = self.model.info
        b: Binding = self.cache.binding(self.session, n)
        b.input(info.input_names["input_ids"], ids)
        b.input(info.input_names["attention_mask"], self._mask[:, : position + n])
        if "position_ids" in info.input_names:  # exports whose attention does not derive positions from the mask
            b.input(info.input_names["position_ids"], np.arange(position, position + n, dtype=np.int64)[None])
        if ahead:
            self._device_token.bind_outputs(b, ahead)
            if b.bound_to_host(info.logits_name):  # a host step bound them on this binding: now of this step's shape
                b.output(info.logits_name, logits)
        else:
            b.output(info.logits_name, logits)
        try:
            result = b.run()
            memory = self.cache.commit(result, n)  # raises (and does not advance) if the run misbehaved
        finally:
            b.release_unowned()  # whatever the cache did not take: everything, when the commit failed
        return result, memory

    def _record(self, memory: CacheStep, wall_ms: float, run_ms: float, **fields: Any) -> StepRecord:
        """The step's record, handed to every hook (in order; one that raises fails the step)."""
        length = fields["position"] + fields["n_tokens"]  # the step's own length: a burst records after it ran
        mine = {"step": self.steps, "device": self.device.name, "used_cache_bytes": self.cache.used_bytes_at(length)}
        record = step_record(**mine, wall_ms=wall_ms, run_ms=run_ms, memory=memory, **fields)
        for hook in self.hooks:
            hook(record)
        return record

    def _input_ids(self, tokens: np.ndarray, on_device: bool) -> Any:
        """The step's input ids: the device tensor the last step wrote where it holds ``tokens`` (``on_device``),
        else ``tokens`` [1, n] in the session's id type."""
        held = self._device_token.holding(tokens) if on_device else None
        return held if held is not None else tokens.reshape(1, -1).astype(self._ids_dtype, copy=False)


def check_finite(logits: np.ndarray, step: int, position: int, model: str) -> None:
    """ModelError naming the step, the last position and how many values, when the logits a token is chosen from hold
    NaN or Inf; the step then fails and is undone."""
    finite = np.isfinite(logits)
    if not finite.all():
        nan = int(np.isnan(logits).sum())
        counts = f"{nan} NaN and {int(finite.size - finite.sum()) - nan} Inf of {finite.size} values"
        raise non_finite(step, position, model, counts)
