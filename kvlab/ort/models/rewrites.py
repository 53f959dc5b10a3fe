"""Graph rewrites, each exact: it changes only the nodes it names, returns one line per change and raises ModelError for
a graph it cannot rewrite exactly.

- At build time (``for_ort127``, recorded in ``kvlab_recipe.json``): builder output for the architectures beyond
  full attention put in ops every package loads, and a window the builder drops put back.
- At load (``plain_graph``, beside model.onnx): the ring buffer and the state windows of 0 the builder's
  ``-e cpu`` asks for, dropped; kvlab's caches run that graph.
- On WebGPU (``cast_bool_gathers``, in memory): a Gather of bool data in int32.
- For a ring-buffer cache (``ring_graph``): sliding layers that evict inside GroupQueryAttention."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ModelError
from .graph import attr, derived_graph, elem_type


def constant(model: Any, name: str, value: np.ndarray) -> str:
    """``name``, an initializer of ``value`` in ``model`` (added unless it is there)."""
    from onnx import numpy_helper

    if not any(t.name == name for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def replace_nodes(model: Any, op_type: str, rewrite: Any) -> list[str]:
    """Rebuild the node list, each ``op_type`` node replaced where ``rewrite(node)`` gives (nodes, a line saying what
    changed) and kept where it gives None; returns the lines."""
    nodes, done = [], []
    for node in model.graph.node:
        out = rewrite(node) if node.op_type == op_type else None
        if out is None:
            nodes.append(node)
        else:
            nodes.extend(out[0])
            done.append(out[1])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


STATE_OPS = ("CausalConvWithState", "LinearAttention")  # the ops whose state_window 0 is what 1.27 computes


def drop_zero_state_windows(model: Any, strict: bool = False) -> list[str]:
    """Drop ``state_window=0`` from every ``STATE_OPS`` node (0 being what a runtime without the attribute computes);
    one set to another value is left as it is, or with ``strict`` a ModelError (onnxruntime 1.27 has no such
    attribute). Returns one line per node changed."""
    done = []
    for node in (n for n in model.graph.node if n.op_type in STATE_OPS):
        window = attr(node, "state_window", 0)
        if strict and window:
            raise ModelError(
                f"{node.op_type} node {node.name!r} has state_window={window}; onnxruntime 1.27 "
                "has no such attribute and computes the whole state (state_window 0) only"
            )
        for a in [a for a in node.attribute if a.name == "state_window" and a.type == a.INT and a.i == 0]:
            node.attribute.remove(a)
            done.append(f"{node.name}: state_window=0 dropped (0 is what a runtime without the attribute computes)")
    return done


PLAIN_SUFFIX = ".kvlab-plain.onnx"  # the plain-attention graph, beside a model.onnx that needs one


def plain_attention(model: Any) -> list[str]:
    """The graph as kvlab's caches run it: every GroupQueryAttention without ``sliding_window_cache`` (a sliding layer
    then reads the same last ``local_window_size`` positions of a buffer that keeps every one), and the state ops
    without ``state_window=0`` (``drop_zero_state_windows``). One line per node changed."""
    done = drop_zero_state_windows(model)
    for node in model.graph.node:
        found = next((a for a in node.attribute if a.name == "sliding_window_cache"), None)
        if node.op_type == "GroupQueryAttention" and found is not None:
            node.attribute.remove(found)
            window = attr(node, "local_window_size", -1)
            done.append(f"{node.name}: sliding_window_cache={found.i} dropped (window {window}: every position kept)")
    return done


def needs_plain(graph: Any) -> bool:
    """Whether ``plain_attention`` would change ``graph`` (``graph`` itself is left as it is)."""
    copy = type(graph)()
    copy.graph.node.extend(graph.graph.node)
    return bool(plain_attention(copy))


def plain_graph(model: Any) -> Path:
    """``model``'s graph (an object with ``onnx_path`` and ``name``) made plain (``plain_attention``), beside it
    (written again when the model is newer); returns its path. ModelError where its directory is not writable."""
    return derived_graph(model, PLAIN_SUFFIX, plain_attention, "plain-attention graph")


def decompose_linear_attention_gate(model: Any) -> list[str]:
    """``LinearAttentionGate(a, dt_bias, neg_exp_A, b)`` (Qwen3.5) in plain ops: decay = neg_exp_A * Softplus(a +
    dt_bias), beta = Sigmoid(b), as transformers' Qwen3.5 computes g and beta."""
    from onnx import helper

    def rewrite(node: Any) -> Any:
        a, dt_bias, neg_exp_a, b = node.input
        p = node.name
        return (
            [
                helper.make_node("Add", [a, dt_bias], [f"{p}/a_dt"], name=f"{p}/Add"),
                helper.make_node("Softplus", [f"{p}/a_dt"], [f"{p}/softplus"], name=f"{p}/Softplus"),
                helper.make_node("Mul", [f"{p}/softplus", neg_exp_a], [node.output[0]], name=f"{p}/Mul"),
                helper.make_node("Sigmoid", [b], [node.output[1]], name=f"{p}/Sigmoid"),
            ],
            f"{p}: LinearAttentionGate -> neg_exp_A * Softplus(a + dt_bias), Sigmoid(b) (not registered in "
            "onnxruntime 1.27)",
        )

    return replace_nodes(model, "LinearAttentionGate", rewrite)


def decompose_gated_rmsnorm(model: Any) -> list[str]:
    """``GatedRMSNorm(x, weight[D], z)`` (Qwen3.5) in plain ops: an RMS norm over each group of D values (one value
    head), times the weight, times SiLU(z). ModelError where the weight is not a 1-D initializer."""
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}

    def rewrite(node: Any) -> Any:
        x, weight, gate = node.input
        if weight not in inits or len(inits[weight].dims) != 1:
            raise ModelError(
                f"GatedRMSNorm node {node.name!r}: its weight {weight!r} is not a 1-D initializer; "
                "kvlab rewrites only the builder's form (one weight per value-head channel)"
            )
        group, eps, p = int(inits[weight].dims[0]), float(attr(node, "epsilon", 1e-6)), node.name
        grouped = constant(model, f"{p}/grouped_shape", np.array([0, 0, -1, group], np.int64))
        flat = constant(model, f"{p}/flat_shape", np.array([0, 0, -1], np.int64))
        return (
            [
                helper.make_node("Reshape", [x, grouped], [f"{p}/x4"], name=f"{p}/Reshape_groups"),
                helper.make_node(
                    "SimplifiedLayerNormalization",
                    [f"{p}/x4", weight],
                    [f"{p}/normed4"],
                    name=f"{p}/RMSNorm",
                    axis=-1,
                    epsilon=eps,
                    stash_type=1,
                ),
                helper.make_node("Reshape", [f"{p}/normed4", flat], [f"{p}/normed"], name=f"{p}/Reshape_back"),
                helper.make_node("Sigmoid", [gate], [f"{p}/sigmoid"], name=f"{p}/Sigmoid"),
                helper.make_node("Mul", [gate, f"{p}/sigmoid"], [f"{p}/silu"], name=f"{p}/SiLU"),
                helper.make_node("Mul", [f"{p}/normed", f"{p}/silu"], [node.output[0]], name=f"{p}/Mul"),
            ],
            f"{p}: GatedRMSNorm -> RMS norm over groups of {group} (eps {eps:g}) x SiLU(gate) (not registered "
            "in onnxruntime 1.27)",
        )

    return replace_nodes(model, "GatedRMSNorm", rewrite)


def mrope_to_rope(model: Any) -> list[str]:
    """``MRotaryEmbedding`` (Qwen3.5 configs with ``mrope_section``) as a ``RotaryEmbedding`` of the same rotary
    dimension on one position row: for text the three rows of M-RoPE positions (time, height, width) are equal."""
    from onnx import helper

    keep = ("interleaved", "num_heads", "rotary_embedding_dim")

    def rewrite(node: Any) -> Any:
        attrs = {k: attr(node, k) for k in keep if attr(node, k) is not None}
        new = helper.make_node(
            "RotaryEmbedding", list(node.input), list(node.output), name=node.name, domain=node.domain, **attrs
        )
        return (
            [new],
            f"{node.name}: MRotaryEmbedding (mrope_section {attr(node, 'mrope_section')}) -> "
            "RotaryEmbedding on one position row (text: the three rows are equal; not registered in "
            "onnxruntime 1.27)",
        )

    return replace_nodes(model, "MRotaryEmbedding", rewrite)


def text_position_ids(model: Any) -> list[str]:
    """A rank-3 ``position_ids`` input ([3, batch, sequence], Qwen3.5) read only by rotary embeddings becomes [batch,
    sequence]: the one row text has, which is what kvlab feeds every model. ModelError where another op reads it."""
    pos = next((i for i in model.graph.input if i.name == "position_ids"), None)
    if pos is None or len(pos.type.tensor_type.shape.dim) != 3:
        return []
    readers = {n.op_type for n in model.graph.node if "position_ids" in n.input}
    if not readers <= {"RotaryEmbedding"}:
        raise ModelError(
            f"position_ids [3, batch, sequence] is read by {sorted(readers)}; kvlab makes it [batch, "
            "sequence] only where rotary embeddings alone read it"
        )
    dims = pos.type.tensor_type.shape.dim
    del dims[0]
    return [
        "position_ids: [3, batch, sequence] -> [batch, sequence] (text: the three M-RoPE rows are equal; "
        "onnxruntime 1.27's RotaryEmbedding takes rank 2)"
    ]


def restore_sliding_window(model: Any, window: int, layers: Sequence[int]) -> list[str]:
    """Set ``local_window_size = window`` on the GroupQueryAttention of each of ``layers`` that has -1 (the builder sets
    it only on layers whose ``layer_types`` entry is "sliding_attention", which MistralConfig lacks). ModelError for a
    layer whose window disagrees with the config."""
    import re

    done = []
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        found = re.search(r"layers\.(\d+)/", node.name)
        if found is None or int(found.group(1)) not in layers:
            continue
        for a in node.attribute:
            if a.name == "local_window_size" and a.i != window:
                if a.i != -1:
                    raise ModelError(f"{node.name}: local_window_size is {a.i}, the config says {window}")
                a.i = window
                done.append(
                    f"{node.name}: local_window_size -1 -> {window} (builder 0.18 drops a window the "
                    "config has no layer_types for)"
                )
    return done


def for_ort127(model: Any, window: int = 0, sliding_layers: Sequence[int] = ()) -> list[str]:
    """Every rewrite above, in order; returns what changed (nothing, for a plain Llama)."""
    done = (
        drop_zero_state_windows(model, strict=True)
        + decompose_linear_attention_gate(model)
        + decompose_gated_rmsnorm(model)
    )
    done += mrope_to_rope(model) + text_position_ids(model)
    if window:
        done += restore_sliding_window(model, window, sliding_layers)
    return done


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
    """Every bool Gather as Cast(int32) -> Gather -> Cast(bool): the same values, on a kernel that does not crash
    onnxruntime-webgpu 1.27 (docs/known-limits.md)."""
    from onnx import TensorProto, helper

    targets = [model.graph.node[i] for i in bool_gathers(model)]  # nodes, not id()s: a node's id can be reused

    def rewrite(node: Any) -> Any:
        if node not in targets:
            return None
        data, out, p = node.input[0], node.output[0], node.name
        gather = helper.make_node("Gather", [f"{data}/kvlab_int32", *node.input[1:]], [f"{out}/kvlab_int32"], name=p)
        gather.attribute.extend(node.attribute)
        return (
            [
                helper.make_node(
                    "Cast", [data], [f"{data}/kvlab_int32"], to=TensorProto.INT32, name=f"{p}/kvlab_to_int32"
                ),
                gather,
                helper.make_node("Cast", [f"{out}/kvlab_int32"], [out], to=TensorProto.BOOL, name=f"{p}/kvlab_to_bool"),
            ],
            f"bool Gather {p!r} computed in int32 (onnxruntime-webgpu 1.27 crashes on bool Gather)",
        )

    return replace_nodes(model, "Gather", rewrite)


RING_SUFFIX = ".kvlab-ring.onnx"  # the ring graph's file, beside model.onnx


def ring_sliding_layers(model: Any) -> list[str]:
    """``sliding_window_cache=1`` on every sliding GroupQueryAttention (``local_window_size`` > 0): its past and present
    become a buffer of the window that the op itself evicts from. ModelError when the graph has no sliding
    GroupQueryAttention, or one with another value of the attribute."""
    from onnx import helper

    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and attr(n, "local_window_size", -1) > 0]
    if not nodes:
        raise ModelError(
            "the graph has no GroupQueryAttention with local_window_size > 0: no sliding layer to hold in a ring "
            "buffer (use a plain StaticCache)"
        )
    done = []
    for node in nodes:
        found = next((a for a in node.attribute if a.name == "sliding_window_cache"), None)
        if found is not None and found.i not in (0, 1):
            raise ModelError(f"{node.name}: sliding_window_cache={found.i}; kvlab sets 0 or 1 only")
        if found is None:
            node.attribute.append(helper.make_attribute("sliding_window_cache", 1))
        else:
            found.i = 1
        window = attr(node, "local_window_size")
        done.append(f"{node.name}: sliding_window_cache=1 (window {window}: its KV held in a ring buffer)")
    return done


def ring_graph(model: Any) -> Path:
    """The model's graph with ring buffers on its sliding layers (``ring_sliding_layers``), beside ``model.onnx`` (again
    when the model is newer); returns its path. ModelError: no sliding layer, or a directory not writable."""
    return derived_graph(model, RING_SUFFIX, ring_sliding_layers, "ring graph (for the ring-buffer cache)")
