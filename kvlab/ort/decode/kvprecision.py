"""KV precision on ONNX Runtime: what each runtime kvlab runs on supports, measured (docs/kv-memory.md has the
commands and error texts), and the packed KV kvlab's ORT caches hold where one does.

``kv_precision=None`` (or ``"model"``): KV in the dtype the model was built with. ``"int8"`` / ``"int4"``: the
WebGPU plugin EP (onnxruntime-ep-webgpu 0.4.0 on onnxruntime 1.31.1) quantizes KV inside GroupQueryAttention when
its session has the EP option ``kvCacheQuantizationBits``; every past/present then holds, per head and position,
one scale word and ``head_dim * bits / 32`` words of packed values, in a tensor of the model's float dtype
(``packed_entry``). Anywhere else a quantized KV precision is refused when the cache meets the model and device
(``check_runs_here``), with the facts below."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...core.errors import ConfigError
from ...core.layout import CacheEntry, CacheLayout

BITS = {"int8": 8, "int4": 4}  # kvCacheQuantizationBits per KV precision
KV_PRECISIONS = tuple(BITS)
OPTION = "kvCacheQuantizationBits"  # the plugin EP's session option
# measured on an NVIDIA H200 machine (data/gpu/kvprecision/): on its hardware adapter the plugin EP 0.4.0, with the
# option set to 8 or 4, still asks for unpacked KV (toy, kv-heavy, phi4-kv fp32 and fp16); it takes packed KV on
# SwiftShader (toy, kv-heavy)
HARDWARE_KV = (
    "on a hardware adapter (an NVIDIA H200) the plugin EP 0.4.0 with kvCacheQuantizationBits 8 or 4 still asked for "
    "unpacked KV (\"Input 'past_key' dimension 3 should match the packed KV head dimension, got 5 expected 16\" on "
    'the toy model, "got 33 expected 128" on kv-heavy and phi4-kv, fp32 and fp16); it took packed KV only on '
    "SwiftShader"
)
# what each runtime does with a quantized KV cache (measured on the toy model and one GroupQueryAttention node)
SUPPORT: dict[str, str] = {
    "onnxruntime-webgpu 1.27 (WebGPU)": "no KV quantization: the EP has no kvCacheQuantizationBits option (the "
    "session config entry is accepted and ignored, any value: logits identical to the fp32-KV run), and its "
    "GroupQueryAttention rejects the packed KV onnxruntime-genai allocates for it (\"Input 'past_key' "
    'dimension 3 should be same as head_size, got 5 expected 16")',
    "onnxruntime 1.31.1 + onnxruntime-ep-webgpu 0.4.0 (WebGPU)": "the EP option kvCacheQuantizationBits=8 "
    "(int8 blocks) or 4 (TurboQuant: Hadamard-rotated 4-bit) packs every past/present to 1 + head_dim/4 (8 bits) "
    "or 1 + head_dim/8 (4 bits) 32-bit words per head, in a tensor of the model's float type: kvlab's ORT caches "
    "run it there on SwiftShader (kv_precision='int8' or 'int4'), not on a hardware adapter (" + HARDWARE_KV + ")",
    "CPU EP (1.27 and 1.31.1)": "GroupQueryAttention takes int8 or packed-uint8 (int4) past/present with "
    "kv_cache_bit_width, k_quant_type/v_quant_type and k_scale/v_scale inputs (measured on one node), but the "
    "onnxruntime-genai 0.18 builder makes no such graph: the scales would have to be calibrated and added",
}


def check_kv_precision(kv_precision: object, cache: str) -> str | None:
    """``None`` for the model's own precision, else "int8" or "int4"; ConfigError for anything else."""
    if kv_precision is None or (isinstance(kv_precision, str) and kv_precision == "model"):
        return None
    if isinstance(kv_precision, str) and kv_precision in BITS:
        return kv_precision
    raise ConfigError(
        f"{cache}(kv_precision={kv_precision!r}) is not a KV precision: use None (the model's dtype) or one of "
        f"{KV_PRECISIONS} (the WebGPU plugin EP only)"
    )


def check_runs_here(kv_precision: str, cache: str, info: Any, device: Any) -> None:
    """ConfigError unless this device's runtime packs KV and every KV entry of the model is read by a
    GroupQueryAttention whose head size the packing allows (8 bits: a multiple of 4; 4 bits: a power of 2 >= 8)."""
    runs = device.name == "webgpu" and device.backend.kv_quantization
    if not runs:
        facts = "; ".join(f"{k}: {v}" for k, v in SUPPORT.items())
        raise ConfigError(
            f"{cache}(kv_precision={kv_precision!r}) cannot run on {device.name} with "
            f"{device.backend.package} {device.backend.version}: only the WebGPU plugin EP packs KV. Measured: "
            f"{facts}. Quantized KV also runs on PyTorch: kvlab.pytorch.generate(model, prompt, cache='quantized', "
            "kv_precision='int8' or 'int4')"
        )
    if device.adapter.kind == "hardware":
        raise ConfigError(
            f"{cache}(kv_precision={kv_precision!r}) cannot run on {device.adapter.name}: {HARDWARE_KV}; use "
            "kv_precision=None here, or quantized KV on PyTorch (kvlab.pytorch.generate(..., cache='quantized'))"
        )
    for entry in (e for e in info.layout.entries if e.grows):
        head = entry.dims[-1]
        fits = head % 4 == 0 if BITS[kv_precision] == 8 else head >= 8 and head & (head - 1) == 0
        if entry.op != "GroupQueryAttention" or not fits:
            raise ConfigError(
                f"{cache}(kv_precision={kv_precision!r}) cannot pack model {info.name}'s {entry.past} (read by "
                f"{entry.op}, head size {head}): the plugin EP packs KV in GroupQueryAttention only, with a head "
                "size that is a multiple of 4 (int8) or a power of 2 of at least 8 (int4)"
            )


def packed_entry(entry: CacheEntry, kv_precision: str | None) -> CacheEntry:
    """The entry as the plugin EP holds it at this KV precision: the last axis one scale word plus
    ``head_dim * bits / 32`` words of values; unchanged for the model's precision and for fixed-size states."""
    if kv_precision is None or not entry.grows:
        return entry
    words = 1 + entry.dims[-1] * BITS[kv_precision] // 32
    return replace(entry, dims=entry.dims[:-1] + (words,))


def packed_layout(layout: CacheLayout, kv_precision: str | None) -> CacheLayout:
    """The layout with every KV entry as ``packed_entry`` holds it (what a cache at this precision allocates)."""
    if kv_precision is None:
        return layout
    layers = (
        replace(layer, entries=tuple(packed_entry(e, kv_precision) for e in layer.entries)) for layer in layout.layers
    )
    return CacheLayout(tuple(layers))


def session_options(kv_precision: str | None) -> dict[str, str] | None:
    """The EP options a session needs for this KV precision (None: the device's plain session)."""
    return None if kv_precision is None else {OPTION: str(BITS[kv_precision])}
