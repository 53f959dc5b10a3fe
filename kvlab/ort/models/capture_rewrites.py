"""Build-time rewrites of a mobius Gemma 4 graph for WebGPU graph capture (``kvlab.load("kv-shared-toy",
graph_capture=True)``): the nodes ONNX Runtime places on the CPU EP, which a captured graph cannot hold
(``kvlab.ort.decode.caches.captured``), rewritten into ops both packages run on WebGPU. In the style of
``kvlab.ort.models.rewrites``: each changes only the nodes it names, is exact, returns one line per change (recorded
in ``kvlab_recipe.json``) and raises ModelError for a graph it cannot rewrite exactly.

- ``empty_kv_by_slice``: a KV-shared layer's empty keys and values, ``ConstantOfShape(Concat(Shape(q)[0:1],
  [0, width]))`` (no WebGPU kernel in either package), become ``Slice(q, [0, 0], [0, width], axes [1, 2])``: the
  same [batch, 0, width] tensor (no values to differ), from a node of the query the layer already has.
- ``int32_mask_lengths``: the attention mask's ``ReduceSum`` and the ``Sub`` of one in int64 (onnxruntime-webgpu
  1.27 runs neither in int64 on WebGPU) become a Cast of the mask to int32 first, then both in int32: the mask
  holds 0 and 1, its sum is at most its length, so every value is the same; the two Casts to int32 that read them
  were already there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.errors import ModelError
from .graph import producers, uses
from .rewrites import _const, _replace

INT32, INT64 = 6, 7  # onnx.TensorProto


def _ints(model: Any, name: str) -> list[int] | None:
    """The int values of a Constant node's output or an initializer ``name``; None when it is neither."""
    from onnx import helper, numpy_helper

    init = next((t for t in model.graph.initializer if t.name == name), None)
    if init is not None:
        return [int(v) for v in numpy_helper.to_array(init).ravel()]
    node = producers(model).get(name)
    if node is None or node.op_type != "Constant":
        return None
    value = helper.get_attribute_value(node.attribute[0])
    if node.attribute[0].name == "value":
        return [int(v) for v in numpy_helper.to_array(value).ravel()]
    return [int(v) for v in np.ravel(value)]


def empty_kv_by_slice(model: Any) -> list[str]:
    """Each ConstantOfShape making a KV-shared layer's empty keys and values (read only as GroupQueryAttention's
    key and value) as a Slice of that layer's query (see the module docstring). ModelError where its shape is not
    ``Concat(Shape(q)[0:1], [0, width])`` with width at most the query's."""
    from onnx import helper

    made_by, read_by = producers(model), uses(model)
    feeding: list[Any] = []  # the nodes that made each rewritten node's shape

    def rewrite(node: Any) -> Any:
        if node.op_type != "ConstantOfShape":
            return None
        readers = read_by.get(node.output[0], [])
        if not readers or any(r.op_type != "GroupQueryAttention" or i not in (1, 2) for r, i in readers):
            return None  # not a layer's empty keys and values: left alone
        concat = made_by.get(node.input[0])
        shape = made_by.get(concat.input[0]) if concat is not None and concat.op_type == "Concat" else None
        rest = _ints(model, concat.input[1]) if shape is not None and len(concat.input) == 2 else None
        query = readers[0][0].input[0]
        if (
            shape is None
            or shape.op_type != "Shape"
            or shape.input[0] != query
            or {(a.name, a.i) for a in shape.attribute} != {("start", 0), ("end", 1)}
            or rest is None
            or len(rest) != 2
            or rest[0] != 0
        ):
            raise ModelError(
                f"ConstantOfShape node {node.name!r}: its shape is not Concat(Shape(query)[0:1], [0, width]); "
                "kvlab rewrites only mobius's empty keys and values of a KV-shared layer"
            )
        feeding.extend([concat, shape, made_by.get(concat.input[1])])
        p = node.name
        starts = _const(model, f"{p}/starts", np.array([0, 0], np.int64))
        ends = _const(model, f"{p}/ends", np.array([0, rest[1]], np.int64))
        axes = _const(model, f"{p}/axes", np.array([1, 2], np.int64))
        return (
            [helper.make_node("Slice", [query, starts, ends, axes], list(node.output), name=f"{p}/as_Slice")],
            f"{p}: ConstantOfShape [batch, 0, {rest[1]}] -> Slice(query, [0, 0], [0, {rest[1]}], axes [1, 2]) "
            "(the same empty tensor; no WebGPU ConstantOfShape in either package)",
        )

    done = _replace(model, rewrite)
    _drop_unread(model, [n for n in feeding if n is not None])
    return done


def _drop_unread(model: Any, candidates: list[Any]) -> None:
    """Remove those of ``candidates`` (in order) whose outputs nothing reads any more."""
    outputs = {o.name for o in model.graph.output}
    for node in candidates:
        read = uses(model)
        if not any(o in read or o in outputs for o in node.output):
            model.graph.node.remove(node)


def int32_mask_lengths(model: Any, mask: str = "attention_mask") -> list[str]:
    """The int64 ReduceSum of ``mask`` and the Sub of one from it in int32, after a Cast of the mask (see the
    module docstring). Nothing when the mask is not summed in int64; ModelError where the sum or the difference
    is read by anything but a Cast to int32, or the Sub's one is not a constant 1."""
    from onnx import helper

    read_by = uses(model)
    sums = [n for n, _ in read_by.get(mask, []) if n.op_type == "ReduceSum"]
    if not sums:
        return []
    done, casted = [], f"{mask}/as_int32"
    for total in sums:
        subs = [n for n, i in read_by.get(total.output[0], []) if n.op_type == "Sub" and i == 0]
        for name in [total.output[0], *(s.output[0] for s in subs)]:
            others = [n for n, _ in read_by.get(name, []) if n not in subs]
            if any(n.op_type != "Cast" or next(a.i for a in n.attribute if a.name == "to") != INT32 for n in others):
                raise ModelError(
                    f"{name!r} (the mask's length) is read by {sorted({n.op_type for n in others})}; kvlab "
                    "computes it in int32 only where it is read as a Cast to int32"
                )
        for sub in subs:
            if _ints(model, sub.input[1]) != [1]:
                raise ModelError(f"Sub node {sub.name!r} subtracts {sub.input[1]!r}, not a constant 1")
            sub.input[1] = _const(model, f"{sub.name}/one_int32", np.array(1, np.int32))
        total.input[0] = casted
        done.append(
            f"{total.name}: ReduceSum of {mask} (and {len(subs)} Sub of one) in int32 after a Cast (int64 on "
            "WebGPU in onnxruntime-webgpu 1.27: neither op)"
        )
    cast = helper.make_node("Cast", [mask], [casted], name=f"{mask}/Cast_int32", to=INT32)
    model.graph.node.insert(0, cast)
    changed = {n.output[0] for n in sums} | {n.output[0] for t in sums for n, _ in read_by.get(t.output[0], [])}
    keep = [v for v in model.graph.value_info if v.name not in changed]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    return done


def for_capture(model: Any) -> list[str]:
    """Both rewrites, in order; what changed."""
    return empty_kv_by_slice(model) + int32_mask_lengths(model)
