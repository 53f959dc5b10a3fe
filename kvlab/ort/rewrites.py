"""Build-time graph rewrites: what the onnxruntime-genai builder (0.18) emits for the architectures beyond full
attention that onnxruntime 1.27 cannot load or computes differently from transformers, rewritten into ops 1.27
has. Each rewrite changes only the nodes it names, returns one line per change (recorded in the model's
``kvlab_recipe.json``) and is tested for token equality with transformers (tests/test_beyond_full.py).

Measured with onnxruntime-webgpu 1.27.0 (its contrib schemas, ``get_all_operator_schema()``), builder 0.18.0 and
transformers 5.24.0, 2026-12-01:

- ``state_window``: builder 0.18 writes the attribute ``state_window=0`` on every ``CausalConvWithState`` and
  ``LinearAttention`` node; 1.27's schemas do not have it ("Unrecognized attribute: state_window for operator
  CausalConvWithState"). 0 means "no window" (the whole state), which is what 1.27 computes: the attribute is
  dropped. A non-zero value cannot be dropped and is refused.
- ``LinearAttentionGate(a, dt_bias, neg_exp_A, b)`` (Qwen3.5) is not registered in 1.27 ("com.microsoft:
  LinearAttentionGate(-1) is not a registered function/op"): decay = neg_exp_A * Softplus(a + dt_bias), beta =
  Sigmoid(b), as transformers' Qwen3.5 computes g and beta.
- ``GatedRMSNorm(x, weight[D], z)`` (Qwen3.5) is not registered either: an RMS norm over each group of D values
  (one value head), times the weight, times SiLU(z).
- ``MRotaryEmbedding`` (Qwen3.5 configs with ``mrope_section``) is not registered: for text, the three rows of
  M-RoPE positions (time, height, width) are equal, so it is a plain ``RotaryEmbedding`` of the same rotary
  dimension on one row.
- ``position_ids`` of rank 3 ([3, batch, sequence], Qwen3.5): 1.27's RotaryEmbedding takes rank 2 ("Input
  'position_ids' is expected to have 0, 1, or 2 dimensions, got 3"; on WebGPU an invalid shader module). The
  input becomes [batch, sequence] (the one row text has), which is what kvlab feeds every model.
- Mistral's window: builder 0.18 reads ``config.sliding_window`` but sets ``local_window_size`` only on layers
  whose ``layer_types`` entry is "sliding_attention"; MistralConfig has no layer_types, so every layer gets -1
  and the model silently attends to everything (its tokens then equal transformers' with no window). The window
  is written back on the layers the config makes slide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ModelError

STATE_OPS = ("CausalConvWithState", "LinearAttention")


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def strip_state_window(model: Any) -> list[str]:
    done = []
    for node in model.graph.node:
        if node.op_type not in STATE_OPS:
            continue
        for a in list(node.attribute):
            if a.name == "state_window":
                if a.i != 0:
                    raise ModelError(
                        f"{node.op_type} node {node.name!r} has state_window={a.i}; onnxruntime 1.27 "
                        "has no such attribute and computes the whole state (state_window 0) only"
                    )
                node.attribute.remove(a)
                done.append(
                    f"{node.name}: state_window=0 dropped (onnxruntime 1.27's {node.op_type} has no such "
                    "attribute; 0 is its behaviour)"
                )
    return done


def _const(model: Any, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    if not any(t.name == name for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _replace(model: Any, rewrite: Any) -> list[str]:
    """Rebuild the node list, each node replaced by ``rewrite(node)`` (a list of nodes, or None to keep it)."""
    nodes, done = [], []
    for node in model.graph.node:
        out = rewrite(node)
        if out is None:
            nodes.append(node)
        else:
            nodes.extend(out[0])
            done.append(out[1])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


def decompose_linear_attention_gate(model: Any) -> list[str]:
    from onnx import helper

    def rewrite(node: Any) -> Any:
        if node.op_type != "LinearAttentionGate":
            return None
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

    return _replace(model, rewrite)


def decompose_gated_rmsnorm(model: Any) -> list[str]:
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}

    def rewrite(node: Any) -> Any:
        if node.op_type != "GatedRMSNorm":
            return None
        x, weight, gate = node.input
        if weight not in inits or len(inits[weight].dims) != 1:
            raise ModelError(
                f"GatedRMSNorm node {node.name!r}: its weight {weight!r} is not a 1-D initializer; "
                "kvlab rewrites only the builder's form (one weight per value-head channel)"
            )
        group, eps, p = int(inits[weight].dims[0]), float(_attr(node, "epsilon", 1e-6)), node.name
        grouped = _const(model, f"{p}/grouped_shape", np.array([0, 0, -1, group], np.int64))
        flat = _const(model, f"{p}/flat_shape", np.array([0, 0, -1], np.int64))
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

    return _replace(model, rewrite)


def mrope_to_rope(model: Any) -> list[str]:
    from onnx import helper

    keep = ("interleaved", "num_heads", "rotary_embedding_dim")

    def rewrite(node: Any) -> Any:
        if node.op_type != "MRotaryEmbedding":
            return None
        attrs = {k: _attr(node, k) for k in keep if _attr(node, k) is not None}
        new = helper.make_node(
            "RotaryEmbedding", list(node.input), list(node.output), name=node.name, domain=node.domain, **attrs
        )
        return (
            [new],
            f"{node.name}: MRotaryEmbedding (mrope_section {_attr(node, 'mrope_section')}) -> "
            "RotaryEmbedding on one position row (text: the three rows are equal; not registered in "
            "onnxruntime 1.27)",
        )

    return _replace(model, rewrite)


def text_position_ids(model: Any) -> list[str]:
    """A rank-3 ``position_ids`` input ([3, batch, sequence]) read only by rotary embeddings becomes [batch,
    sequence]."""
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
    """Set ``local_window_size = window`` on the GroupQueryAttention of each of ``layers`` that has -1."""
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
    done = strip_state_window(model) + decompose_linear_attention_gate(model) + decompose_gated_rmsnorm(model)
    done += mrope_to_rope(model) + text_position_ids(model)
    if window:
        done += restore_sliding_window(model, window, sliding_layers)
    return done
