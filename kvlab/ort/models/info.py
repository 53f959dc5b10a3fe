"""What kvlab knows about a decoder: read from its directory's config and graph by ``kvlab.ort.models.layouts``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ...core.cache_layout import CacheEntry, CacheLayout, FullAttention, LayerSpec


@dataclass(frozen=True)
class ModelInfo:
    """What kvlab needs to know about a decoder to drive its KV cache."""

    name: str  # a short label for plots and records
    path: Path  # the model directory
    decoder_file: str  # the decoder graph genai_config.json names (inspected and run: the same file)
    model_type: str  # genai_config model.type ("llama", "qwen2", ...)
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA: fewer than query heads)
    head_dim: int
    vocab_size: int
    context_length: int  # the longest sequence the model allows (max_cache_len may not exceed it)
    dtype: np.dtype  # dtype of the KV cache tensors
    logits_dtype: np.dtype  # dtype of the logits output (the activations')
    weights: str  # what the projections hold, read from the graph: "float32", "float16", "int4", "int8"
    eos_token_ids: tuple[int, ...]
    input_names: dict[str, str]  # role ("input_ids", "attention_mask") -> graph input name
    past_names: tuple[tuple[str, str], ...]  # per layer: (key input, value input)
    present_names: tuple[tuple[str, str], ...]  # per layer: (key output, value output)
    logits_name: str
    shares_buffers: bool  # every growing present.* comes from a GroupQueryAttention node (in-place past/present)
    sharing_problem: str = ""  # why not, when shares_buffers is False
    cache_layout: CacheLayout | None = None  # per layer, read from the graph (None: every layer full attention)

    @property
    def onnx_path(self) -> Path:
        return self.path / self.decoder_file

    @cached_property
    def layout(self) -> CacheLayout:
        """What every layer keeps: its kind and its entries (past input, present output, shape), in order."""
        if self.cache_layout is not None:
            return self.cache_layout
        dims = (1, self.num_kv_heads, 0, self.head_dim)
        return CacheLayout(
            tuple(
                LayerSpec(
                    i,
                    FullAttention(),
                    tuple(
                        CacheEntry(i, role, past, present, dims, np.dtype(self.dtype), "GroupQueryAttention")
                        for role, past, present in zip(("key", "value"), p, q)
                    ),
                )
                for i, (p, q) in enumerate(zip(self.past_names, self.present_names))
            )
        )

    @property
    def entries(self) -> tuple[CacheEntry, ...]:
        """Every past/present pair the caches hold, in order (keys, values and states)."""
        return self.layout.entries

    @property
    def bytes_per_token(self) -> int:
        """KV cache bytes one token occupies across all layers (keys and values; states do not grow)."""
        return self.layout.bytes_per_token

    @property
    def dtype_name(self) -> str:
        return np.dtype(self.dtype).name

    @property
    def precision(self) -> str:
        """What the graph holds, in words, e.g. 'int4 weights, float16 activations, float16 KV cache'."""
        return f"{self.weights} weights, {np.dtype(self.logits_dtype).name} activations, {self.dtype_name} KV cache"

    @cached_property
    def kv_inputs(self) -> list[str]:
        """Every past input (key and value per attention layer, the states of the others), in layer order."""
        return [e.past for e in self.layout.entries]

    @cached_property
    def kv_outputs(self) -> list[str]:
        """Every present output, in the same order as ``kv_inputs``."""
        return [e.present for e in self.layout.entries]
