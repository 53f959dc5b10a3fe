"""Reading an ONNX decoder graph without its weights: who makes each output, who reads each tensor, dtypes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ModelError

# ONNX TensorProto element types kvlab meets in KV caches
ONNX_DTYPES: dict[int, Any] = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 16: "bfloat16"}


def load_graph(onnx_file: Path) -> Any:
    """The ModelProto of ``onnx_file`` without its external weights (fast, small)."""
    import onnx

    try:
        return onnx.load(str(onnx_file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others
        raise ModelError(f"{onnx_file} is not a readable ONNX model: {exc}") from exc


def producers(model: Any) -> dict[str, Any]:
    """Tensor name -> the node that makes it."""
    return {out: node for node in model.graph.node for out in node.output}


def uses(model: Any) -> dict[str, list[tuple[Any, int]]]:
    """Tensor name -> every (node, input index) that reads it."""
    out: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            out.setdefault(name, []).append((node, i))
    return out


def elem_type(value_info: Any) -> int:
    return value_info.type.tensor_type.elem_type
