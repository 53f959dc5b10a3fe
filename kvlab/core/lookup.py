"""Prompt-lookup decoding, backend-neutral: draft tokens found in the text seen so far (no draft model) and their
greedy verification.

Each decode step looks up the last ``ngram`` tokens (then fewer, down to one) in the conversation, takes up to ``k``
tokens that followed their latest earlier occurrence as drafts, and feeds the last token and the drafts in one step;
the model's greedy choice at every position says how many drafts it would have produced itself (``verify``). The
step yields those and the model's next token, so greedy tokens are the same as one token per step, and the cache
keeps only their positions (the backend crops the rest).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .errors import check_int


@dataclass(frozen=True)
class PromptLookup:
    """Greedy prompt-lookup decoding: up to ``k`` drafts a step (1 to 64), matched on the last ``ngram`` tokens (then
    fewer, down to one; ``ngram`` 1 to 8). ConfigError for a value out of range."""

    k: int = 5
    ngram: int = 3

    def __post_init__(self) -> None:
        for name, top in (("k", 64), ("ngram", 8)):
            value = getattr(self, name)
            check_int(value, name, 1, top, subject=f"PromptLookup({name}={value!r}): {name}")


def propose(ids: Sequence[int], k: int, ngram: int, stop: Collection[int] = ()) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``ngram`` tokens of ``ids`` (then
    of fewer, down to one), cut before the first of ``stop`` (an EOS ends a reply: it is never a draft); [] when
    nothing matches or ``k`` < 1."""
    arr = np.asarray(ids, np.int64)
    if k < 1 or arr.size < 2:
        return []
    for size in range(min(ngram, arr.size - 1), 0, -1):
        windows = sliding_window_view(arr[:-1], size)  # every earlier occurrence ends before the last token
        starts = np.flatnonzero((windows == arr[-size:]).all(axis=1))
        if starts.size:
            j = int(starts[-1]) + size
            drafts = arr[j : j + k].tolist()
            cut = next((i for i, t in enumerate(drafts) if t in stop), len(drafts))
            if cut:
                return drafts[:cut]
    return []


def verify(logits: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """Greedy verification of ``drafts`` from the logits [1 + len(drafts), vocab] of a step that fed the last
    token and the drafts: (accepted, next token): the drafts the model's argmax confirms, in order, and its choice
    after the last of them."""
    chosen = logits.argmax(axis=-1)
    accepted = 0
    while accepted < len(drafts) and chosen[accepted] == drafts[accepted]:
        accepted += 1
    return accepted, int(chosen[accepted])
