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
