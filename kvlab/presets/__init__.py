"""The presets room: the built-in models, backend-neutral. Their recipes and the user cache dir they are built into
(``recipes``), and the Hugging Face checkpoints the recipes are written as (``checkpoints``; torch and transformers,
imported where a checkpoint is written). Imports ``kvlab.core`` only; each backend builds its own format from
these checkpoints."""

from .checkpoints import byte_tokenizer, ensure_checkpoint, save_byte_tokenizer
from .recipes import BUILTIN_NAMES, PRECISIONS, RECIPES, TinyLlama, cache_dir, check_precision, recipe

__all__ = [
    "BUILTIN_NAMES",
    "PRECISIONS",
    "RECIPES",
    "TinyLlama",
    "byte_tokenizer",
    "cache_dir",
    "check_precision",
    "ensure_checkpoint",
    "recipe",
    "save_byte_tokenizer",
]
