"""KV precision on ONNX Runtime: what each runtime kvlab runs on supports, measured (docs/kv-memory.md has the
commands and error texts), and the refusal kvlab's ORT caches give for a KV precision other than the model's.

kvlab's ORT caches hold KV in the dtype the model was built with (``kv_precision=None`` or ``"model"``); the
facts below say why nothing else is offered yet and where it would work."""

from __future__ import annotations

from ...core.errors import ConfigError

MODEL = ("model", None)
# what each runtime does with a quantized KV cache (measured on the toy model and one GroupQueryAttention node)
SUPPORT: dict[str, str] = {
    "onnxruntime-webgpu 1.27 (WebGPU)": "no KV quantization: the EP has no kvCacheQuantizationBits option (the "
    "session config entry is accepted and ignored, any value: logits identical to the fp32-KV run), and its "
    "GroupQueryAttention rejects the packed KV onnxruntime-genai allocates for it (\"Input 'past_key' "
    'dimension 3 should be same as head_size, got 5 expected 16")',
    "onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0 (WebGPU)": "the EP option kvCacheQuantizationBits=8 "
    "(int8 blocks) or 4 (TurboQuant: Hadamard-rotated 4-bit) packs every past/present to 1 + head_dim/4 (8 bits) "
    "or 1 + head_dim/8 (4 bits) 32-bit words per head, in a tensor of the model's float type; measured running "
    "(and onnxruntime-genai 0.18 runs it); kvlab's ORT caches do not allocate packed KV yet",
    "CPU EP (1.27 and 1.31.1)": "GroupQueryAttention takes int8 or packed-uint8 (int4) past/present with "
    "kv_cache_bit_width, k_quant_type/v_quant_type and k_scale/v_scale inputs (measured on one node), but the "
    "onnxruntime-genai 0.18 builder makes no such graph: the scales would have to be calibrated and added",
}
KV_PRECISIONS = ("int8", "int4")


def refuse_kv_precision(kv_precision: object, cache: str) -> None:
    """Nothing for the model's own precision; ConfigError naming what each runtime supports and what runs it."""
    if kv_precision in MODEL:
        return
    what = "is not a KV precision" if kv_precision not in KV_PRECISIONS else "cannot run on kvlab's ORT caches"
    facts = "; ".join(f"{k}: {v}" for k, v in SUPPORT.items())
    raise ConfigError(
        f"{cache}(kv_precision={kv_precision!r}) {what}: these caches keep KV in the model's dtype "
        f"(kv_precision=None). Measured: {facts}. Quantized KV runs on PyTorch: kvlab.pytorch.generate(model, "
        "prompt, cache='quantized', kv_precision='int8' or 'int4'), or with onnxruntime-genai on the plugin EP "
        "(provider option kvCacheQuantizationBits)"
    )
