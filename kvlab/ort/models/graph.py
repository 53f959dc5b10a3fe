"""Reading an ONNX decoder graph without its weights: who makes each output, who reads each tensor, dtypes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ModelError
from ...core.paths import write_atomic

# ONNX TensorProto element types kvlab meets in KV caches
FLOAT16 = 10  # TensorProto.FLOAT16
ONNX_DTYPES: dict[int, Any] = {1: np.dtype(np.float32), FLOAT16: np.dtype(np.float16), 16: "bfloat16"}


def load_graph(onnx_file: Path) -> Any:
    """The ModelProto of ``onnx_file`` without its external weights (fast, small); ModelError when it is not a
    readable ONNX model."""
    import onnx

    try:
        return onnx.load(str(onnx_file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others
        raise ModelError(f"{onnx_file} is not a readable ONNX model: {exc}") from exc


def derived_graph(model: Any, suffix: str, edit: Callable[[Any], Any], what: str) -> Path:
    """A graph kvlab derives from ``model``: its ModelProto (weights left where they are, referenced by relative
    path) changed by ``edit``, written beside its model.onnx as ``model<suffix>`` (again when the model is newer,
    atomically: a concurrent reader sees the old file or the new one); returns its path. ModelError, naming ``what``
    was written, when the model's directory is not writable."""
    src = Path(model.onnx_path)
    dst = src.with_name(src.name.removesuffix(".onnx") + suffix)
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    m = load_graph(src)
    edit(m)
    try:
        write_atomic(dst, m.SerializeToString())
    except OSError as exc:
        raise ModelError(
            f"kvlab writes model {model.name}'s {what} beside its model.onnx, in {dst.parent}, which failed "
            f"({exc.strerror or exc}); copy the model directory somewhere writable and load it from there"
        ) from exc
    return dst


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


def weight_format(model: Any) -> str:
    """What the projections' weights are: "int<bits>" for MatMulNBits, else the dtype of MatMul weight initializers."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
            return f"int{bits}"
    types = {inits[n.input[1]].data_type for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    names = sorted(np.dtype(ONNX_DTYPES[t]).name for t in types if t in ONNX_DTYPES and ONNX_DTYPES[t] != "bfloat16")
    return "+".join(names) or "unknown"


def bool_gathers(model: Any) -> list[int]:
    """The indices of the Gather nodes whose data input is a bool tensor (types from ONNX shape inference)."""
    import onnx
    from onnx import shape_inference

    typed = shape_inference.infer_shapes(model)
    types = {v.name: elem_type(v) for v in [*typed.graph.value_info, *typed.graph.input]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return [
        i
        for i, n in enumerate(model.graph.node)
        if n.op_type == "Gather" and types.get(n.input[0]) == onnx.TensorProto.BOOL
    ]


def cast_bool_gathers(model: Any) -> list[str]:
    """Rewrite every bool Gather as Cast(int32) -> Gather -> Cast(bool), in place (the same values); returns the
    rewritten nodes' names. Why: the built-in package's WebGPU Gather crashes the process on bool data
    (``kvlab.ort.runtime.builtin``)."""
    from onnx import TensorProto, helper

    targets = set(bool_gathers(model))
    nodes, names = [], []
    for i, node in enumerate(model.graph.node):
        if i not in targets:
            nodes.append(node)
            continue
        data, out = node.input[0], node.output[0]
        nodes.append(
            helper.make_node(
                "Cast", [data], [f"{data}/kvlab_int32"], to=TensorProto.INT32, name=f"{node.name}/kvlab_to_int32"
            )
        )
        gather = helper.make_node(
            "Gather", [f"{data}/kvlab_int32", *node.input[1:]], [f"{out}/kvlab_int32"], name=node.name
        )
        gather.attribute.extend(node.attribute)
        nodes.append(gather)
        nodes.append(
            helper.make_node(
                "Cast", [f"{out}/kvlab_int32"], [out], to=TensorProto.BOOL, name=f"{node.name}/kvlab_to_bool"
            )
        )
        names.append(node.name)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return names
