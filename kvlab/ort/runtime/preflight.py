"""What a device's runtime needs of a graph, checked by ``Device.session`` before a session opens: a float16 graph
refused on a WebGPU adapter without shader-f16 (``refuse_f16``), one the CPU EP cannot run (``refuse_on_cpu``), a bool
Gather rewritten for WebGPU (``workarounds``), the node a refused session asks too much of (``explain_refusal``); and,
once ``Session`` opened, no heavy node fallen back to the CPU EP (``refuse_cpu_fallback``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ...core.errors import DeviceError
from ...core.labels import Adapter
from ..models.graph import FLOAT16, elem_type, load_graph
from ..models.rewrites import bool_gathers, cast_bool_gathers


def workarounds(device: str, onnx_file: Path) -> tuple[str | bytes, list[str]]:
    """The model to open on ``device``, rewritten in memory where its runtime needs it (``cast_bool_gathers`` on
    WebGPU), and what was rewritten. DeviceError for such a model over 2 GiB (a serialized model's limit)."""
    if device != "webgpu" or not bool_gathers(load_graph(onnx_file)):
        return str(onnx_file), []
    import onnx

    model = onnx.load(str(onnx_file))  # with its weights: the rewritten model is opened from memory
    if model.ByteSize() >= 2**31:
        raise DeviceError(
            f"{onnx_file} gathers from a bool tensor, which crashes onnxruntime-webgpu 1.27's "
            "Gather kernel; kvlab rewrites such graphs in memory, but this one is over 2 GiB"
        )
    done = cast_bool_gathers(model)
    return model.SerializeToString(), done


@functools.cache
def _contrib_schemas() -> dict[str, Any]:
    """The installed package's com.microsoft op schemas, by op name."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return {s.name: s for s in C.get_all_operator_schema() if s.domain == "com.microsoft"}


def refuse_f16(device: str, adapter: Adapter, onnx_file: Path, label: str) -> None:
    """Refuse (DeviceError) a float16 graph on ``device`` "webgpu" when its ``adapter``'s shaders cannot compute in
    float16, before any kernel runs: such a kernel fails at its first run, and the process then dies at exit."""
    if device != "webgpu" or adapter.shader_f16 is not False:
        return
    graph = load_graph(onnx_file)
    if any(elem_type(v) == FLOAT16 for v in [*graph.graph.input, *graph.graph.output]):
        raise DeviceError(
            f"{label} computes in float16, but the WebGPU adapter {adapter} has no shader-f16 "
            "(its Vulkan driver lacks float16 arithmetic or 16-bit storage); run it on device "
            "'cpu', on a GPU adapter, or use precision fp32"
        )


# ops whose work grows with the model or the context: on a WebGPU session none may fall back to the CPU EP (small
# shape, mask and index computations may: Session.cpu_nodes lists them)
HEAVY_OPS = frozenset(
    {
        "MatMul",
        "MatMulNBits",
        "Gemm",
        "Conv",
        "GroupQueryAttention",
        "MultiHeadAttention",
        "Attention",
        "Softmax",
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
        "LayerNormalization",
        "SkipLayerNormalization",
        "RotaryEmbedding",
        "Einsum",
    }
)


def refuse_cpu_fallback(device: str, cpu_nodes: list[str], label: str) -> None:
    """Refuse (DeviceError) a ``device`` "webgpu" session of ``label`` whose ``cpu_nodes`` ("op_type:name", the
    nodes ONNX Runtime placed on the CPU EP) include a heavy one (``HEAVY_OPS``)."""
    heavy = [n for n in cpu_nodes if n.split(":", 1)[0] in HEAVY_OPS] if device == "webgpu" else []
    if heavy:
        raise DeviceError(
            f"the WebGPU EP did not take these nodes of {label}; they would run on the CPU "
            f"EP: {heavy[:8]}{' ...' if len(heavy) > 8 else ''}"
        )


def refuse_on_cpu(device: str, onnx_file: Path, label: str) -> None:
    """Refuse (DeviceError) a graph on ``device`` "cpu" that the CPU EP cannot run although a package may load it: a
    GroupQueryAttention given its q/k norm weights as inputs 14 and 15 (the builder's ``-e webgpu`` fuses them), which
    no CPU EP kernel takes."""
    if device != "cpu":
        return
    graph = load_graph(onnx_file)
    node = next((n for n in graph.graph.node if n.op_type == "GroupQueryAttention" and any(n.input[14:16])), None)
    if node is not None:
        raise DeviceError(
            f"{label} cannot run on the CPU EP: its GroupQueryAttention {node.name!r} has fused q/k norms (inputs 14 "
            "and 15, as the builder's -e webgpu writes them), which no CPU EP kernel takes; run it on device 'webgpu' "
            "with a package whose WebGPU EP does (the plugin EP: `bash scripts/setup.sh --plugin`), or rebuild it "
            "with -e cpu or --extra_options fuse_qk_norm_gqa=false"
        )


def schema_problems(graph: Any) -> list[str]:
    """What the installed ONNX Runtime package lacks to load ``graph`` (a ModelProto), read from the op schemas it
    registers: one line per contrib-op (com.microsoft) node it does not register, gives an attribute its schema does
    not have, or gives more inputs than its schema takes (the first node of each kind of gap). [] when every such
    node fits; standard ops are not checked."""
    schemas = _contrib_schemas()
    problems: dict[tuple[str, str], str] = {}
    for node in graph.graph.node:
        if node.domain != "com.microsoft":
            continue
        schema = schemas.get(node.op_type)
        if schema is None:
            problems.setdefault((node.op_type, ""), f"no op {node.op_type} is registered (node {node.name!r})")
            continue
        for a in node.attribute:
            if a.name not in schema.attributes:
                problems.setdefault(
                    (node.op_type, a.name),
                    f"its {node.op_type} has no attribute {a.name!r} (node {node.name!r} sets it; the schema has "
                    f"{', '.join(sorted(schema.attributes))})",
                )
        if len(node.input) > schema.max_input:
            problems.setdefault(
                (node.op_type, "#inputs"),
                f"its {node.op_type} takes at most {schema.max_input} inputs (node {node.name!r} has "
                f"{len(node.input)})",
            )
    return list(problems.values())


def explain_refusal(onnx_file: Path, runtime: str) -> str:
    """Why ``runtime`` (the installed package) cannot load the graph of ``onnx_file``, naming the node, what it lacks
    and what would work; "" when its op schemas show no gap."""
    problems = schema_problems(load_graph(onnx_file))
    if not problems:
        return ""
    return (
        f"{runtime} cannot load this graph: {'; '.join(problems[:3])}. A newer ONNX Runtime may have it (kvlab's "
        "second environment, `bash scripts/setup.sh --plugin`, has onnxruntime 1.31); or rebuild the model for "
        "this runtime (docs/compatibility.md lists which exports run where)"
    )
