"""What a model directory's config declares about its decoder (``Declared``), in either layout kvlab reads: an
onnxruntime-genai builder output's ``genai_config.json`` (``declared_genai``) or a Hugging Face Optimum /
transformers.js export's ``config.json`` (``declared_hf``). Only the config is read here; ``kvlab.ort.models.info``
checks it against the graph. A malformed config or an encoder is a ModelError naming the file and key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.cache_layout import STATE_ROLES
from ...core.errors import ModelError

_WITH_ENCODER = ("whisper", "t5", "bart", "marian", "encoder")
BUILDER_HINT = "python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e webgpu"


@dataclass
class Declared:
    """What a directory's config says about its decoder."""

    config_file: str  # "genai_config.json" or "config.json"
    decoder_file: str
    model_type: str
    layers: int
    heads: int  # 0 where the config does not say
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    eos: tuple[int, ...]
    roles: dict[str, str]  # graph input name -> role ("input_ids", "attention_mask", "position_ids", "past")
    past: tuple[tuple[str, str], ...]
    present: tuple[tuple[str, str], ...]
    logits: str
    # the names of fixed-size states per role ("conv", "recurrent"): (past pattern, present pattern), each with %d
    states: dict[str, tuple[str, str]] = field(default_factory=dict)
    # past input -> its head size, where a layer's differs from head_dim (Gemma 4's full-attention layers)
    head_dims: dict[str, int] = field(default_factory=dict)


def _load_json(file: Path) -> dict:
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{file} is not valid JSON: {exc}") from exc
    except RecursionError:  # [[[[...: Python's JSON reader recurses per level
        raise ModelError(f"{file} is nested too deeply to be a model config (is it damaged?)") from None
    except OSError as exc:  # no permission to read it, a directory, an I/O error
        raise ModelError(f"{file} cannot be read: {exc.strerror or exc}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{file} must hold a JSON object, not {type(config).__name__}")
    return config


def _get(config: dict, dotted: str, file: Path, default: Any = ...) -> Any:
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            if default is not ...:
                return default
            raise ModelError(f"{file} has no '{dotted}'; is this an onnxruntime-genai model builder output?")
        node = node[key]
    return node


def _int(config: dict, dotted: str, file: Path, default: Any = ...) -> int:
    value = _get(config, dotted, file, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelError(f"{file}: '{dotted}' is {value!r}; it must be a non-negative integer")
    return value


def _eos(value: Any, file: Path) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ModelError(f"{file}: eos_token_id {value!r} must be an integer or a list of integers")
    return tuple(values)


def _checked(declared: Declared, file: Path) -> Declared:
    """``declared`` when its numbers make a usable decoder (a context of at least one position, EOS ids inside the
    vocabulary); else a ModelError naming the key and value."""
    if declared.context < 1:
        raise ModelError(f"{file}: the context length is {declared.context}; a decoder must hold at least 1 position")
    bad = [e for e in declared.eos if not 0 <= e < declared.vocab]
    if bad:
        raise ModelError(
            f"{file}: eos_token_id {bad[0]} is outside the vocabulary [0, {declared.vocab}); generation could never "
            "stop on it"
        )
    return declared


def _names(fmt_key: str, fmt_value: str, layers: int, file: Path) -> tuple[tuple[str, str], ...]:
    try:
        return tuple((fmt_key % i, fmt_value % i) for i in range(layers))
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{file}: the name patterns {fmt_key!r}, {fmt_value!r} must hold one %d") from exc


def declared_genai(path: Path) -> Declared:
    """What an onnxruntime-genai builder output's genai_config.json declares; ModelError for a malformed config or
    a model with an encoder."""
    file = path / "genai_config.json"
    config = _load_json(file)
    model = _get(config, "model", file)
    if "encoder" in model or any(t in str(model.get("type", "")) for t in _WITH_ENCODER):
        raise ModelError(f"{path}: model type {model.get('type')!r} has an encoder; kvlab supports decoder-only models")
    dec = _get(config, "model.decoder", file)
    layers = _int(config, "model.decoder.num_hidden_layers", file)
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    past = _names(
        ins.get("past_key_names", "past_key_values.%d.key"),
        ins.get("past_value_names", "past_key_values.%d.value"),
        layers,
        file,
    )
    roles = {
        ins.get("input_ids", "input_ids"): "input_ids",
        ins.get("attention_mask", "attention_mask"): "attention_mask",
        **{n: "past" for pair in past for n in pair},
    }
    if "position_ids" in ins:
        roles[ins["position_ids"]] = "position_ids"
    states = {}
    for role in STATE_ROLES:  # builder 0.18: "past.%d.conv" / "present.%d.conv", "past.%d.recurrent" / ...
        if f"past_{role}_names" in ins:
            fmt = (ins[f"past_{role}_names"], outs.get(f"present_{role}_names", ""))
            _names(*fmt, 1, file)
            states[role] = fmt
    declared = Declared(
        "genai_config.json",
        str(dec.get("filename", "model.onnx")),
        str(model.get("type", "?")),
        layers,
        _int(config, "model.decoder.num_attention_heads", file, 0),
        _int(config, "model.decoder.num_key_value_heads", file),
        _int(config, "model.decoder.head_size", file),
        _int(config, "model.vocab_size", file),
        _int(config, "model.context_length", file),
        _eos(model.get("eos_token_id"), file),
        roles,
        past,
        _names(
            outs.get("present_key_names", "present.%d.key"),
            outs.get("present_value_names", "present.%d.value"),
            layers,
            file,
        ),
        outs.get("logits", "logits"),
        states,
    )
    return _checked(declared, file)


def declared_hf(path: Path) -> Declared:
    """What a Hugging Face Optimum / transformers.js export declares: config.json and model.onnx (or
    onnx/model.onnx); ModelError for a malformed config, a missing graph or an encoder-decoder."""
    file = path / "config.json"
    config = _load_json(file)
    decoder = next((f for f in ("model.onnx", "onnx/model.onnx") if (path / f).is_file()), None)
    if decoder is None:
        found = sorted(str(p.relative_to(path)) for p in path.glob("**/*.onnx"))
        raise ModelError(f"{path} has a config.json but no model.onnx or onnx/model.onnx (found {found or 'none'})")
    text = config.get("text_config", config)  # multimodal configs keep the decoder's numbers there
    if config.get("is_encoder_decoder"):
        raise ModelError(
            f"{path}: {config.get('model_type')!r} is an encoder-decoder; kvlab supports decoder-only models"
        )
    layers, heads = _int(text, "num_hidden_layers", file), _int(text, "num_attention_heads", file)
    head_dim = (
        _int(text, "head_dim", file, None)
        if text.get("head_dim") is not None
        else _int(text, "hidden_size", file) // max(heads, 1)
    )
    past = _names("past_key_values.%d.key", "past_key_values.%d.value", layers, file)
    roles = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        **{n: "past" for pair in past for n in pair},
    }
    declared = Declared(
        "config.json",
        decoder,
        str(config.get("model_type", "?")),
        layers,
        heads,
        _int(text, "num_key_value_heads", file, heads),
        head_dim,
        _int(text, "vocab_size", file),
        _int(text, "max_position_embeddings", file),
        _eos(text.get("eos_token_id"), file),
        roles,
        past,
        _names("present.%d.key", "present.%d.value", layers, file),
        "logits",
        head_dims={n: size for layer, size in _per_layer_head_dims(text, file).items() for n in past[layer]},
    )
    return _checked(declared, file)


def _per_layer_head_dims(text: dict, file: Path) -> dict[int, int]:
    """Layer -> head size from a config's ``per_layer_config`` (transformers 5.24's Gemma 4: the full-attention
    layers' heads are larger)."""
    per_layer = text.get("per_layer_config") or {}
    if not isinstance(per_layer, dict):
        raise ModelError(f"{file}: per_layer_config is {per_layer!r:.60}; it must map layer indices to configs")
    layers = _int(text, "num_hidden_layers", file)
    out = {}
    for key, cfg in per_layer.items():
        if not (str(key).isdigit() and int(key) < layers and isinstance(cfg, dict)):
            raise ModelError(f"{file}: per_layer_config key {key!r} must be a layer index below {layers}")
        if "head_dim" in cfg:
            out[int(key)] = _int(cfg, "head_dim", file)
    return out
