"""The presets room: the built-in models, backend-neutral. Their recipes and the user cache dir they are built into
(``recipes``), and the Hugging Face checkpoints the recipes are written as (``checkpoints``; torch and transformers,
imported where a checkpoint is written). Imports ``kvlab.core`` only; each backend builds its own format from
these checkpoints."""

from .checkpoints import byte_tokenizer, ensure_checkpoint, save_byte_tokenizer
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
    "save_byte_tokenizer",
    "cache_dir",
    "checkpoint_dir",
    "ensure_checkpoint",
    "recipe",
]
