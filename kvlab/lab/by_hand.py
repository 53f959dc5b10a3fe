"""A KV cache written by hand: one tiny attention layer in numpy (float32, no runtime), decoded three ways (no cache,
a cache grown by concatenation, a cache written in place into one pre-allocated buffer), the checks of an
attendee's caches against the no-cache result, and exact counts of the bytes each way writes per step. Keys and
values are [heads, positions, head_dim]: ONNX Runtime's KV tensors without the batch axis.

    layer, xs = Layer(), inputs(12)
    np.allclose(decode_with(GrowingKV(), layer, xs), decode_without_cache(layer, xs))
    check_cache(MyCache, "static")                       # a Verdict, as kvlab.lab.exercises gives
    copies_chart({"dynamic": trace(GrowingKV(), layer, xs), ...})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .exercises import NO_ANSWER, Verdict
from .style import KIND_COLORS, finish, go, title


@dataclass
class Layer:
    """One attention layer with fixed random weights (seeded): ``d_model`` = ``heads`` x ``head_dim``."""

    heads: int = 4
    head_dim: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        d = self.heads * self.head_dim
        self.wq, self.wk, self.wv, self.wo = (rng.standard_normal((d, d), dtype=np.float32) / d**0.5 for _ in range(4))

    @property
    def d_model(self) -> int:
        """The width of a position's input and output vector."""
        return self.heads * self.head_dim

    def split(self, x: np.ndarray) -> np.ndarray:
        """[positions, d_model] -> [heads, positions, head_dim]."""
        return x.reshape(len(x), self.heads, self.head_dim).transpose(1, 0, 2)

    def project(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queries, keys and values of the positions ``x`` ([positions, d_model]), each split."""
        return self.split(x @ self.wq), self.split(x @ self.wk), self.split(x @ self.wv)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """The output of one query position ``q`` ([heads, 1, head_dim]) over the keys and values ``k``, ``v``
        ([heads, n, head_dim]) of every position up to and including its own: [d_model]."""
        scores = q @ k.transpose(0, 2, 1) / np.float32(self.head_dim**0.5)  # [heads, 1, n]
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        return (weights @ v).transpose(1, 0, 2).reshape(self.d_model) @ self.wo  # [d_model]


def inputs(steps: int, layer: Layer | None = None, seed: int = 1) -> np.ndarray:
    """``steps`` input vectors, one per decode step (seeded): [steps, d_model] float32."""
    d = (layer or Layer()).d_model
    return np.random.default_rng(seed).standard_normal((steps, d), dtype=np.float32)


def decode_without_cache(layer: Layer, xs: np.ndarray) -> np.ndarray:
    """The reference: step t projects the keys and values of all t + 1 positions again, then attends from the
    last one. Returns the outputs, [steps, d_model]."""
    out = []
    for t in range(len(xs)):
        q, k, v = layer.project(xs[: t + 1])
        out.append(layer.attend(q[:, -1:], k, v))
    return np.stack(out)


def decode_with(cache: Any, layer: Layer, xs: np.ndarray, on_step: Callable[..., None] | None = None) -> np.ndarray:
    """Step t projects only its own position, hands its key and value to ``cache.update(k, v)`` and attends over the
    keys and values of every position so far that it returns; ``on_step(t, k, v, keys, values)`` sees each step.
    Returns the outputs, [steps, d_model]; raises what the cache raises, TypeError when ``update`` returns other than
    two arrays."""
    out = []
    for t in range(len(xs)):
        q, k, v = layer.project(xs[t : t + 1])
        got = cache.update(k, v)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(a, np.ndarray) for a in got)):
            raise TypeError(f"update returned {type(got).__name__}, not (keys, values) as two arrays")
        if on_step is not None:
            on_step(t, k, v, *got)
        out.append(layer.attend(q, *got))
    return np.stack(out)


class GrowingKV:
    """A dynamic cache: every step concatenates the new position onto a fresh, one-position-longer array."""

    def __init__(self) -> None:
        self.keys = self.values = None  # [heads, positions, head_dim], None before the first step

    def update(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append this step's ``k``, ``v`` ([heads, 1, head_dim]); return all keys and values so far."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = np.concatenate([self.keys, k], axis=1)  # a new array: the old positions copied into it
            self.values = np.concatenate([self.values, v], axis=1)
        return self.keys, self.values


class PreallocatedKV:
    """A static cache: one buffer of ``max_len`` positions, allocated once; every step writes its position in
    place and returns views of the positions written so far. Raises IndexError past ``max_len``."""

    def __init__(self, heads: int, max_len: int, head_dim: int) -> None:
        self.keys = np.zeros((heads, max_len, head_dim), np.float32)
        self.values = np.zeros((heads, max_len, head_dim), np.float32)
        self.length = 0  # how many positions hold a token

    def update(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write this step's ``k``, ``v`` ([heads, 1, head_dim]) at ``length``; return views of the filled part."""
        if self.length == self.keys.shape[1]:
            raise IndexError(f"the cache holds {self.length} positions (max_len); no room for one more")
        self.keys[:, self.length] = k[:, 0]
        self.values[:, self.length] = v[:, 0]
        self.length += 1
        return self.keys[:, : self.length], self.values[:, : self.length]


def trace(cache: Any, layer: Layer, xs: np.ndarray) -> Any:
    """Decode ``xs`` with ``cache`` and count the bytes each step writes into cache memory: the new position's key
    and value, plus every earlier position when ``update`` returned arrays sharing no memory with the step before's
    (a fresh buffer the past was copied into). A pandas frame, a row per step: step, positions, fresh (bool),
    copied_bytes, written_bytes (copied + the new position)."""
    import pandas as pd

    rows, last = [], []

    def watch(t: int, k: np.ndarray, v: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        fresh = not last or not (np.shares_memory(keys, last[0]) and np.shares_memory(values, last[1]))
        new = k.nbytes + v.nbytes
        copied = keys.nbytes + values.nbytes - new if fresh else 0
        rows.append({"step": t, "positions": keys.shape[1], "fresh": fresh, "copied_bytes": copied,
                     "written_bytes": copied + new})  # fmt: skip
        last[:] = [keys, values]

    decode_with(cache, layer, xs, on_step=watch)
    return pd.DataFrame(rows)


def recomputed(layer: Layer, xs: np.ndarray) -> Any:
    """The no-cache decode counted as ``trace`` counts: step t writes the keys and values of all t + 1 positions
    again (fresh: True, copied_bytes: 0)."""
    import pandas as pd

    per_position = 2 * layer.d_model * np.dtype(np.float32).itemsize
    return pd.DataFrame(
        [
            {"step": t, "positions": t + 1, "fresh": True, "copied_bytes": 0, "written_bytes": (t + 1) * per_position}
            for t in range(len(xs))
        ]  # fmt: skip
    )


CHECK_STEPS, CHECK_LEN = 12, 16  # the steps ``check_cache`` decodes, and the positions of a static cache it builds


def check_cache(cls: Any, kind: str) -> Verdict:
    """An attendee's cache class, built as ``cls()`` (``kind`` "dynamic") or ``cls(heads, CHECK_LEN, head_dim)``
    ("static"), against the no-cache decode of one ``Layer`` over ``CHECK_STEPS`` steps: the same outputs at every
    step, and for a static one views of one buffer (no fresh buffer after the first step). A Verdict (ok None while
    ``cls`` is None or ... or its ``update`` returns None); never raises for the attendee's code, ValueError for an
    unknown ``kind``."""
    if kind not in ("dynamic", "static"):
        raise ValueError(f"kind is 'dynamic' or 'static', not {kind!r}")
    what = f"your {kind} cache"
    if cls in NO_ANSWER:
        return Verdict(None, f"define the class for {what} and pass it in")
    steps, layer = CHECK_STEPS, Layer()
    xs = inputs(steps)

    def make() -> Any:
        return cls() if kind == "dynamic" else cls(layer.heads, CHECK_LEN, layer.head_dim)

    try:
        if make().update(*layer.project(xs[:1])[1:]) is None:
            return Verdict(None, f"update returns None: write the body of {what}'s update")
        steps_seen = trace(make(), layer, xs)
        got = decode_with(make(), layer, xs)
    except Exception as exc:  # the attendee's code: any error is an answer to report
        return Verdict(False, f"{what} raised {type(exc).__name__}: {exc}")
    want = decode_without_cache(layer, xs)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        bad = int(np.argmax(~np.isclose(got, want, rtol=1e-4, atol=1e-5).all(axis=1))) if got.shape == want.shape else 0
        return Verdict(False, f"step {bad}'s output differs from the no-cache decode: check which positions you return")
    if kind == "static" and steps_seen.fresh[1:].any():
        t = int(steps_seen.index[steps_seen.fresh & (steps_seen.step > 0)][0])
        return Verdict(False, f"step {t} returned a new buffer: write into the one allocated in __init__")
    return Verdict(True, f"{what} gives the no-cache outputs at all {steps} steps")


def copies_chart(traces: Mapping[str, Any]) -> Any:
    """The bytes written per step against positions, one line per way (name -> a ``trace`` or ``recomputed`` frame):
    a name starting with a cache kind gets its colour; one starting "no cache" is grey, dashed and drawn on top (it
    lies on the dynamic line). A plotly figure."""
    fig = go().Figure()
    for name, f in sorted(traces.items(), key=lambda item: item[0].startswith("no cache")):  # grey on top
        grey = name.startswith("no cache")
        color = "#7f7f7f" if grey else KIND_COLORS.get(name.split()[0].strip(":"), "#9467bd")
        style = (
            {"mode": "lines", "line": {"color": color, "dash": "dash", "width": 2}}
            if grey
            else {"mode": "lines+markers", "line": {"color": color, "width": 3}, "marker": {"size": 5}}
        )
        fig.add_scatter(x=f.positions, y=f.written_bytes, name=name, **style)
    t = title("Bytes written into cache memory per step", "one tiny attention layer in numpy; exact counts")
    return finish(fig, t, xaxis_title="positions after the step", yaxis_title="bytes", yaxis_rangemode="tozero",
                  height=420)  # fmt: skip
