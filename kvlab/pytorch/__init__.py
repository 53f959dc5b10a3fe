"""The PyTorch backend: Hugging Face transformers causal LMs through kvlab's contract (the same records, hooks and
``Generation`` as the ONNX Runtime backend), with transformers' DynamicCache and StaticCache, and ``GraphRunner``:
a CUDA-graph decode loop over a StaticCache. Importing it imports neither torch nor onnxruntime; ``GraphRunner``
and ``fuse_modules`` (which need torch) load on first use."""

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
    if name == "GraphRunner":
        from .graphs import GraphRunner

        return GraphRunner
    if name == "fuse_modules":
        from .fuse import fuse_modules

        return fuse_modules
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
