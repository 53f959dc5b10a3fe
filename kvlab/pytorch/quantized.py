"""Quantized KV on PyTorch: transformers' ``QuantizedCache`` (the newest ``residual_length`` positions kept in the
model's dtype, older ones quantized group-wise) as a kvlab cache setting. ``kv_precision``:

- ``"int8"``: HQQ, 8 bits; ``"int4"``: optimum-quanto, 4 bits (``"int4-hqq"``: HQQ); ``"int2"``: optimum-quanto;
- ``"fp8"``: transformers' own float8_e4m3 layer, one scale per tensor, no residual window.

The bytes held are counted by ``kvlab.pytorch.counters.held_bytes``. Importing this module imports neither torch
nor the quantization packages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError, ModelError, check_int

# kv_precision -> (transformers backend, bits, the package it needs)
KV_PRECISIONS: dict[str, tuple[str, int | None, str]] = {
    "int8": ("hqq", 8, "hqq"),
    "int4": ("quanto", 4, "optimum-quanto"),
    "int4-hqq": ("hqq", 4, "hqq"),
    "int2": ("quanto", 2, "optimum-quanto"),
    "fp8": ("fp8", None, ""),
}
FULL = ("model", None)  # the model's own dtype: no quantization
INSTALL = "pip install 'kvlab[build]' (optimum-quanto; hqq on Linux, elsewhere `pip install hqq==0.2.8`)"


@dataclass(frozen=True)
class QuantizedKV:
    """A quantized-KV cache setting for ``kvlab.pytorch.generate``: ``precision`` (a key of ``KV_PRECISIONS``),
    ``group_size`` values per scale (integer backends), ``residual_length`` newest positions kept unquantized."""

    precision: str = "int8"
    group_size: int = 64
    residual_length: int = 128

    def __post_init__(self) -> None:
        check_kv_precision(self.precision)
        for name in ("group_size", "residual_length"):
            check_int(getattr(self, name), f"QuantizedKV.{name}", 1)

    @property
    def backend(self) -> str:
        """The transformers quantization backend: "hqq", "quanto" or "fp8"."""
        return KV_PRECISIONS[self.precision][0]

    @property
    def bits(self) -> int | None:
        """Bits per quantized value (None for fp8)."""
        return KV_PRECISIONS[self.precision][1]

    @property
    def variant(self) -> str:
        """How the cache label names it: "int8 hqq g64 r128", "fp8"."""
        if self.backend == "fp8":
            return "fp8"
        return f"{self.precision.split('-')[0]} {self.backend} g{self.group_size} r{self.residual_length}"


def check_kv_precision(kv_precision: object) -> str:
    """``kv_precision`` when it is a key of ``KV_PRECISIONS``; ConfigError naming them otherwise."""
    if isinstance(kv_precision, str) and kv_precision in KV_PRECISIONS:
        return kv_precision
    raise ConfigError(
        f"kv_precision={kv_precision!r} is not valid on PyTorch; choose one of {tuple(KV_PRECISIONS)} "
        "(or leave it None: the model's own dtype)"
    )


def _need_package(precision: str) -> None:
    package = KV_PRECISIONS[precision][2]
    if not package:
        return
    import importlib.util

    module = "optimum.quanto" if package == "optimum-quanto" else package
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ModelError(f"kv_precision={precision!r} needs the {package} package: {INSTALL}")


def quantized_setting(cache: Any, kv_precision: Any) -> QuantizedKV | None:
    """The quantized setting a ``generate`` call asks for: ``cache="quantized"`` at ``kv_precision`` (default int8), a
    ``QuantizedKV``, or None. ConfigError for a kv_precision on a cache that cannot hold it."""
    if isinstance(cache, QuantizedKV):
        if kv_precision not in FULL and kv_precision != cache.precision:
            raise ConfigError(f"kv_precision={kv_precision!r} contradicts cache={cache!r}; give one of the two")
        return cache
    if isinstance(cache, str) and cache == "quantized":
        return QuantizedKV("int8" if kv_precision in FULL else check_kv_precision(kv_precision))
    if kv_precision not in FULL:
        check_kv_precision(kv_precision)
        raise ConfigError(
            f"kv_precision={kv_precision!r} with cache={cache!r}: transformers quantizes KV only in its "
            "QuantizedCache (a growing cache; its StaticCache has no quantized form). Use cache='quantized' "
            f"(or kvlab.pytorch.QuantizedKV({kv_precision!r}))"
        )
    return None


def make_quantized(model: Any, setting: QuantizedKV) -> Any:
    """transformers' QuantizedCache for ``model`` with ``setting``; ModelError when its package is missing or the
    model has layers other than full attention (QuantizedCache refuses them)."""
    from transformers import QuantizedCache

    _need_package(setting.precision)
    kinds = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ModelError(
            f"kv_precision={setting.precision!r} cannot run model {model.name}: transformers' QuantizedCache holds "
            f"full-attention layers only, this model has {sorted(kinds)}; use a full-attention model"
        )
    if setting.backend == "fp8":
        cache = QuantizedCache("fp8", model.hf.config)
    else:
        cache = QuantizedCache(
            setting.backend,
            model.hf.config,
            nbits=setting.bits,
            q_group_size=setting.group_size,
            residual_length=setting.residual_length,
        )
    cache.kvlab_variant = setting.variant  # the label kvlab.pytorch.generate gives its runs
    return cache
