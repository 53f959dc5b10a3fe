"""The shape of a decoder's KV cache and what a static cache of it reserves, known before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class KVLayout:
    """The shape of a decoder's KV cache: one key and one value tensor [1, kv_heads, length, head_dim] per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: np.dtype

    @property
    def tensors(self) -> int:
        return 2 * self.num_layers

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers (keys and values)."""
        return self.tensors * self.num_kv_heads * self.head_dim * np.dtype(self.dtype).itemsize

    def tensor_shape(self, length: int) -> tuple[int, int, int, int]:
        return (1, self.num_kv_heads, length, self.head_dim)

    def __str__(self) -> str:
        return (f"{self.num_layers} layers x (K, V) of {self.num_kv_heads} heads x {self.head_dim}, "
                f"{np.dtype(self.dtype).name}")


@dataclass(frozen=True)
class MemoryReport:
    """What a static cache will reserve, known before anything is allocated."""

    max_cache_len: int
    bytes_per_token: int
    total_bytes: int
    tensors: int
    tensor_shape: tuple[int, ...]

    def __str__(self) -> str:
        return (f"StaticCache: {self.tensors} tensors of {list(self.tensor_shape)}, {self.bytes_per_token:,} bytes "
                f"per token, {self.total_bytes / 2**20:,.1f} MiB at max_cache_len={self.max_cache_len}")


def check_max_cache_len(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"max_cache_len={value!r} ({type(value).__name__}) must be a positive int")
    if value <= 0:
        raise ConfigError(f"max_cache_len={value} must be a positive int (>= 1)")
    return int(value)
