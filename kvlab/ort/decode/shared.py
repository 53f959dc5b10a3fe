"""KV-shared layers on WebGPU: what both packages' GroupQueryAttention does with a layer that reads another layer's
keys and values (Gemma 4's KV sharing, ``kvlab.core.layout.SharedKV``).

Such a layer's node gets no new keys or values (an empty [1, 0, kv_heads x head_dim] input) and the source layer's
presents as its past. Measured on onnxruntime-webgpu 1.27.0 and on onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0
(SwiftShader; tests/test_kv_shared.py holds the one-node case): with a ``local_window_size``, the WebGPU kernel
attends to every past position instead of the last ``window`` ones once the past is longer than the window (the
CPU EP applies the window). A sliding KV-shared layer is then right on WebGPU only while the sequence fits its
window; kvlab's caches refuse longer ones on WebGPU (CapacityError, before anything runs) instead of giving other
tokens. A full-attention KV-shared layer has no window and is right at every length.
"""

from __future__ import annotations

from typing import Any

from ...core.layout import SharedKV

MEASURED_ON = "onnxruntime-webgpu 1.27.0 and onnxruntime-ep-webgpu 0.4.0"


def shared_window_on(info: Any, device: Any) -> int:
    """The smallest window of a sliding KV-shared layer of ``info`` when ``device`` is WebGPU; 0 otherwise."""
    if getattr(device, "name", None) != "webgpu":
        return 0
    windows = [layer.kind.window for layer in info.layout.layers if isinstance(layer.kind, SharedKV)]
    return min((w for w in windows if w), default=0)


def shared_window_refusal(info: Any, positions: int, window: int) -> str:
    layers = [layer.index for layer in info.layout.layers if isinstance(layer.kind, SharedKV) and layer.kind.window]
    return (
        f"{positions} positions are needed, but model {info.name}'s KV-shared sliding layers {layers} (window "
        f"{window}) are right on WebGPU only up to {window} positions: the WebGPU GroupQueryAttention of a layer "
        f"with no keys of its own ignores its local_window_size ({MEASURED_ON}; kvlab.ort.decode.shared). Keep "
        f"prompt + max_new_tokens <= {window}, or run it on device 'cpu'"
    )


# Graph capture (kvlab.ort.decode.capture) of a KV-shared layer's GroupQueryAttention, as measured on SwiftShader
# (tests/test_kv_shared.py holds the one-node case): the package whose WebGPU kernel dispatches an empty (0, 1, 1)
# workgroup grid under capture when the node gets no keys of its own ("Invalid dispatch group size (0, 1, 1)" at
# the capturing run), and the newest version of it measured so; the package measured to capture it.
EMPTY_KV_CAPTURE_FAILS = ("onnxruntime-webgpu", (1, 27))
EMPTY_KV_CAPTURE_RUNS = "onnxruntime-ep-webgpu 0.4.0 (on onnxruntime 1.31.1)"


def shared_attention_nodes(info: Any) -> list[str]:
    """The names of the GroupQueryAttention nodes of ``info``'s graph that read another layer's presents."""
    from ..models.graph import load_graph

    graph = load_graph(info.onnx_path)
    presents = {o.name for o in graph.graph.output}
    return [
        n.name
        for n in graph.graph.node
        if n.op_type == "GroupQueryAttention" and len(n.input) > 3 and n.input[3] in presents
    ]


def shared_capture_problem(info: Any, backend: Any) -> str:
    """Why ``backend`` cannot capture the KV-shared layers of ``info`` ("" when it is not known to fail)."""
    package, newest = EMPTY_KV_CAPTURE_FAILS
    if backend.package != package or not any(isinstance(layer.kind, SharedKV) for layer in info.layout.layers):
        return ""
    version = tuple(int(p) for p in backend.version.split(".")[:2] if p.isdigit())
    if version > newest:
        return ""  # not measured: let ONNX Runtime say
    nodes = shared_attention_nodes(info)
    return (
        f"{package} {backend.version}'s WebGPU GroupQueryAttention fails under capture on a layer with no keys "
        f'of its own: {nodes[:2]} dispatch an empty (0, 1, 1) workgroup grid at the capturing run ("Invalid '
        f'dispatch group size (0, 1, 1)"; measured with {package} 1.27.0, one-node case in '
        f"tests/test_kv_shared.py). {EMPTY_KV_CAPTURE_RUNS} captures it token-identically: `bash scripts/setup.sh "
        "--plugin`; or run this model with a plain StaticCache"
    )
