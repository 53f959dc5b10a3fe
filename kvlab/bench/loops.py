"""The two decode loops ``kvlab profile lockstep`` takes in turns (``kvlab.bench.lockstep``): kvlab's static cache
stepped as ``generate`` steps it, and onnxruntime-genai's generator. Each ``step()`` decodes one token and keeps its
wall time and the calling thread's CPU time."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from ..ort import Model, StaticCache, Stepper
from ..ort.checks.references import genai_generator
from .variants import GenaiPeer


class Loop:
    """A decode loop taken in turns: ``step()`` decodes one token (``_advance``) and keeps its wall time (``ms``) and
    the calling thread's CPU time (``cpu_ms``: exact for that thread; work on the runtime's other threads is not
    in it). Where the two part, the thread waited (for the GPU, or for a core)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ms: list[float] = []
        self.cpu_ms: list[float] = []

    def step(self) -> None:
        """One decode step, timed: its token, wall time and CPU time appended."""
        self._timed(lambda: [self._advance()])

    def _timed(self, advance: Callable[[], list[int]]) -> None:
        """Run ``advance`` (it decodes and returns tokens) and keep its tokens, each with an equal share of its
        wall and CPU time."""
        wall, cpu = time.perf_counter(), time.thread_time()
        tokens = advance()
        k = len(tokens)
        self.cpu_ms += [(time.thread_time() - cpu) * 1e3 / k] * k
        self.ms += [(time.perf_counter() - wall) * 1e3 / k] * k
        self.tokens += tokens

    def steps(self, n: int) -> None:
        """``n`` decode steps, one at a time."""
        for _ in range(n):
            self.step()

    def _advance(self) -> int:
        raise NotImplementedError


class KvlabLoop(Loop):
    """kvlab's loop on a new static cache: prefilled on entry. With ``per_read`` > 1 its steps run in bursts whose
    tokens are read back together (``Stepper.decode``, as ``generate`` runs them): each step of a burst is given
    the burst's wall and CPU time divided by its steps, the time per token."""

    def __init__(self, model: Model, dev: Any, ids: np.ndarray, reduction: str, cache: StaticCache, per_read: int):
        super().__init__()
        self.model, self.dev, self.ids, self.reduction, self.cache = model, dev, ids, reduction, cache
        self.per_read = per_read

    def __enter__(self) -> KvlabLoop:
        with ExitStack() as stack:
            stack.enter_context(self.cache)
            on_device = self.reduction or False
            self.stepper = stack.enter_context(
                Stepper(self.model, self.cache, self.dev, self.cache.max_cache_len, (), on_device, False, self.per_read)
            )
            _, first = self.stepper.step(self.ids, logits_out="none")  # the prefill, as generate() runs it
            self.tokens.append(first.token)
            self._close = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close.__exit__(*exc)

    def _advance(self) -> int:
        return self.stepper.step(np.array([self.tokens[-1]], np.int64), logits_out="none")[1].token

    def steps(self, n: int) -> None:
        """``n`` decode steps: one at a time, or in bursts of ``per_read`` read back together."""
        if self.per_read <= 1:
            super().steps(n)
            return
        for start in range(0, n, self.per_read):
            k = min(self.per_read, n - start)
            self._timed(lambda k=k: [r.token for r in self.stepper.decode(self.tokens[-1], k)])


class GenaiLoop(Loop):
    """onnxruntime-genai's loop: a generator prefilled on entry."""

    def __init__(self, peer: GenaiPeer, ids: np.ndarray, new: int):
        super().__init__()
        self.peer, self.ids, self.new = peer, ids, new

    def __enter__(self) -> GenaiLoop:
        self.gen = genai_generator(self.peer.model, self.ids, self.new)
        self.gen.generate_next_token()  # the first call samples the prefill's logits: no forward pass
        self.tokens.append(int(self.gen.get_next_tokens()[0]))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gen = None

    def _advance(self) -> int:
        self.gen.generate_next_token()
        return int(self.gen.get_next_tokens()[0])
