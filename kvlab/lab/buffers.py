"""Which device buffer holds each KV tensor after every step: the same one as the step before, one the pool handed
back, or one never seen before. A buffer's identity is its ``data_ptr`` (on WebGPU, the WGPUBuffer handle); "fresh",
a handle this run has not held before, is a lower bound of CreateBuffer calls (Dawn may reuse an address).

    watch = BufferWatch(cache)
    kvlab.generate(model, ids, cache=cache, on_step=watch)
    plots.buffer_map([watch])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.records import StepRecord

STATES = ("in place", "recycled", "fresh")  # same buffer as the step before / a handle seen earlier / never seen


@dataclass
class BufferWatch:
    """A step hook: after every step, the state of each KV tensor's buffer (``STATES``), in the cache's order."""

    cache: Any  # the kvlab cache whose tensors are watched
    name: str = ""  # legend name (default: the cache's spec)
    steps: list[int] = field(default_factory=list)  # the step index of each row
    lengths: list[int] = field(default_factory=list)  # cache length after the step
    wall_ms: list[float] = field(default_factory=list)
    states: list[list[str]] = field(default_factory=list)  # [step][tensor] -> one of STATES

    def __post_init__(self) -> None:
        self.name = self.name or str(self.cache.spec)
        self._last: list[int] = []
        self._seen: set[int] = set()

    def __call__(self, record: StepRecord) -> None:
        if self.cache.device is None or record.device != self.cache.device.name:
            return  # a step on another device (a CPU prefill before its handoff to this cache)
        ptrs = [t.data_ptr for t in self.cache.tensors]
        row = [
            "in place" if i < len(self._last) and p == self._last[i] else "recycled" if p in self._seen else "fresh"
            for i, p in enumerate(ptrs)
        ]
        self._seen.update(ptrs)
        self._last = ptrs
        self.steps.append(record.step)
        self.lengths.append(record.position + record.n_tokens)
        self.wall_ms.append(record.wall_ms)
        self.states.append(row)

    def counts(self, state: str) -> list[int]:
        """Per step, how many tensors were in ``state``."""
        return [row.count(state) for row in self.states]


def watched_runs(
    model: Any, ids: Any, caches: Any, device: str, new_tokens: int, prefill_device: str | None = None
) -> tuple[list[BufferWatch], list[Any]]:
    """One greedy generation of ``new_tokens`` per fresh kvlab cache of ``caches`` (each disposed after its run),
    watched: (the ``BufferWatch``es, the generations), in order. Raises what ``generate`` raises."""
    from ..ort import generate

    watches, runs = [], []
    for cache in caches:
        with cache:
            watch = BufferWatch(cache)
            runs.append(generate(model, ids, cache=cache, device=device, prefill_device=prefill_device,
                                 max_new_tokens=new_tokens, stop_on_eos=False, on_step=watch))  # fmt: skip
            watches.append(watch)
    return watches, runs
