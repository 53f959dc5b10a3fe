"""KV-shared layers on WebGPU (``kvlab.core.cache_layout.SharedKV``): what kvlab's caches refuse there.

With a ``local_window_size``, the WebGPU kernel attends to every past position instead of the last ``window`` ones
once the past is longer than the window, so kvlab's caches refuse longer sequences there (CapacityError, before
anything runs). Under graph capture one package's kernel dispatches an empty grid for such a node
(``shared_capture_problem``). The packages measured: docs/kv-shared.md."""

from __future__ import annotations

from typing import Any

from ....core.cache_layout import SharedKV

# the package (and newest version) whose GroupQueryAttention fails under capture on a layer without keys; one that runs
EMPTY_KV_CAPTURE_FAILS = ("onnxruntime-webgpu", (1, 27))
EMPTY_KV_CAPTURE_RUNS = "onnxruntime-ep-webgpu 0.4.0 (on onnxruntime 1.31.1)"


def shared_window_on(info: Any, device: Any) -> int:
    """The smallest window of a sliding KV-shared layer of ``info`` when ``device`` is WebGPU; 0 otherwise."""
    if getattr(device, "name", None) != "webgpu":
        return 0
    windows = [layer.kind.window for layer in info.layout.layers if isinstance(layer.kind, SharedKV)]
    return min((w for w in windows if w), default=0)


def shared_window_refusal(info: Any, positions: int, window: int) -> str:
    """The CapacityError's text for ``positions`` beyond the ``window`` of ``info``'s sliding KV-shared layers."""
    layers = [layer.index for layer in info.layout.layers if isinstance(layer.kind, SharedKV) and layer.kind.window]
    return (
        f"{positions} positions are needed, but model {info.name}'s KV-shared sliding layers {layers} (window "
        f"{window}) are right on WebGPU only up to {window} positions: the WebGPU GroupQueryAttention of a layer "
        f"with no keys of its own ignores its local_window_size (docs/kv-shared.md). Keep prompt + max_new_tokens "
        f"<= {window}, or run it on device 'cpu'"
    )


def shared_attention_nodes(info: Any) -> list[str]:
    """The names of the GroupQueryAttention nodes of ``info``'s graph that read another layer's presents."""
    from ...models.graph import load_graph

    graph = load_graph(info.onnx_path)
    presents = {o.name for o in graph.graph.output}
    return [
        n.name
        for n in graph.graph.node
        if n.op_type == "GroupQueryAttention" and len(n.input) > 3 and n.input[3] in presents
    ]


def shared_capture_problem(info: Any, backend: Any) -> str:
    """Why ``backend`` cannot capture the KV-shared layers of ``info`` ("" when it is not known to fail: a newer
    version than ``EMPTY_KV_CAPTURE_FAILS`` names, or another package, is left to ONNX Runtime to answer)."""
    package, newest = EMPTY_KV_CAPTURE_FAILS
    if backend.package != package or not any(isinstance(layer.kind, SharedKV) for layer in info.layout.layers):
        return ""
    version = tuple(int(p) for p in backend.version.split(".")[:2] if p.isdigit())
    if version > newest:
        return ""
    nodes = shared_attention_nodes(info)
    return (
        f"{package} {backend.version}'s WebGPU GroupQueryAttention fails under capture on a layer with no keys "
        f'of its own: {nodes[:2]} dispatch an empty (0, 1, 1) workgroup grid at the capturing run ("Invalid '
        f'dispatch group size (0, 1, 1)"). {EMPTY_KV_CAPTURE_RUNS} captures it token-identically: `bash '
        "scripts/setup.sh --plugin`; or run this model with a plain StaticCache"
    )
