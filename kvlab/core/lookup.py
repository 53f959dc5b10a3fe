"""Prompt-lookup decoding, backend-neutral: draft tokens found in the text seen so far (no draft model) and their
greedy verification.

Each decode step looks up the last ``ngram`` tokens (then fewer, down to one) in the conversation, takes up to ``k``
tokens that followed their latest earlier occurrence as drafts, and feeds the last token and the drafts in one step;
``verify`` keeps the drafts the model's greedy choice agrees with, and the model's next token.

A multi-token step's logits are not bit-equal to a one-token step's (another kernel rounds differently), so a
verification row decides only where its choice leads the runner-up by at least ``margin`` (``MARGINS``, by the
logits' precision); at the first row that does not, the step stops and that position is fed alone by the next
step: the tokens are plain greedy's."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .errors import ConfigError, check_int

# the default margin per logits dtype: over twice the largest multi-token vs one-token difference seen
MARGINS = {"float16": 0.25, "float32": 1e-4}


@dataclass(frozen=True)
class PromptLookup:
    """Greedy prompt-lookup decoding: up to ``k`` drafts a step (1 to 64), matched on the last ``ngram`` tokens (1 to
    8); a row decides where its choice leads by ``margin`` (None: ``MARGINS``; 0: always). ConfigError out of range."""

    k: int = 5
    ngram: int = 3
    margin: float | None = None

    def __post_init__(self) -> None:
        for name, top in (("k", 64), ("ngram", 8)):
            value = getattr(self, name)
            check_int(value, name, 1, top, subject=f"PromptLookup({name}={value!r}): {name}")
        m = self.margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < float("inf")):
            raise ConfigError(
                f"PromptLookup(margin={m!r}): margin must be None (by the logits' precision: {MARGINS}) or a finite "
                "number of logits >= 0 (0: every verification row decides)"
            )

    def margin_for(self, logits_dtype: object) -> float:
        """The margin in force for logits of ``logits_dtype`` (a numpy dtype or its name)."""
        if self.margin is not None:
            return float(self.margin)
        return MARGINS.get(np.dtype(logits_dtype).name, MARGINS["float16"])


def propose(ids: Sequence[int], k: int, ngram: int, stop: Collection[int] = ()) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``ngram`` tokens of ``ids`` (then
    fewer, down to one), cut before the first of ``stop`` (an EOS is never a draft); [] when nothing matches."""
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


def verify(logits: np.ndarray, drafts: Sequence[int], margin: float = 0.0) -> tuple[int, int]:
    """Greedy verification of ``drafts`` from the logits [1 + len(drafts), vocab] of a step that fed the last token and
    the drafts: (accepted, next token): the drafts the model's argmax confirms, in order, and its choice after them. A
    row decides only where its choice leads the runner-up by ``margin``; at the first that does not, the drafts before
    it are accepted and the next token is -1 (that position goes to a one-token step)."""
    chosen = logits.argmax(axis=-1)
    top2 = np.partition(logits, -2, axis=-1)[:, -2:] if logits.shape[-1] > 1 else np.zeros((len(logits), 2))
    decided = top2[:, 1] - top2[:, 0] >= margin  # [1 + len(drafts)]: the lead of each row's choice
    accepted = 0
    while accepted < len(drafts) and decided[accepted] and chosen[accepted] == drafts[accepted]:
        accepted += 1
    return accepted, int(chosen[accepted]) if decided[accepted] else -1
