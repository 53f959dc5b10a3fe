"""What a PyTorch step allocated: the caching allocator's counters on CUDA (exact), an op-output count on CPU
(a proxy), and which KV tensors of a transformers cache are new objects after a step (exact, by identity).

Per-step columns (``kvlab.COLUMNS``) keep their meaning on this backend:

- ``run_ms``: the model's forward call; on CUDA up to a ``torch.cuda.synchronize()`` (exact device time + launch).
- ``cache_tensors_allocated`` / ``cache_bytes_allocated``: KV tensors of the cache that are new objects after the
  step (compared by identity, layer by layer): exact on every device. DynamicCache: 2 per layer every step
  (concatenation); StaticCache: 2 per layer at its lazy allocation, then 0.
- ``new_buffers``: of those, storages whose data_ptr this cache never held before (a lower bound, as on ORT).
- ``live_cache_bytes``, ``used_cache_bytes``: exact; ``rss_bytes``: process RSS (proxy).

``TorchStepRecord`` adds the allocator's churn per step (``ALLOC_COLUMNS``):

- on CUDA, exact, from ``torch.cuda.memory_stats()`` deltas over the step: ``alloc_requests``
  (``allocation.all.allocated``: tensors asked of the caching allocator), ``alloc_bytes``
  (``allocated_bytes.all.allocated``) and ``segments`` (``segment.all.allocated``: cudaMalloc calls);
- on CPU there is no allocator statistic: ``alloc_requests``/``alloc_bytes`` count the tensors (and bytes) the
  step's aten operators returned that are not views or in-place results of their inputs (a
  ``TorchDispatchMode`` counter; a proxy for malloc calls; opt in with ``count_cpu_allocs=True``: it runs every
  op through Python and slows a CPU step many times over, so wall_ms is then not a timing), else -1; ``segments``
  is -1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..core.records import COLUMNS, CacheStep, StepRecord
from .models import need_torch

if TYPE_CHECKING:  # pragma: no cover
    import torch

ALLOC_COLUMNS: dict[str, tuple[str, str]] = {
    "alloc_requests": (
        "CUDA: caching-allocator requests during the step (memory_stats allocation.all.allocated "
        "delta); CPU: non-view, non-in-place tensors returned by aten ops (opt-in, else -1)",
        "exact on CUDA, proxy on CPU",
    ),
    "alloc_bytes": ("bytes of those requests", "exact on CUDA, proxy on CPU"),
    "segments": (
        "CUDA: new cudaMalloc segments during the step (segment.all.allocated delta); CPU: -1",
        "exact on CUDA",
    ),
}


@dataclass
class TorchStepRecord(StepRecord):
    """A StepRecord plus the allocator's churn of the step (ALLOC_COLUMNS; exact on CUDA)."""

    alloc_requests: int = -1
    alloc_bytes: int = -1
    segments: int = -1


class AllocCounter:
    """Allocator requests/bytes/segments over a region: exact memory_stats deltas on CUDA, an op-output proxy on
    CPU (see the module docstring). ``with counter: ...`` then ``counter.result`` = (requests, bytes, segments)."""

    _KEYS = ("allocation.all.allocated", "allocated_bytes.all.allocated", "segment.all.allocated")

    def __init__(self, device: torch.device, cpu_proxy: bool = True):
        self.cuda = device.type == "cuda"
        self.device = device
        self.cpu_proxy = cpu_proxy
        self.result = (-1, -1, -1)
        self._mode = None

    def _stats(self) -> tuple[int, int, int]:
        s = need_torch().cuda.memory_stats(self.device)
        return tuple(int(s.get(k, 0)) for k in self._KEYS)  # type: ignore[return-value]

    def __enter__(self) -> AllocCounter:
        if self.cuda:
            self._before = self._stats()
        elif self.cpu_proxy:
            self._mode = _op_output_counter()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            after = self._stats()
            self.result = tuple(a - b for a, b in zip(after, self._before))  # type: ignore[assignment]
        elif self._mode is not None:
            self._mode.__exit__(*exc)
            self.result = (self._mode.count, self._mode.nbytes, -1)
            self._mode = None


def _op_output_counter():
    """A TorchDispatchMode counting fresh (non-view, non-in-place) tensors returned by aten ops."""
    torch = need_torch()
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0
            self.nbytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._schema.is_mutable or getattr(func, "is_view", False) or torch.Tag.view_copy in func.tags:
                return out
            inputs = {
                t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
            }
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    self.count += 1
                    self.nbytes += t.untyped_storage().nbytes()
            return out

    return _Counter()


class KVWatch:
    """Which KV tensors of a transformers cache are new objects after a step (exact, by identity)."""

    def __init__(self) -> None:
        self.prev: list[Any] = []
        self.seen: set[int] = set()

    @staticmethod
    def tensors(cache: Any) -> list[Any]:
        out = []
        for layer in getattr(cache, "layers", []):
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is not None and getattr(t, "numel", lambda: 0)():
                    out.append(t)
        return out

    def diff(self, cache: Any) -> CacheStep:
        """Tensors created since the last call, their bytes, fresh data_ptrs among them, and the live bytes."""
        now = self.tensors(cache)
        prev_ids = {id(t) for t in self.prev}
        created = [t for t in now if id(t) not in prev_ids]
        fresh = 0
        for t in created:
            if t.data_ptr() not in self.seen:
                fresh += 1
                self.seen.add(t.data_ptr())
        self.prev = now
        return CacheStep(len(created), sum(t.nbytes for t in created), fresh, sum(t.nbytes for t in now))


assert [f.name for f in fields(TorchStepRecord)] == [*COLUMNS, *ALLOC_COLUMNS]
