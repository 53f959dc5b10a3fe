"""KV precision on ONNX Runtime: the packed KV kvlab's caches hold where the runtime quantizes it, and the refusal
elsewhere (docs/kv-memory.md).

``kv_precision=None`` (or ``"model"``): KV in the model's dtype. ``"int8"`` / ``"int4"``: the WebGPU plugin EP
quantizes KV inside GroupQueryAttention (EP option ``kvCacheQuantizationBits``); every past/present then holds, per
head and position, one scale word and ``head_dim * bits / 32`` words of packed values, in a tensor of the model's
float dtype (``packed_entry``). Refused on a hardware adapter, where the EP still asks for unpacked KV."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ....core.cache_layout import CacheEntry, CacheLayout
from ....core.errors import ConfigError

BITS = {"int8": 8, "int4": 4}  # kvCacheQuantizationBits per KV precision
KV_PRECISIONS = tuple(BITS)
OPTION = "kvCacheQuantizationBits"  # the plugin EP's session option
ON_PYTORCH = "kvlab.pytorch.generate(model, prompt, cache='quantized', kv_precision='int8' or 'int4')"


def check_kv_precision(kv_precision: object, cache: str) -> str | None:
    """``None`` for the model's own precision (None or "model"), else "int8" or "int4"; ConfigError naming
    ``cache`` (the class) for anything else."""
    if kv_precision is None or (isinstance(kv_precision, str) and kv_precision == "model"):
        return None
    if isinstance(kv_precision, str) and kv_precision in BITS:
        return kv_precision
    raise ConfigError(
        f"{cache}(kv_precision={kv_precision!r}) is not a KV precision: use None (the model's dtype) or one of "
        f"{KV_PRECISIONS} (the WebGPU plugin EP only)"
    )


def check_runs_here(kv_precision: str, cache: str, info: Any, device: Any) -> None:
    """ConfigError unless ``device``'s runtime packs KV and every KV entry is read by a GroupQueryAttention whose head
    size the packing allows (8 bits: a multiple of 4; 4 bits: a power of 2 of at least 8)."""
    asked = f"{cache}(kv_precision={kv_precision!r})"
    if not (device.name == "webgpu" and device.backend.kv_quantization):
        raise ConfigError(
            f"{asked} cannot run on {device.name} with {device.backend.package} {device.backend.version}: only the "
            f"WebGPU plugin EP (onnxruntime-ep-webgpu) packs KV (docs/kv-memory.md). Quantized KV also runs on "
            f"PyTorch: {ON_PYTORCH}"
        )
    if device.adapter.kind == "hardware":
        raise ConfigError(
            f"{asked} cannot run on {device.adapter.name}: on a hardware adapter the plugin EP asks for unpacked KV "
            f"whatever {OPTION} says (docs/kv-memory.md); use kv_precision=None here, or {ON_PYTORCH}"
        )
    for entry in (e for e in info.layout.entries if e.grows):
        head = entry.dims[-1]
        fits = head % 4 == 0 if BITS[kv_precision] == 8 else head >= 8 and head & (head - 1) == 0
        if entry.op != "GroupQueryAttention" or not fits:
            raise ConfigError(
                f"{asked} cannot pack model {info.name}'s {entry.past} (read by {entry.op}, head size {head}): the "
                "plugin EP packs KV in GroupQueryAttention only, with a head size that is a multiple of 4 (int8) or "
                "a power of 2 of at least 8 (int4)"
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
