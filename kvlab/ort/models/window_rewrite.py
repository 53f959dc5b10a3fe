"""The ring-buffer variant of a model's graph: ``sliding_window_cache=1`` on the GroupQueryAttention of every
sliding layer (those with ``local_window_size`` > 0), written once beside ``model.onnx`` as
``model.kvlab-ring.onnx`` (the weights stay the model's own file, referenced, not copied), as
``kvlab.ort.decode.greedy`` writes its graph.

What the attribute does (onnxruntime 1.31's CPU kernel, ``onnxruntime/contrib_ops/cpu/bert/group_query_attention.cc``):
the node's past and present buffers have a capacity ``C >= local_window_size`` (the past's axis 2; the present
comes back with the same shape) instead of the sequence's length; ``seqlens_k`` and ``total_sequence_length`` stay
absolute, so the graph's inputs (ids, attention mask of the whole sequence) are unchanged. Rows ``[0, end(P))``
hold the newest positions in order, ``end`` a function of the absolute past length ``P`` alone (the op keeps no
state): ``P`` while ``P <= C``, then ``P`` minus whole blocks of ``C - W + 1`` rows reclaimed by one shift to the
front (with ``C == W``: every step shifts ``W - 1`` rows). RoPE is applied at absolute positions before, so the
windowed attention is exact. A step whose shift would drop rows its own first query still reads (a prompt longer
than ``C``, a multi-token step) runs against a temporary staging buffer of ``end + S`` rows and writes back only the
newest rows. Past and present may be one buffer (the in-place path the kernel takes when their pointers are equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.errors import ModelError
from .graph import derived_graph

SUFFIX = ".kvlab-ring.onnx"
ATTRIBUTE = "sliding_window_cache"


def _window(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "local_window_size"), -1)


def windowed_nodes(model: Any) -> list[Any]:
    """The GroupQueryAttention nodes of an ONNX model that slide (``local_window_size`` > 0)."""
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and _window(n) > 0]


def ring_sliding_layers(model: Any) -> list[str]:
    """Set ``sliding_window_cache=1`` on every sliding GroupQueryAttention (full-attention ones are left alone);
    returns one line per node changed. ModelError when the graph has no sliding GroupQueryAttention, or one that
    already has another value of the attribute."""
    from onnx import helper

    nodes, done = windowed_nodes(model), []
    if not nodes:
        raise ModelError(
            "the graph has no GroupQueryAttention with local_window_size > 0: no sliding layer to hold in a ring "
            "buffer (use a plain StaticCache)"
        )
    for node in nodes:
        found = next((a for a in node.attribute if a.name == ATTRIBUTE), None)
        if found is not None and found.i not in (0, 1):
            raise ModelError(f"{node.name}: {ATTRIBUTE}={found.i}; kvlab sets 0 or 1 only")
        if found is None:
            node.attribute.append(helper.make_attribute(ATTRIBUTE, 1))
        else:
            found.i = 1
        done.append(f"{node.name}: {ATTRIBUTE}=1 (window {_window(node)}: its KV held in a ring buffer)")
    return done


def ring_graph(model: Any) -> Path:
    """The model's graph with ring buffers on its sliding layers (``ring_sliding_layers``), beside ``model.onnx``
    (written again when the model is newer); returns its path. Raises ModelError when the graph has no sliding
    layer or the model's directory is not writable."""
    return derived_graph(model, SUFFIX, ring_sliding_layers, "ring graph (for the ring-buffer cache)")
