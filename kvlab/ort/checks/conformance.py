"""Does a device compute the same logits as the CPU EP? Position by position, on the same input: a package whose
prefill is wrong on some adapter (docs/known-limits.md names one) shows it here, ``check(model, ids,
mode="prefill")`` saying from which position on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.errors import check_choice
from ...core.labels import DeviceLabel
from ..decode.caches.dynamic import DynamicCache
from ..decode.stepper import Stepper
from ..models.model import Model, load
from ..runtime.device import open_device

MODES = ("prefill", "decode")


@dataclass
class Conformance:
    """Per-position comparison of ``device`` logits against ``reference`` logits."""

    model: str
    device: DeviceLabel
    reference: DeviceLabel
    mode: str  # "prefill": all tokens in one run; "decode": one token per run
    atol: float
    max_abs_diff: np.ndarray  # [n] per position
    argmax_equal: np.ndarray  # [n] bool

    @property
    def first_divergence(self) -> int | None:
        """First position whose logits differ by more than atol or whose argmax differs (None: all agree)."""
        bad = np.flatnonzero((self.max_abs_diff > self.atol) | ~self.argmax_equal)
        return int(bad[0]) if bad.size else None

    @property
    def agrees(self) -> bool:
        """Whether every position agrees (``first_divergence`` is None)."""
        return self.first_divergence is None

    def frame(self):
        """A pandas DataFrame, one row per position: its max |diff| and whether the argmax agrees."""
        import pandas as pd

        return pd.DataFrame(
            {
                "position": np.arange(self.max_abs_diff.size),
                "max_abs_diff": self.max_abs_diff,
                "argmax_equal": self.argmax_equal,
            }
        )

    def summary(self) -> str:
        """The comparison in one line: the devices, the largest difference, where they part."""
        where = (
            "all positions agree"
            if self.agrees
            else f"first divergence at position {self.first_divergence}; "
            f"{int((~self.argmax_equal).sum())} of {self.argmax_equal.size} positions pick another argmax"
        )
        return (
            f"{self.model} {self.mode}: {self.device} vs {self.reference}: max |diff| "
            f"{float(self.max_abs_diff.max()):.3g} (atol {self.atol:g}); {where}"
        )


def logits_per_position(model: Model, ids: np.ndarray, device: str, mode: str) -> np.ndarray:
    """Logits [n, vocab] for every position of ``ids`` on ``device`` (dynamic cache, fresh): all in one run
    (``mode="prefill"``) or one token per run ("decode"); ConfigError for another mode."""
    check_choice(mode, MODES, "conformance mode ")
    with DynamicCache() as cache, Stepper(model, cache, open_device(device), len(ids)) as stepper:
        if mode == "prefill":
            return stepper.step(ids, logits_out="all")[0]
        return np.stack([stepper.step(ids[i : i + 1], logits_out="all")[0][0] for i in range(len(ids))])


# how far two devices' logits may differ and still count as the same, by the dtype they compute in (float16 is
# looser: the CPU EP computes an fp16 model's MatMuls in float32)
ATOL = {np.dtype(np.float32): 1e-3, np.dtype(np.float16): 1e-1}


def check(
    model: Model | str,
    prompt,
    *,
    device: str = "webgpu",
    reference: str = "cpu",
    mode: str = "prefill",
    atol: float | None = None,
) -> Conformance:
    """Compare ``device`` against ``reference`` on the same tokens of ``prompt``, position by position (``atol``:
    default by the logits' dtype, ``ATOL``). Raises what ``load``, ``open_device`` and a step raise."""
    model = load(model)
    atol = ATOL[np.dtype(model.info.logits_dtype)] if atol is None else atol
    ids = model.encode(prompt)
    got = logits_per_position(model, ids, device, mode).astype(np.float32)
    ref = logits_per_position(model, ids, reference, mode).astype(np.float32)
    return Conformance(
        model.name,
        open_device(device).label,
        open_device(reference).label,
        mode,
        atol,
        np.abs(got - ref).max(axis=1),
        got.argmax(axis=1) == ref.argmax(axis=1),
    )
