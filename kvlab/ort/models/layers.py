"""What each layer of a decoder graph keeps between steps, read from the graph: every past input is followed to the
node that reads it, whose rule (``OPS``) says what the pair holds and which output is its present. Keys and values
another op makes (an Optimum export's Concat) are full-attention KV that cannot share a buffer; a layer whose
GroupQueryAttention reads another layer's presents as its past shares that layer's KV (``SharedKV``); a state read
by an op kvlab does not know is refused, naming the input, the output and the op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...core.cache_layout import (
    GROWING_ROLES,
    CacheEntry,
    CacheLayout,
    ConvState,
    FullAttention,
    LayerKind,
    LayerSpec,
    LinearAttention,
    SharedKV,
    SlidingWindow,
)
from ...core.errors import ModelError
from .graph import ONNX_DTYPES, attr, elem_type, producers, uses


@dataclass(frozen=True)
class StateOp:
    """How one op keeps state: past input index -> (present output index, role), and the layer kind it makes."""

    pairs: dict[int, tuple[int, str]]
    kind: Callable[[Any], LayerKind]
    what: str


OPS: dict[str, StateOp] = {
    "GroupQueryAttention": StateOp(
        {3: (1, "key"), 4: (2, "value")},
        lambda node: SlidingWindow(w) if (w := attr(node, "local_window_size", -1)) > 0 else FullAttention(),
        "KV (full or sliding window)",
    ),
    "CausalConvWithState": StateOp({3: (1, "conv")}, lambda node: ConvState(), "a conv state"),
    "LinearAttention": StateOp({3: (1, "recurrent")}, lambda node: LinearAttention(), "a recurrent state"),
}
# what a layer is when its entries come from several ops (Qwen3.5's linear attention: a conv state, then a
# recurrent state); the op that decides, in order
KIND_PRECEDENCE = ("GroupQueryAttention", "LinearAttention", "CausalConvWithState")


# the ops kvlab reads a cache entry from, with what each keeps, for error messages
KNOWN_OPS = ", ".join(f"{op} ({rule.what})" for op, rule in OPS.items())


ATTENTION_OPS = ("MultiHeadAttention", "Attention", "GroupQueryAttention", "SparseAttention", "Softmax")


def attention_reading(read_by: dict, present: str, depth: int = 12) -> Any:
    """The attention node reading the KV tensor ``present`` (at most ``depth`` reshapes, repeats and transposes away): a
    fused attention op (``ATTENTION_OPS``) or an unfused one's Softmax; None when none is that near."""
    frontier, seen = [present], set()
    for _ in range(depth):
        nxt = []
        for name in frontier:
            for node, _ in read_by.get(name, []):
                if node.op_type in ATTENTION_OPS:
                    return node
                if id(node) not in seen:
                    seen.add(id(node))
                    nxt += list(node.output)
        frontier = nxt
    return None


def read_layers(
    graph: Any, layers: int, declared: dict[str, tuple[int, str, str]], head_dim: int, kv_heads: int, path: Path
) -> CacheLayout:
    """The ``CacheLayout`` of a graph. ``declared``: past input -> (layer, role, present output), from the config;
    ``head_dim``/``kv_heads`` fill KV dims the graph leaves symbolic; ``path`` names the model in errors. Raises
    ModelError where the graph contradicts the config, a layer has no cache input, or a state is read by an op
    kvlab does not know."""
    inputs = {i.name: i for i in graph.graph.input}
    read_by, made_by = uses(graph), producers(graph)
    per_layer: dict[int, list[tuple[CacheEntry, Any]]] = {i: [] for i in range(layers)}
    for past, (layer, role, present) in declared.items():
        readers = read_by.get(past, [])
        node, index = readers[0] if len(readers) == 1 else (None, -1)
        rule = OPS.get(node.op_type) if node is not None else None
        if rule is not None and index in rule.pairs:
            out_index, op_role = rule.pairs[index]
            if op_role != role or len(node.output) <= out_index or node.output[out_index] != present:
                raise ModelError(
                    f"{path}: {past!r} is input {index} of {node.op_type} node {node.name!r}, whose "
                    f"output {out_index} is {node.output[out_index] if len(node.output) > out_index else None!r}"
                    f" ({op_role}); the config pairs it with {present!r} ({role})"
                )
        elif role in GROWING_ROLES:  # KV written by another op (Concat: past + new): full attention, not shared
            node = attention_reading(read_by, present) or made_by.get(present)
        else:
            raise ModelError(
                f"{path}: the state input {past!r} / output {present!r} is read by "
                + (", ".join(f"{n.op_type} node {n.name!r}" for n, _ in readers) or "no node")
                + " and written by "
                + (f"{w.op_type} node {w.name!r}" if (w := made_by.get(present)) is not None else "no node")
                + f": a layer kind kvlab does not know (it knows {KNOWN_OPS}), so it cannot say how "
                "that state changes from step to step"
            )
        per_layer[layer].append((_entry(inputs[past], layer, role, present, node, head_dim, kv_heads, path), node))
    specs, shared = [], _shared_layers(graph, per_layer)
    for layer, found in per_layer.items():
        if layer in shared:
            specs.append(LayerSpec(layer, shared[layer]))
            continue
        if not found:
            raise ModelError(
                f"{path}: layer {layer} (of num_hidden_layers = {layers}) has no cache input in the "
                "graph, and no GroupQueryAttention node reads another layer's presents in its place (KV "
                "shared with another layer, as mobius exports Gemma 4); kvlab knows no layer kind without one"
            )
        specs.append(
            LayerSpec(
                layer, _layer_kind(found), tuple(e for e, _ in sorted(found, key=lambda f: ROLE_ORDER.index(f[0].role)))
            )
        )
    return CacheLayout(tuple(specs))


ROLE_ORDER = ("key", "value", "conv", "recurrent")


def _shared_layers(graph: Any, per_layer: dict[int, list[tuple[CacheEntry, Any]]]) -> dict[int, SharedKV]:
    """Layer -> ``SharedKV`` for the layers without a cache input whose GroupQueryAttention reads another layer's
    presents as its past: the attention nodes that own no entry matched in order with the layers that have none; {} when
    their counts differ (those layers are then refused)."""
    owner = {id(node): layer for layer, found in per_layer.items() for _, node in found if node is not None}
    writes = {
        node.output[1]: node for node in graph.graph.node if node.op_type == "GroupQueryAttention" and id(node) in owner
    }
    readers = [
        node
        for node in graph.graph.node
        if node.op_type == "GroupQueryAttention" and id(node) not in owner and len(node.input) > 4
    ]
    empty = [layer for layer, found in per_layer.items() if not found]
    out: dict[int, SharedKV] = {}
    for layer, node in zip(empty, readers):
        source = writes.get(node.input[3])
        if source is None or source.output[2] != node.input[4] or len(readers) != len(empty):
            return {}
        out[layer] = SharedKV(owner[id(source)], max(0, attr(node, "local_window_size", -1)))
    return out


def borrows_kv(graph: Any) -> bool:
    """Some GroupQueryAttention node reads, as its past keys, the presents another one writes (KV sharing)."""
    written = {n.output[1] for n in graph.graph.node if n.op_type == "GroupQueryAttention" and len(n.output) > 1}
    return any(
        n.op_type == "GroupQueryAttention" and len(n.input) > 3 and n.input[3] in written for n in graph.graph.node
    )


def _layer_kind(found: list[tuple[CacheEntry, Any]]) -> LayerKind:
    ops = {node.op_type: node for _, node in found if node is not None}
    for op in KIND_PRECEDENCE:
        if op in ops:
            return OPS[op].kind(ops[op])
    return FullAttention()  # KV made by Concat or another op: attention over every position


def _entry(
    value_info: Any, layer: int, role: str, present: str, node: Any, head_dim: int, kv_heads: int, path: Path
) -> CacheEntry:
    name = value_info.name
    dtype = ONNX_DTYPES.get(elem_type(value_info))
    if not isinstance(dtype, np.dtype):
        raise ModelError(
            f"{path}: {name!r} has dtype {dtype or elem_type(value_info)}, which numpy/ONNX Runtime's "
            "Python API cannot hold"
        )
    dims = [d.dim_value if d.HasField("dim_value") else None for d in value_info.type.tensor_type.shape.dim]
    op = node.op_type if node is not None else "?"
    if role in GROWING_ROLES:
        if len(dims) != 4:
            raise ModelError(
                f"{path}: KV input {name!r} has rank {len(dims)}; kvlab expects [batch, kv_heads, length, head_dim]"
            )
        shape = (1, dims[1] or kv_heads, 0, dims[3] or head_dim)
    else:
        if not dims or any(d is None for d in dims[1:]):
            raise ModelError(
                f"{path}: state input {name!r} ({op}) has shape {dims}; kvlab needs every dimension "
                "but the batch to be fixed in the graph"
            )
        shape = (1, *dims[1:])
    return CacheEntry(layer, role, name, present, tuple(int(d) for d in shape), dtype, op)
