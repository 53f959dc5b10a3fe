"""The graph a captured decode step replays (``kvlab.ort.decode.caches.captured``): the model's, plus the outputs
that let a step need nothing from the host: ``NEXT_MASK``, the next step's attention mask, and, with the greedy
token on the device, ``NEXT``, the next step's input ids (``kvlab.ort.decode.greedy``). Both go to the device
buffers the next step reads (``capture_binding``); nothing is bound to host memory under capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ....core.errors import check_choice
from ...models.graph import derived_graph
from ..greedy import REDUCTIONS, greedy_nodes

NEXT_MASK = "kvlab_next_mask"  # a captured step's next attention mask: one more one (``next_mask``)
SUFFIX = ".kvlab-captured"  # the file's name: model.kvlab-captured[-reduction][-host-mask].onnx


def captured_graph(model: Any, reduction: str = "", shift_mask: bool = True) -> Path:
    """The graph a captured step of ``model`` replays, beside its model.onnx (rewritten when the model is newer): the
    greedy token of ``reduction`` ("": none) and, unless ``shift_mask=False``, the next mask (``next_mask``); the
    model's own path when there is nothing to add. ConfigError for another reduction, ModelError when the model's
    directory is not writeable."""
    if reduction:
        check_choice(reduction, REDUCTIONS, "reduction=")
    if not (reduction or shift_mask):
        return Path(model.onnx_path)
    tail = f"{'-' * bool(reduction)}{reduction}{'' if shift_mask else '-host-mask'}"

    def edit(m: Any) -> None:
        if reduction:
            greedy_nodes(m.graph, model, reduction)
        if shift_mask:
            next_mask(m.graph, model.info.input_names.get("attention_mask", "attention_mask"))

    return derived_graph(model, f"{SUFFIX}{tail}.onnx", edit, "graph for capture")


def next_mask(g: Any, mask: str) -> None:
    """Add ``NEXT_MASK``: the attention ``mask`` [1, L] (ones, then zeros) with one more one, what the next
    one-token step reads; computed in float32 (which WebGPU slices on both packages) and cast back. It goes to the
    other pair of step buffers, never to the mask this step reads."""
    from onnx import TensorProto, helper

    g.initializer.extend(
        [
            helper.make_tensor("kvlab_mask_start", TensorProto.INT64, [1], [0]),
            helper.make_tensor("kvlab_mask_end", TensorProto.INT64, [1], [-1]),  # the last position off
            helper.make_tensor("kvlab_mask_axis", TensorProto.INT64, [1], [1]),
            helper.make_tensor("kvlab_mask_one", TensorProto.FLOAT, [1, 1], [1.0]),  # a one in front
        ]
    )
    mask_type = next(i.type.tensor_type.elem_type for i in g.input if i.name == mask)
    node = helper.make_node
    g.node.extend(
        [
            node("Cast", [mask], ["kvlab_mask_f32"], to=TensorProto.FLOAT, name="kvlab/mask_f32"),
            node(
                "Slice",
                ["kvlab_mask_f32", "kvlab_mask_start", "kvlab_mask_end", "kvlab_mask_axis"],
                ["kvlab_mask_kept"],
                name="kvlab/mask_drop_last",
            ),
            node(
                "Concat", ["kvlab_mask_one", "kvlab_mask_kept"], ["kvlab_next_mask_f32"], axis=1, name="kvlab/next_mask"
            ),
            node("Cast", ["kvlab_next_mask_f32"], [NEXT_MASK], to=mask_type, name="kvlab/next_mask_cast"),
        ]
    )
    g.output.append(helper.make_tensor_value_info(NEXT_MASK, mask_type, [1, "kvlab_mask_length"]))
