"""Built-in models: recipes and the Hugging Face checkpoints they are written as (backend-neutral)."""

from .checkpoints import byte_tokenizer, ensure_checkpoint
from .recipes import (
    BUILTIN_NAMES,
    PRECISIONS,
    RECIPES,
    REFUSED_PRECISIONS,
    SPECIAL_TOKENS,
    SmolLM2,
    TinyLlama,
    cache_dir,
    check_precision,
    checkpoint_dir,
    recipe,
)

__all__ = [
    "BUILTIN_NAMES",
    "PRECISIONS",
    "RECIPES",
    "REFUSED_PRECISIONS",
    "check_precision",
    "SPECIAL_TOKENS",
    "SmolLM2",
    "TinyLlama",
    "byte_tokenizer",
    "cache_dir",
    "checkpoint_dir",
    "ensure_checkpoint",
    "recipe",
]
