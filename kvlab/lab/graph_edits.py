"""Edits a lesson makes to a built ONNX model to show what a runtime refuses: a copy of the model's folder with one
node more, the same tokens out. The source folder is never written."""

from __future__ import annotations

import shutil
from pathlib import Path


def with_constant_of_shape(src: Path, out: Path) -> Path:
    """A copy of the model folder ``src`` (a ``model.onnx`` with its weights in ``model.onnx.data``) at ``out``,
    whose ``logits`` gain a ConstantOfShape of zeros shaped like them (Shape, ConstantOfShape, Add, named
    ``lesson/*``): the same tokens, through one node that has no WebGPU kernel. Returns ``out``. FileExistsError
    where ``out`` exists; StopIteration where no node outputs ``logits``; ``src`` is left unchanged."""
    import onnx
    from onnx import TensorProto, helper

    shutil.copytree(src, out)
    model = onnx.load(str(out / "model.onnx"))
    last = next(n for n in model.graph.node if "logits" in n.output)
    last.output[list(last.output).index("logits")] = "logits_before"
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    model.graph.node.extend(
        [
            helper.make_node("Shape", ["logits_before"], ["shape"], name="lesson/Shape"),
            helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="lesson/ConstantOfShape", value=zero),
            helper.make_node("Add", ["logits_before", "zeros"], ["logits"], name="lesson/Add"),
        ]
    )
    (out / "model.onnx.data").unlink()
    onnx.save(model, str(out / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return out
