"""Prompt-lookup decoding on ONNX Runtime (the drafts and their verification: ``kvlab.core.lookup``): the decode
steps of a greedy turn, each feeding the last token and the drafts found in the conversation in one multi-token
step, then cropping the cache to the positions the model confirmed. Meant for a StaticCache, whose crop only moves
its length; a DynamicCache crops by copying its kept positions (correct, and slower).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...core.lookup import PromptLookup, propose, verify
from .stepper import Stepper

NOT_EXACT = (
    "this package's multi-token steps are wrong on this device (onnxruntime-webgpu 1.27 on a software adapter: "
    "kvlab.ort.runtime.builtin), so drafts cannot be verified in one step: the turn ran one token a step"
)
NO_CROP = (
    "the model's layers keep states (conv, recurrent), which cannot be cropped back after rejected drafts: the turn "
    "ran one token a step"
)


def lookup_steps(
    stepper: Stepper,
    prompt: list[int],
    tokens: list[int],
    new_tokens: int,
    stop: Callable[[], Any],
    lookup: PromptLookup,
    columns: dict[str, Any],
) -> None:
    """Greedy decode steps after a prefill of ``prompt`` (its token: ``tokens[0]``) until ``stop()`` names a
    reason: each proposes up to ``lookup.k`` drafts (never past ``new_tokens``), verifies them in one step
    (phase "verify"; a step without drafts is a plain decode step), appends the accepted drafts and the model's next
    token to ``tokens``, and crops the cache to the positions those need. A verify step whose next token is within
    the lookup's margin (token -1: ``kvlab.core.lookup.verify``) leaves that position to the next step, fed alone."""
    cache, eos = stepper.cache, stepper.model.info.eos_token_ids
    margin, alone = lookup.margin_for(stepper.model.info.logits_dtype), False
    while not stop():
        room = new_tokens - len(tokens) - 1  # the step yields its accepted drafts and one token more
        drafts = [] if alone else propose([*prompt, *tokens], min(lookup.k, room), lookup.ngram, eos)
        if not drafts:
            _, rec = stepper.step(np.array(tokens[-1:], np.int64), None, "none", **columns)
            tokens.append(rec.token)
            alone = False
            continue

        def pick(logits: np.ndarray, drafts: list[int] = drafts) -> tuple[int, dict[str, int]]:
            accepted, token = verify(logits, drafts, margin)
            return token, {"accepted": accepted}

        fed = np.array([tokens[-1], *drafts], np.int64)
        _, rec = stepper.step(fed, None, "none", pick=pick, phase="verify", drafted=len(drafts), **columns)
        alone = rec.token < 0  # a near-tie: the next step decides that position with one token
        tokens += [*drafts[: rec.accepted], *([] if alone else [rec.token])]
        cache.crop(len(prompt) + len(tokens) - 1)  # the last token is fed by the next step
