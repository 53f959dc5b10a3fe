"""The third exporter: mobius (``mobius-onnx``, ONNX Runtime's onnxscript model definitions), for what the
onnxruntime-genai builder cannot export: Gemma 4 with KV sharing (``kv-shared-toy``, a ``TinyKVShared`` recipe).
What its graphs need before kvlab can bind them (``repair``), or capture them (``for_capture``), and why, is on
docs/kv-shared.md; kvlab reads a KV-shared layer as ``SharedKV`` (``kvlab.ort.models.layers``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ModelError
from .graph import attr, load_graph, producers, projection_width, uses
from .rewrites import constant, replace_nodes

PRODUCER = "mobius"  # the ONNX producer_name of a mobius export
EXECUTION_PROVIDER = "webgpu"  # mobius's target: GroupQueryAttention, float32 and float16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# the ops between a key projection and the GroupQueryAttention reading its output (Reshape, the k norm, Reshape)
KEY_PATH = ("Reshape", "RMSNormalization", "SimplifiedLayerNormalization", "Cast", "Mul", "Add")
INT32 = 6  # onnx.TensorProto.INT32


def mobius_version() -> str:
    """The installed mobius-onnx's version; ModelError naming the install command when it is missing."""
    from importlib import metadata

    try:
        return metadata.version("mobius-onnx")
    except metadata.PackageNotFoundError as exc:
        raise ModelError(
            "building a KV-shared model needs mobius-onnx (ONNX Runtime's model definitions): "
            "`pip install 'kvlab[mobius]'` (or `pip install mobius-onnx==0.1.0`)"
        ) from exc


def mobius_config(hf: Any) -> Any:
    """mobius's ``Gemma4Config`` of a transformers ``Gemma4TextConfig`` whose head size differs per layer (which
    mobius's reader refuses). ModelError for another model type."""
    import mobius

    if getattr(hf, "model_type", None) != "gemma4_text":
        raise ModelError(f"kvlab exports only Gemma 4 text (gemma4_text) through mobius, not {hf.model_type!r}")
    hf.allow_global_per_layer_attribute_access = True  # mobius reads head_dim globally: the sliding layers' one
    config = mobius.Gemma4Config.from_transformers(hf)
    per_layer = getattr(hf, "per_layer_config", None)
    full = [i for i, t in enumerate(hf.layer_types) if t == "full_attention"]
    if per_layer is not None and full:
        config = replace(config, global_head_dim=int(per_layer[full[0]].head_dim))
    return config


def export(hf_dir: Path, out: Path, task: Any = "text-generation") -> None:
    """mobius's export of the checkpoint ``hf_dir`` for WebGPU in float32 as ``task`` (a mobius task or its
    name), its weights applied, into ``out``."""
    import mobius
    import transformers
    from mobius._registry import registry
    from safetensors.torch import load_file

    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    config = mobius_config(hf)
    module = registry.get(hf.model_type)(config)
    package = mobius.build_from_module(module, config, task, execution_provider=EXECUTION_PROVIDER)
    weights = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if hasattr(module, "preprocess_weights"):
        weights = module.preprocess_weights(weights)
    package.apply_weights(weights, prefix_map=getattr(module, "weight_prefix_map", None))
    package.save(str(out), progress_bar=False)


# -- what kvlab cannot bind as mobius 0.1.0 writes it
def _kv_mismatches(graph: Any) -> list[tuple[Any, Any, int, int]]:
    """(value info, its node, declared head size, the one its key projection makes) for every KV input and
    present whose head size disagrees with the projection of the layer it belongs to."""
    inputs = {i.name: i for i in graph.graph.input}
    outputs = {o.name: o for o in graph.graph.output}
    out = []
    for node in (n for n in graph.graph.node if n.op_type == "GroupQueryAttention"):
        kv_heads = attr(node, "kv_num_heads", 0)
        width = projection_width(graph, node.input[1], KEY_PATH) if len(node.input) > 1 else None
        if not kv_heads or not width or width % kv_heads:
            continue
        for name in (*node.input[3:5], *node.output[1:3]):
            info = inputs.get(name) or outputs.get(name)
            dims = info.type.tensor_type.shape.dim if info is not None else []
            if len(dims) == 4 and dims[3].HasField("dim_value") and dims[3].dim_value != width // kv_heads:
                out.append((info, node, dims[3].dim_value, width // kv_heads))
    return out


def _unread(graph: Any) -> list[str]:
    read = uses(graph)
    return [i.name for i in graph.graph.input if i.name not in read]


def check(graph: Any, path: Path) -> None:
    """ModelError naming what a mobius graph needs repaired before kvlab can bind it (nothing for other graphs): inputs
    no node reads, or KV declared with another head size than its layer writes."""
    if graph.producer_name != PRODUCER:
        return
    found = []
    unread = _unread(graph)
    if unread:
        found.append(
            f"graph inputs {unread} are read by no node (the KV-shared layers' own pasts: those layers read "
            "another layer's presents), yet ONNX Runtime asks for them at every run"
        )
    for info, node, declared, real in _kv_mismatches(graph)[:1]:
        found.append(
            f"{info.name!r} is declared with heads of {declared}, but {node.name!r} writes heads of {real} (its key "
            "projection's width / kv_num_heads): ONNX Runtime would refuse the real tensors"
        )
    if found:
        raise ModelError(
            f"{path}: a mobius {graph.producer_version} export kvlab cannot bind: {'; '.join(found)}. "
            "kvlab.ort.models.mobius.repair(<dir>/model.onnx) fixes both in place"
        )


def repair(onnx_file: Path) -> list[str]:
    """Fix what ``check`` names, in place (the weights stay where they are); returns what changed."""
    import onnx

    graph = load_graph(Path(onnx_file))
    done = []
    unread = set(_unread(graph))
    if unread:
        keep = [i for i in graph.graph.input if i.name not in unread]
        del graph.graph.input[:]
        graph.graph.input.extend(keep)
        done.append(f"unread inputs dropped: {sorted(unread)}")
    for info, node, declared, real in _kv_mismatches(graph):
        info.type.tensor_type.shape.dim[3].dim_value = real
        done.append(f"{info.name}: head size {declared} -> {real} (as {node.name} writes it)")
    if done:
        del graph.graph.value_info[:]  # intermediate shapes inferred from the old declarations
        onnx.save(graph, str(onnx_file))
    return done


# -- what a captured graph cannot hold: nodes ONNX Runtime places on the CPU EP
def _ints(model: Any, name: str) -> list[int] | None:
    """The int values of a Constant node's output or an initializer ``name``; None when it is neither."""
    from onnx import numpy_helper

    init = next((t for t in model.graph.initializer if t.name == name), None)
    if init is not None:
        return [int(v) for v in numpy_helper.to_array(init).ravel()]
    node = producers(model).get(name)
    if node is None or node.op_type != "Constant":
        return None
    value = attr(node, node.attribute[0].name)
    return [int(v) for v in (numpy_helper.to_array(value) if node.attribute[0].name == "value" else np.ravel(value))]


def empty_kv_by_slice(model: Any) -> list[str]:
    """Each ConstantOfShape making a KV-shared layer's empty keys and values (no WebGPU kernel) as ``Slice(query, [0,
    0], [0, width], axes [1, 2])``, the same [batch, 0, width] tensor. ModelError for another shape."""
    from onnx import helper

    made_by, read_by = producers(model), uses(model)
    feeding: list[Any] = []  # the nodes that made each rewritten node's shape

    def rewrite(node: Any) -> Any:
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
        starts = constant(model, f"{p}/starts", np.array([0, 0], np.int64))
        ends = constant(model, f"{p}/ends", np.array([0, rest[1]], np.int64))
        axes = constant(model, f"{p}/axes", np.array([1, 2], np.int64))
        return (
            [helper.make_node("Slice", [query, starts, ends, axes], list(node.output), name=f"{p}/as_Slice")],
            f"{p}: ConstantOfShape [batch, 0, {rest[1]}] -> Slice(query, [0, 0], [0, {rest[1]}], axes [1, 2]) "
            "(the same empty tensor; no WebGPU ConstantOfShape in either package)",
        )

    done = replace_nodes(model, "ConstantOfShape", rewrite)
    outputs = {o.name for o in model.graph.output}
    for node in (n for n in feeding if n is not None):  # those whose outputs nothing reads any more go
        read = uses(model)
        if not any(o in read or o in outputs for o in node.output):
            model.graph.node.remove(node)
    return done


def int32_mask_lengths(model: Any, mask: str = "attention_mask") -> list[str]:
    """The int64 ReduceSum of ``mask`` and the Sub of one from it, in int32 after a Cast of the mask (same values).
    Nothing when the mask is not summed; ModelError where either is read by anything but a Cast to int32, or the Sub's
    one is not a constant 1."""
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
            if any(n.op_type != "Cast" or attr(n, "to") != INT32 for n in others):
                raise ModelError(
                    f"{name!r} (the mask's length) is read by {sorted({n.op_type for n in others})}; kvlab "
                    "computes it in int32 only where it is read as a Cast to int32"
                )
        for sub in subs:
            if _ints(model, sub.input[1]) != [1]:
                raise ModelError(f"Sub node {sub.name!r} subtracts {sub.input[1]!r}, not a constant 1")
            sub.input[1] = constant(model, f"{sub.name}/one_int32", np.array(1, np.int32))
        total.input[0] = casted
        done.append(
            f"{total.name}: ReduceSum of {mask} (and {len(subs)} Sub of one) in int32 after a Cast (int64 on "
            "WebGPU in onnxruntime-webgpu 1.27: neither op)"
        )
    model.graph.node.insert(0, helper.make_node("Cast", [mask], [casted], name=f"{mask}/Cast_int32", to=INT32))
    changed = {n.output[0] for n in sums} | {n.output[0] for t in sums for n, _ in read_by.get(t.output[0], [])}
    keep = [v for v in model.graph.value_info if v.name not in changed]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    return done


def for_capture(model: Any) -> list[str]:
    """Both rewrites for WebGPU graph capture, in order; what changed."""
    return empty_kv_by_slice(model) + int32_mask_lengths(model)
