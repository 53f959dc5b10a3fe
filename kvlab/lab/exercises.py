"""Exercises in the notebooks: the attendee writes an answer (a number, a choice, or a small function) and a check
says whether it is right, with a hint when it is not. The expected value comes from kvlab itself (a model's
layout, a run's records), never from the attendee's own formula.

    answer = None  # your answer: SmolLM2's KV bytes per token
    check(answer, model.info.bytes_per_token, what="SmolLM2's KV bytes per token", unit="bytes")

A check returns a ``Verdict``, shown as a coloured line. Checks never raise for a wrong or missing answer; ``check``
raises TypeError only when the expected value is not a number or a word.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NO_ANSWER = (None, Ellipsis)  # what an exercise cell holds before the attendee answers


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``ok`` is True (right), False (wrong) or None (no answer yet)."""

    ok: bool | None
    message: str

    @property
    def mark(self) -> str:
        """The verdict in words: "Right", "Not yet" or "No answer yet"."""
        return {True: "Right", False: "Not yet", None: "No answer yet"}[self.ok]

    def __str__(self) -> str:
        return f"{self.mark}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = {True: "#2ca02c", False: "#d62728", None: "#7f7f7f"}[self.ok]
        return (
            f"<div style='border-left:4px solid {color};padding:4px 8px;margin:4px 0'>"
            f"<b style='color:{color}'>{self.mark}</b>: {html.escape(self.message)}</div>"
        )


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token adds to a full-attention KV cache: a key and a value vector per KV head, in every layer."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def _fmt(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3g}"
    return f"{text} {unit}".strip()


def check(
    answer: Any,
    expected: float | str,
    *,
    what: str,
    unit: str = "",
    rel: float = 0.0,
    hint: str = "",
) -> Verdict:
    """A number (equal to ``expected`` within a relative tolerance ``rel``; 0: exactly, after rounding to an
    integer when ``expected`` is one) or a word (``expected`` a str: equal ignoring case and surrounding space).
    ``what`` names the quantity in the message; ``hint`` is shown when the answer is wrong."""
    if answer in NO_ANSWER or (isinstance(answer, float) and math.isnan(answer)):
        return Verdict(None, f"replace None with your answer for {what}{', in ' + unit if unit else ''}")
    if isinstance(expected, str):
        right = isinstance(answer, str) and answer.strip().lower() == expected.strip().lower()
        if right:
            return Verdict(True, f"{what} is {expected!r}")
        return Verdict(False, f"{answer!r} is not {what}" + (f"; hint: {hint}" if hint else ""))
    if isinstance(expected, bool) or not isinstance(expected, (int, float)):
        raise TypeError(f"check compares numbers or words; expected is {type(expected).__name__}")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Verdict(False, f"{what} is a number, not {answer!r}")
    if rel:
        right = abs(answer - expected) <= rel * abs(expected)
    elif isinstance(expected, int) or float(expected).is_integer():
        right = abs(answer - expected) < 0.5
    else:
        right = math.isclose(answer, expected, rel_tol=1e-6)
    if right:
        return Verdict(True, f"{what} is {_fmt(expected, unit)}")
    direction = f"{answer / expected:.2g}x the right value" if expected else "not 0"
    return Verdict(False, f"{_fmt(answer, unit)} is {direction} for {what}" + (f"; hint: {hint}" if hint else ""))


def check_prediction(guess: Any, measured: float, *, what: str, unit: str = "", close: float = 0.25) -> Verdict:
    """A prediction made before a cell ran against what it measured: right within ``close`` (relative; looser than
    ``check``, as a measurement has noise), else how far off, high or low."""
    if guess in NO_ANSWER:
        return Verdict(None, f"no prediction was made for {what}: the cell measured {_fmt(measured, unit)}")
    if isinstance(guess, bool) or not isinstance(guess, (int, float)):
        return Verdict(False, f"a prediction of {what} is a number, not {guess!r}")
    if abs(guess - measured) <= close * abs(measured):
        return Verdict(True, f"you predicted {_fmt(guess, unit)}; this run measured {_fmt(measured, unit)}")
    side = "high" if guess > measured else "low"
    return Verdict(
        False,
        f"you predicted {_fmt(guess, unit)}, {abs(guess / measured - 1):.0%} too {side}; this run measured "
        f"{_fmt(measured, unit)} for {what}",
    )


def check_function(
    fn: Callable[..., Any] | None,
    reference: Callable[..., Any],
    cases: Iterable[Sequence[Any]],
    *,
    what: str,
) -> Verdict:
    """The attendee's function against kvlab's ``reference`` on every case (a tuple of arguments): right when they
    agree on all, else the first case where it differs or raises; None for every case (a body still ``...``) counts
    as no answer yet."""
    if fn in NO_ANSWER:
        return Verdict(None, f"define the function for {what} and pass it in")
    if not callable(fn):
        return Verdict(False, f"{what} should be a function, not {fn!r}")
    cases = [tuple(c) for c in cases]
    results = []
    for args in cases:
        want = reference(*args)
        try:
            got = fn(*args)
        except Exception as exc:  # the attendee's code: any error is an answer to report
            return Verdict(False, f"for {_args(args)} it raised {type(exc).__name__}: {exc}")
        results.append((got, want))
    if all(got is None for got, _ in results) and any(want is not None for _, want in results):
        return Verdict(None, f"the function for {what} returns None every time: write its body")
    for args, (got, want) in zip(cases, results):
        if got != want:
            return Verdict(False, f"for {_args(args)} it returned {got!r}; the right answer is {want!r}")
    return Verdict(True, f"{what}: all {len(cases)} cases agree with kvlab's")


def _args(args: Sequence[Any]) -> str:
    return ", ".join(repr(a) for a in args)
