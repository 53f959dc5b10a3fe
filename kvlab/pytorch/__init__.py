"""The PyTorch backend: transformers causal LMs through kvlab's contract (the same records, hooks and ``Generation``).
``models`` loads them, ``generate`` runs transformers' caches one recorded step at a time, ``counters`` says what each
step allocated, ``graphs.GraphRunner`` replays a decode step captured as a CUDA graph.

It may import ``kvlab.core`` and ``kvlab.presets``, never ``kvlab.ort``. Importing it imports neither torch nor
onnxruntime; ``GraphRunner`` and ``fuse_modules`` (which need torch) load on first use."""

from typing import Any

from .counters import ALLOC_COLUMNS, TorchStepRecord
from .generate import generate, make_cache
from .models import SHAPES, TorchModel, load, random_model
from .quantized import KV_PRECISIONS, QuantizedKV

__all__ = [
    "ALLOC_COLUMNS",
    "GraphRunner",
    "KV_PRECISIONS",
    "QuantizedKV",
    "SHAPES",
    "TorchModel",
    "TorchStepRecord",
    "fuse_modules",
    "generate",
    "load",
    "make_cache",
    "random_model",
]


def __getattr__(name: str) -> Any:
    if name in ("GraphRunner", "fuse_modules"):  # they import torch
        from . import fuse, graphs

        return getattr(graphs if name == "GraphRunner" else fuse, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
