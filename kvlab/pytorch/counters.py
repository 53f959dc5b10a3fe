"""What a PyTorch step allocated: the caching allocator's counters on CUDA (exact), an op-output count on CPU (a
proxy), and which KV tensors of a transformers cache are new objects after a step (exact, by identity).

The per-step columns keep their meaning here: ``run_ms`` is the model's forward (on CUDA up to a synchronize);
``cache_tensors_allocated``/``cache_bytes_allocated`` count the cache's KV tensors that are new objects after the
step; ``new_buffers`` those whose storage this cache never held before (a lower bound); ``rss_bytes`` the process
RSS (a proxy). ``TorchStepRecord`` adds ``ALLOC_COLUMNS``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
# the tensors a transformers cache layer holds: keys and values, and a QuantizedCache's quantized older positions
LAYER_FIELDS = ("keys", "values", "_quantized_keys", "_quantized_values")


@dataclass
class TorchStepRecord(StepRecord):
    """A StepRecord plus the allocator's churn of the step (``ALLOC_COLUMNS``; exact on CUDA)."""

    alloc_requests: int = -1
    alloc_bytes: int = -1
    segments: int = -1


assert [f.name for f in fields(TorchStepRecord)] == [*COLUMNS, *ALLOC_COLUMNS]


@contextmanager
def counting_allocs(device: torch.device, cpu_proxy: bool = True) -> Iterator[list[int]]:
    """Allocator requests, bytes and segments over a ``with`` block, in the list it yields (filled on the way out):
    exact CUDA memory_stats deltas; on CPU with ``cpu_proxy``, the fresh tensors and bytes aten ops returned (a slow
    proxy), segments -1; else -1 each."""
    result = [-1, -1, -1]
    if device.type == "cuda":
        stats = need_torch().cuda.memory_stats
        keys = ("allocation.all.allocated", "allocated_bytes.all.allocated", "segment.all.allocated")
        before = stats(device)
        yield result
        after = stats(device)
        result[:] = [int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys]
    elif cpu_proxy:
        with _op_output_counter() as mode:
            yield result
        result[:] = [mode.count, mode.nbytes, -1]
    else:
        yield result


def _op_output_counter() -> Any:
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


def _plain_tensors(obj: Any) -> list[Any]:
    """Every plain tensor inside ``obj`` (tensor subclasses flattened, tuples, lists and dicts walked)."""
    torch = need_torch()
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return [t for n in names for t in _plain_tensors(getattr(obj, n))]
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _plain_tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _plain_tensors(o)]
    return []


def kv_tensors(cache: Any) -> list[Any]:
    """The non-empty tensors every layer of a transformers cache holds now (``LAYER_FIELDS``), in layer order."""
    layers = getattr(cache, "layers", [])
    return [t for layer in layers for f in LAYER_FIELDS for t in _plain_tensors(getattr(layer, f, None)) if t.numel()]


def held_bytes(cache: Any) -> int:
    """Bytes every layer of a transformers cache holds now (for a QuantizedCache: quantized data, scales, zero
    points and the residual window), each storage counted once."""
    return sum({t.data_ptr(): t.nbytes for t in kv_tensors(cache)}.values())


class KVWatch:
    """Which of a transformers cache's tensors (``kv_tensors``) are new objects after each step (exact, by
    identity); ``diff(cache)`` after every step."""

    def __init__(self) -> None:
        self.prev: list[Any] = []  # the tensors held after the last step (kept: their ids stay unique)
        self.seen: set[int] = set()  # every data_ptr held so far

    def diff(self, cache: Any) -> CacheStep:
        """Tensors created since the last call, their bytes, those on a new storage, and the bytes held now."""
        now = kv_tensors(cache)
        held = {id(t) for t in self.prev}
        created = [t for t in now if id(t) not in held]
        storages = {t.data_ptr() for t in created}
        fresh = len(storages - self.seen)
        self.seen |= storages
        self.prev = now
        return CacheStep(len(created), sum(t.nbytes for t in created), fresh, held_bytes(cache))
