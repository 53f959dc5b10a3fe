"""Hugging Face transformers causal LMs on PyTorch: a built-in preset's checkpoint, a local directory, a loaded model,
or random weights of a named shape. Needs transformers 5.x (``TRANSFORMERS_RANGE``) and torch, imported on first use."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import presets
from ..core.errors import ConfigError, DeviceError, ModelError, check_choice
from ..core.guards import check_token_ids
from ..core.labels import Adapter, DeviceLabel, cpu_adapter

if TYPE_CHECKING:  # pragma: no cover
    import torch

TRANSFORMERS_RANGE = (5, 6)  # [5.0, 6.0): per-layer StaticLayer with a device cumulative_length
DTYPES = ("float32", "float16", "bfloat16")
ATTENTION = ("sdpa", "eager")  # the attention implementations a 4-D mask can drive
# Random-weight shapes by name (``random_model``; a recording passes its own LlamaConfig fields instead)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
}


def need_torch() -> Any:
    """The torch module; ModelError saying how to install it when it is missing."""
    try:
        import torch
    except ImportError as exc:
        raise ModelError("the PyTorch backend needs torch: pip install 'kvlab[build]'") from exc
    return torch


def check_transformers() -> None:
    """ModelError when transformers is missing or outside the supported range."""
    try:
        import transformers
    except ImportError as exc:
        raise ModelError("the PyTorch backend needs transformers>=5.0,<6: pip install 'kvlab[build]'") from exc
    major = int(transformers.__version__.split(".")[0])
    if not TRANSFORMERS_RANGE[0] <= major < TRANSFORMERS_RANGE[1]:
        raise ModelError(
            f"transformers {transformers.__version__} is not supported: kvlab's PyTorch backend needs "
            f">={TRANSFORMERS_RANGE[0]}.0,<{TRANSFORMERS_RANGE[1]} (per-layer StaticCache API)"
        )


def cache_kwarg(hf_model: Any) -> str:
    """The forward argument that takes the cache: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    params = inspect.signature(hf_model.forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise ModelError(
        f"{type(hf_model).__name__}.forward takes neither cache= nor past_key_values=; not a causal LM with a KV cache"
    )


@dataclass
class TorchModel:
    """A transformers causal LM (eval mode, one device, one dtype) with its tokenizer when it has one."""

    hf: Any  # PreTrainedModel
    name: str
    tokenizer: Any = None  # a transformers tokenizer, or None (token-id prompts only)

    @property
    def device(self) -> torch.device:
        """The device its parameters are on."""
        return next(self.hf.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Its parameters' dtype."""
        return next(self.hf.parameters()).dtype

    @property
    def label(self) -> DeviceLabel:
        """The device this model runs on, as a label (adapter: the CPU, or the CUDA GPU's name)."""
        torch = need_torch()
        dev = self.device
        adapter = Adapter(torch.cuda.get_device_name(dev), "hardware", "cuda") if dev.type == "cuda" else cpu_adapter()
        return DeviceLabel(dev.type, adapter, "torch", torch.__version__)

    @property
    def dtype_name(self) -> str:
        """The dtype's name, e.g. "float32"."""
        return str(self.dtype).replace("torch.", "")

    @property
    def config(self) -> Any:
        """The text decoder's transformers config."""
        return self.hf.config.get_text_config(decoder=True)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""
        return int(self.config.vocab_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids (its generation config's, else its config's; none when neither names one)."""
        eos = self.hf.generation_config.eos_token_id if self.hf.generation_config else self.config.eos_token_id
        eos = self.config.eos_token_id if eos is None else eos
        return tuple(int(e) for e in ([] if eos is None else eos if isinstance(eos, (list, tuple)) else [eos]))

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers (keys and values)."""
        c = self.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return 2 * c.num_hidden_layers * kv_heads * head_dim * self.dtype.itemsize

    def encode(self, prompt: Any, chat: bool = False) -> list[int]:
        """Token ids of a text, chat messages (rendered with the template) or ids (checked against the vocab)."""
        if isinstance(prompt, np.ndarray) or (
            isinstance(prompt, (list, tuple)) and prompt and not isinstance(prompt[0], dict)
        ):
            return check_token_ids(prompt, self.vocab_size).tolist()
        if self.tokenizer is None:
            raise ConfigError(f"model {self.name!r} has no tokenizer: give the prompt as token ids")
        if isinstance(prompt, str) and not chat:
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            out = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        raise ConfigError(
            f"prompt must be a text, chat messages or token ids, got {type(prompt).__name__}: {prompt!r:.80}"
        )

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens skipped); "" without a tokenizer."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def _placement(device: str | Any, dtype: str | Any, attn_implementation: str) -> tuple[torch.device, torch.dtype]:
    """Checked device and dtype for a model about to be made (and the versions and attention it needs)."""
    torch = need_torch()
    check_transformers()
    check_choice(attn_implementation, ATTENTION, "attn_implementation=")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device; choose 'cpu' or 'cuda[:N]'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: kvlab's PyTorch backend runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device={device!r} asked for, but torch {torch.__version__} sees no CUDA device")
    return dev, dtype if isinstance(dtype, torch.dtype) else getattr(torch, check_choice(dtype, DTYPES, "dtype="))


def load(
    source: str | os.PathLike | Any,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    name: str | None = None,
) -> TorchModel:
    """A transformers causal LM: a kvlab built-in name (the checkpoint its ONNX model was built from), a local Hugging
    Face directory, or a loaded ``PreTrainedModel``, on ``device`` ("cpu" or "cuda") in ``dtype``. Raises ConfigError
    for a bad argument, DeviceError for CUDA asked for but absent, ModelError for a source that is not a causal LM with
    a KV cache."""
    dev, dt = _placement(device, dtype, attn_implementation)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(source, (str, os.PathLike)):
        if not hasattr(source, "config") or not hasattr(source, "forward"):
            raise ConfigError(f"source must be a built-in name, a directory or a transformers model, got {source!r}")
        cache_kwarg(source)
        hf = source.to(device=dev, dtype=dt).eval()
        hf.config._attn_implementation = attn_implementation
        return TorchModel(hf, name or type(source).__name__)
    path = Path(source)
    if str(source) in presets.BUILTIN_NAMES:
        path = presets.ensure_checkpoint(str(source))
        name = name or str(source)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"{str(source)!r} is neither a built-in model ({', '.join(presets.BUILTIN_NAMES)}) nor a "
            "Hugging Face model directory with a config.json"
        )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation=attn_implementation).to(dev).eval()
    cache_kwarg(hf)
    tok = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return TorchModel(hf, name or path.name, tok)


def random_model(
    shape: str | dict[str, Any] = "tiny",
    *,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    std: float = 0.02,
    attn_implementation: str = "sdpa",
) -> TorchModel:
    """A random-weight Llama of a named shape (``SHAPES``) or of the LlamaConfig fields ``shape`` gives, on ``device``
    (no tokenizer), named "<shape>-random" ("custom-random"). Raises as ``load`` does."""
    torch = need_torch()
    fields = shape if isinstance(shape, dict) else SHAPES[check_choice(shape, sorted(SHAPES), "shape=")]
    dev, dt = _placement(device, dtype, attn_implementation)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with dev:
        hf = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    return TorchModel(hf.to(dt).eval(), f"{'custom' if isinstance(shape, dict) else shape}-random")
