"""A generation's settings and result, shared by every backend: ``Sampling``, ``Generation`` and the small facts
each loop needs (positions a generation needs, when it stops, where two token sequences part)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from .errors import ConfigError, check_flag, check_int
from .frames import decode_median, frame
from .labels import RunLabel
from .records import COLUMNS, StepRecord

MIN_TEMPERATURE = 1e-6  # below it the logits / temperature can overflow float64 (a subnormal: inf, NaN)


@dataclass(frozen=True)
class Sampling:
    """Greedy by default; ``do_sample=True`` draws from the softmax (temperature, top-k, top-p), seeded. ConfigError
    for a value out of range."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1.0 = no nucleus cut
    seed: int | None = None

    def __post_init__(self) -> None:
        check_flag("do_sample", self.do_sample)
        if not _real(self.temperature) or not math.isfinite(self.temperature) or not self.temperature > 0:
            raise ConfigError(f"temperature={self.temperature!r} must be a finite number > 0")
        if self.temperature < MIN_TEMPERATURE:  # a subnormal one made the logits / temperature inf, p NaN
            raise ConfigError(
                f"temperature={self.temperature!r} is below {MIN_TEMPERATURE:g}, where the scaled logits overflow; "
                "for the most likely token use do_sample=False"
            )
        check_int(self.top_k, "top_k", 0, note=" (0 disables it)")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p!r} must be in (0, 1]")
        if self.seed is not None:
            check_int(self.seed, "seed", 0, note=" (or None)")

    def check_vocabulary(self, vocab_size: int) -> None:
        """ConfigError when ``top_k`` exceeds a vocabulary of ``vocab_size`` tokens."""
        if self.top_k > vocab_size:
            raise ConfigError(
                f"top_k={self.top_k} is larger than the vocabulary ({vocab_size} tokens); use at most "
                f"{vocab_size} (or 0 to disable the cut)"
            )

    def chooser(self) -> Callable[[np.ndarray], int]:
        """A function from one position's logits [vocab] to the next token."""
        if not self.do_sample:
            return greedy
        rng = np.random.default_rng(self.seed)

        def sample(logits: np.ndarray) -> int:
            z = logits.astype(np.float64) / self.temperature
            if self.top_k:
                z[z < np.partition(z, -self.top_k)[-self.top_k]] = -np.inf
            p = np.exp(z - z.max())
            p /= p.sum()
            if self.top_p < 1:
                order = np.argsort(-p)
                keep = np.cumsum(p[order]) - p[order] < self.top_p  # smallest set reaching top_p
                p[order[~keep]] = 0
                p /= p.sum()
            return int(rng.choice(p.size, p=p))

        return sample


def _real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python's or numpy's), not a bool."""
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def check_sampling(sampling: Any, vocab_size: int) -> Sampling:
    """The sampling settings (greedy when None), checked against the model's vocabulary (ConfigError)."""
    if sampling is None:
        return Sampling()
    if not isinstance(sampling, Sampling):
        raise ConfigError(
            f"sampling must be a kvlab.Sampling (e.g. Sampling(do_sample=True, seed=0)), got "
            f"{type(sampling).__name__} {sampling!r:.60}"
        )
    sampling.check_vocabulary(vocab_size)
    return sampling


def attach_partial(exc: BaseException, partial: Generation) -> None:
    """Hand the tokens made before a failure to whoever catches it: ``exc.partial`` (and a note saying so)."""
    try:
        exc.partial = partial  # type: ignore[attr-defined]
        exc.add_note(
            f"kvlab: {len(partial.token_ids)} tokens were generated before this error; they are in "
            "the exception's .partial (a kvlab.Generation)"
        )
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass


def greedy(logits: np.ndarray) -> int:
    """The greedy token: the index of the largest logit (the lowest index on a tie)."""
    return int(logits.argmax())


@dataclass
class Generation:
    """The result of a generation: text, token ids, one record per step, and what produced them (``label``)."""

    label: RunLabel
    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens (an EOS that stopped generation included)
    text: str
    stop_reason: str  # "eos" or "max_new_tokens"
    records: list[StepRecord] = field(default_factory=list)

    def frame(self):
        """Per-step records as a pandas DataFrame, the run's ``label`` in ``frame.attrs``."""
        columns = [f.name for f in fields(type(self.records[0]))] if self.records else list(COLUMNS)
        return frame(self.records, columns, label=self.label)

    def to_dict(self) -> dict[str, Any]:
        """The generation as plain data (its label and records as dicts)."""
        return asdict(self)

    def decode_ms(self) -> float:
        """Median wall time of the decode steps (ms); NaN with no decode step."""
        return decode_median(self.records)

    def ttft_ms(self) -> float:
        """Time to first token (ms): the wall time of the prefill steps (one, or several when chunked)."""
        return sum(r.wall_ms for r in self.records if r.phase == "prefill")


def positions_needed(prompt_tokens: int, new_tokens: int) -> int:
    """Cache positions a generation needs: the prompt and every new token but the last, which is never fed back."""
    return prompt_tokens + new_tokens - 1


def check_new_tokens(max_new_tokens: Any, name: str = "max_new_tokens") -> int:
    """``max_new_tokens`` (or another count, ``name``) as an int when it is a positive int; else ConfigError."""
    return check_int(max_new_tokens, name, 1)


def stop_reason(
    tokens: Sequence[int], max_new_tokens: int, stop_on_eos: bool, eos_token_ids: Sequence[int]
) -> str | None:
    """Why generation stops after ``tokens`` ("eos", "max_new_tokens"), or None to go on."""
    if stop_on_eos and tokens and tokens[-1] in eos_token_ids:
        return "eos"
    return "max_new_tokens" if len(tokens) >= max_new_tokens else None


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where two token sequences differ (a length difference counts); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
