"""Greedy decode steps in bursts: the token stays on the device (``DeviceToken``'s ring), the host binds and runs step
after step while the GPU works through them, and one read at the end takes the burst's tokens back.

A burst keeps the stepper's promises: every step is committed before the next runs, so a failing step leaves the
steps before it kept and is undone itself; steps run past a token the caller stops at are undone (the cache
cropped) and never reported. A burst of more than one step runs only where the cache can be cropped back over it
(``Cache.can_crop``): a cache holding a state decodes one step per read."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import numpy as np

from ...core.errors import ConfigError, check_int
from ...core.guards import check_token_ids
from ...core.records import StepRecord
from .greedy import non_finite, not_a_token

Stepper = Any  # a kvlab.ort.decode.stepper.Stepper, open, inside its call (this module is its helper)


def decode(stepper: Stepper, token: int, n: int, until: Collection[int] = ()) -> list[StepRecord]:
    """``Stepper.decode``: up to ``n`` greedy decode steps after ``token`` in bursts (``burst_size``), each burst's
    records handed to the hooks once its tokens are read; stops after the first token of ``until``, the steps run past
    it undone and not reported. Raises ConfigError (no token on the device, a bad ``token`` or ``n``, too many
    positions) and what a step raises: the steps before it are kept and reported, the failing one undone."""
    if stepper._device_token is None:
        raise ConfigError("decode() keeps the token on the device: open the Stepper with token_on_device")
    token = int(check_token_ids([token], stepper.model.info.vocab_size)[0])
    n = check_int(n, "n", 1, stepper.positions - stepper.cache.seq_length, note=" (the positions left)")
    records: list[StepRecord] = []
    while len(records) < n and not (records and records[-1].token in until):
        records += run_burst(stepper, token, burst_size(stepper, n - len(records)), until)
        token = records[-1].token
    return records


def burst_size(stepper: Stepper, wanted: int) -> int:
    """How many steps the next burst runs: up to ``wanted`` and ``tokens_per_read``, and 1 where the cache could not
    be cropped back to the burst's start once it ran."""
    cache, k = stepper.cache, min(wanted, stepper.tokens_per_read, stepper._device_token.burst_limit)
    return k if k > 1 and cache.can_crop(cache.seq_length, cache.seq_length + k) else 1


def run_burst(stepper: Stepper, token: int, k: int, until: Collection[int]) -> list[StepRecord]:
    """``k`` greedy decode steps after ``token``, read back together; returns the kept steps' records (up to the first
    token of ``until``), handed to the hooks. Raises what a step raises, the steps before it kept."""
    dt, start, origin = stepper._device_token, time.perf_counter(), stepper.cache.seq_length
    ids = stepper._input_ids(np.array([token], np.int64), on_device=True)
    ran: list[tuple[Any, Any, int]] = []  # (run result, cache step, position) of each committed step
    failure: BaseException | None = None
    try:
        for ahead in range(1, k + 1):
            position = stepper.cache.seq_length
            result, memory = stepper._run(ids, 1, position, stepper._decode_logits, ahead)
            stepper.cache.settle()
            ran.append((result, memory, position))
            ids = dt.target(ahead) if ahead < k else None
    except BaseException as exc:  # the failing step was undone by its commit; the ones before it are kept
        failure = exc
        _drop_unrecorded(stepper, ran[-1][2] + 1 if ran else origin)
    if not ran:
        raise failure  # type: ignore[misc]
    tokens = _read(stepper, ran)
    vocab = stepper.model.info.vocab_size
    broken = next((i for i, t in enumerate(tokens) if not_a_token(t, vocab)), None)
    if broken is not None:  # its logits held NaN or Inf: that step and the ones after it are undone
        failure = non_finite(stepper.steps + broken, ran[broken][2], stepper.model.name)
        del ran[broken:]
        stepper.cache.crop(ran[-1][2] + 1 if ran else origin)
        if not ran:
            raise failure
    kept = next((i + 1 for i, t in enumerate(tokens) if t in until), len(ran))
    if kept < len(ran):  # steps run past a stop token: undone, never reported
        stepper.cache.crop(ran[kept][2])
    wall_ms = (time.perf_counter() - start) * 1e3 / len(ran)
    run_ms = sum(result.run_ms for result, _, _ in ran) / len(ran)
    records = _report(stepper, ran[:kept], tokens, (wall_ms, run_ms), len(ran))
    if failure is not None:
        raise failure
    return records


def _drop_unrecorded(stepper: Stepper, length: int) -> None:
    """A step committed but not yet kept when the failure landed (a Ctrl-C between the two) is undone too."""
    if stepper.cache.seq_length > length:
        stepper.cache.settle()
        stepper.cache.crop(length)


def _read(stepper: Stepper, ran: list[tuple[Any, Any, int]]) -> list[int]:
    """The tokens of the steps that ran; where reading them fails, those steps are undone (cropped) first (the ring
    still holds the burst's input ids where it held them)."""
    try:
        return stepper._device_token.read(len(ran))
    except BaseException:
        stepper.cache.crop(ran[0][2])
        raise


def _report(
    stepper: Stepper, ran: list[tuple[Any, Any, int]], tokens: list[int], shares: tuple[float, float], together: int
) -> list[StepRecord]:
    """Every kept step's record, handed to the hooks in order; the device token advanced over the steps reported.
    A hook that fails undoes its step and the ones after it (the cache cropped to its position) and raises."""
    records, dt, (wall_ms, run_ms) = [], stepper._device_token, shares
    fields = {"phase": "decode", "prefilled": 0, "read_with": together}
    for i, (_, memory, position) in enumerate(ran):
        try:
            record = stepper._record(memory, wall_ms, run_ms, position=position, n_tokens=1, token=tokens[i], **fields)
        except BaseException:
            stepper.cache.crop(position)
            if i:
                dt.advance(i, tokens[i - 1])
            raise
        stepper.steps += 1
        records.append(record)
    dt.advance(len(ran), tokens[len(ran) - 1])
    return records
