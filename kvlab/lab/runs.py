"""What a figure draws: one ``Run`` per generation, its records with what produced them (model, dtype, device and
adapter, runtime, cache), and the legend and title texts made from those fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.generation import Generation
from ..core.labels import RunLabel, read_back_text
from .style import device_text, runtime_text


@dataclass
class Run:
    """One run's records plus what produced them."""

    frame: Any  # pandas DataFrame with the columns of kvlab.COLUMNS
    label: RunLabel
    name: str = ""  # legend name; made from the fields that differ between runs when empty
    recorded: str = ""  # non-empty for recorded results: where and on what they were measured

    @property
    def context(self) -> str:
        """'context P→E tokens': the prompt and the final cache length."""
        f = self.frame
        if f.empty:
            return "no steps"
        prompt = int(f["n_tokens"].iloc[0]) if f["phase"].iloc[0] == "prefill" else int(f["position"].iloc[0])
        end = int((f["position"] + f["n_tokens"]).max())
        return f"context {prompt}\u2192{end} tokens"


def as_run(obj: Any, name: str = "") -> Run:
    """A ``Run`` from a ``kvlab.Generation``, a ``Run``, or a DataFrame whose ``attrs["label"]`` is the
    ``RunLabel`` of what produced it (as ``Generation.frame()`` sets it). ValueError for a DataFrame without that
    label, TypeError for anything else."""
    if isinstance(obj, Run):
        if name:
            obj.name = name
        return obj
    if isinstance(obj, Generation):
        return Run(obj.frame(), obj.label, name)
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        label = obj.attrs.get("label")
        if not isinstance(label, RunLabel):
            raise ValueError(
                f"a DataFrame passed to kvlab.lab.plots needs attrs['label'], a kvlab RunLabel (what "
                f"produced it), got {label!r}; or pass the kvlab.Generation itself"
            )
        return Run(obj, label, name or obj.attrs.get("name", ""), obj.attrs.get("recorded", ""))
    raise TypeError(
        f"cannot plot {type(obj).__name__}; pass kvlab.Generation objects, kvlab.lab.Run objects "
        "or DataFrames labelled as Generation.frame() labels them"
    )


def as_runs(objs: Any) -> list[Run]:
    """``as_run`` of one object, a list of them, or a dict (its keys become the legend names)."""
    if isinstance(objs, dict):
        return [as_run(v, str(k)) for k, v in objs.items()]
    if isinstance(objs, (list, tuple)):
        return [as_run(o) for o in objs]
    return [as_run(objs)]


def common_and_labels(runs: Sequence[Run], context: bool = True) -> tuple[str, list[str]]:
    """The title part every run shares, and one legend label per run naming what differs (the cache always).
    The runtime that ran them goes on a line of its own in the title (or into the labels when it differs)."""
    parts: list[Callable[[Run], str]] = [
        lambda r: f"model {r.label.model} ({r.label.dtype})",
        lambda r: (
            device_text(r.label.device, r.label.prefill_device)
            + (", greedy token on the device" if r.label.token_on_device else "")
            + read_back_text(r.label.tokens_per_read)
        ),
    ]
    if context:
        parts.append(lambda r: r.context)
    runtime: Callable[[Run], str] = lambda r: runtime_text(r.label.device)  # noqa: E731
    common = [get for get in [*parts, runtime] if len({get(r) for r in runs}) == 1]
    differing = [get for get in [*parts, runtime] if get not in common]
    labels = []
    for r in runs:
        text = r.name or " \u00b7 ".join([str(r.label.cache)] + [get(r) for get in differing])
        labels.append(text + (" (recorded)" if r.recorded and "recorded" not in text else ""))
    if not runs:
        return "", labels
    shared = " \u00b7 ".join(get(runs[0]) for get in parts if get in common)
    return (shared + "<br>" + runtime(runs[0])) if runtime in common else shared, labels


def kv_bytes_per_tensor_token(run: Run) -> float | None:
    """Bytes one token adds to one KV tensor, derived from the records (None when they do not tell)."""
    f = run.frame
    held = f[f["used_cache_bytes"] > 0]
    tensors = int(f["cache_tensors_allocated"].max()) if not f.empty else 0
    if held.empty or tensors <= 0:
        return None
    length = (held["position"] + held["n_tokens"]).iloc[-1]
    return float(held["used_cache_bytes"].iloc[-1]) / float(length) / tensors


def dynamic_static_pairs(generations: Sequence[Any]) -> list[tuple[Any, Any]]:
    """(dynamic, static) pairs of runs (anything with ``label.cache.kind``, e.g. ``kvlab.Generation``s): the i-th run
    of each kind, in the order given; other kinds and the unpaired rest are left out."""
    dynamic = [g for g in generations if g.label.cache.kind == "dynamic"]
    static = [g for g in generations if g.label.cache.kind == "static"]
    return list(zip(dynamic, static))
