"""The graph a captured decode step replays (``kvlab.ort.decode.capture``): the model's, plus the outputs that let a
step need nothing from the host: ``NEXT_MASK``, the next step's attention mask, and, with the greedy token on the
device, ``NEXT``, the next step's input ids (``kvlab.ort.decode.greedy``). Both go to the device buffers the next
step reads (``kvlab.ort.decode.captured_step``); nothing is bound to host memory under capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.errors import check_choice
from .greedy import REDUCTIONS, beside, greedy_nodes, load_graph_only, save_beside

NEXT_MASK = "kvlab_next_mask"  # a captured step's next attention mask: one more one (``next_mask``)


def captured_graph(model: Any, reduction: str = "", shift_mask: bool = True) -> Path:
    """The graph a captured step of ``model`` replays, beside its model.onnx (rewritten when the model is newer):
    the greedy token of ``reduction`` ("": none, the host chooses) and, unless ``shift_mask=False``, the next mask
    (``next_mask``). The model's own path when there is nothing to add. ConfigError for another reduction,
    ModelError when the model's directory is not writeable."""
    if reduction:
        check_choice(reduction, REDUCTIONS, "reduction=")
    tail = f"{'-' * bool(reduction)}{reduction}{'' if shift_mask else '-host-mask'}"
    dst = beside(model, f".kvlab-capture{tail}.onnx")
    if dst.is_file() and dst.stat().st_mtime >= Path(model.onnx_path).stat().st_mtime:
        return dst
    m = load_graph_only(model)
    if reduction:
        greedy_nodes(m.graph, model, reduction)
    shifted = shift_mask and next_mask(m.graph, model.info.input_names.get("attention_mask", "attention_mask"))
    if not (reduction or shifted):
        return Path(model.onnx_path)
    save_beside(m, dst, model.name, "graph for capture")
    return dst


def next_mask(g: Any, mask: str) -> bool:
    """Add ``NEXT_MASK``: the attention ``mask`` [1, L] (ones, then zeros) shifted by one position with a one
    coming in, i.e. one more one: what the next one-token step reads. Built where the mask's only reader is the
    graph's own cast of it to int32 (both builders' graphs for capture): the shift pads that int32 copy (WebGPU pads
    int32, not int64) and casts back, so it runs after the graph has read the mask. False (nothing added) for any
    other graph."""
    from onnx import TensorProto, helper

    readers = [n for n in g.node if mask in n.input]
    cast = readers[0] if len(readers) == 1 and readers[0].op_type == "Cast" else None
    if cast is None or [a.i for a in cast.attribute if a.name == "to"] != [TensorProto.INT32]:
        return False
    g.initializer.extend(
        [
            helper.make_tensor("kvlab_mask_shift", TensorProto.INT64, [4], [0, 1, 0, -1]),  # one in front, one off
            helper.make_tensor("kvlab_mask_one", TensorProto.INT32, [], [1]),
        ]
    )
    mask_type = next(i.type.tensor_type.elem_type for i in g.input if i.name == mask)
    shift = [cast.output[0], "kvlab_mask_shift", "kvlab_mask_one"]
    g.node.extend(
        [
            helper.make_node("Pad", shift, ["kvlab_next_mask_i32"], name="kvlab/next_mask"),
            helper.make_node("Cast", ["kvlab_next_mask_i32"], [NEXT_MASK], to=mask_type, name="kvlab/next_mask_cast"),
        ]
    )
    g.output.append(helper.make_tensor_value_info(NEXT_MASK, mask_type, [1, "kvlab_mask_length"]))
    return True
