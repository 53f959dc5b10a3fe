"""What a model directory's config declares about its decoder (``Declared``): an onnxruntime-genai builder output's
``genai_config.json`` (``declared_genai``) or a Hugging Face Optimum / transformers.js export's ``config.json``
(``declared_hf``; its decoder file: ``transformers_js_file``). ``kvlab.ort.models.info`` checks it against the graph. A
malformed config or an encoder is a ModelError naming the file and key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.cache_layout import STATE_ROLES
from ...core.errors import ConfigError, ModelError

_WITH_ENCODER = ("whisper", "t5", "bart", "marian", "encoder")
BUILDER_HINT = "python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e webgpu"
KVLAB_EPS = ("cpu", "webgpu")  # the execution providers kvlab opens sessions on
# transformers.js's rule (its utils/dtypes.js): a dtype names the suffix of the decoder's file, onnx/model<suffix>.onnx
TRANSFORMERS_JS_SUFFIX = {
    "fp32": "",
    "fp16": "_fp16",
    "int8": "_int8",
    "uint8": "_uint8",
    "q8": "_quantized",
    "q4": "_q4",
    "q4f16": "_q4f16",
    "bnb4": "_bnb4",
}
TRANSFORMERS_JS_DEFAULT = "fp32"  # what transformers.js loads when neither the caller nor config.json names a dtype


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
    notes: tuple[str, ...] = ()  # what kvlab reads but does not apply, one line each (e.g. another EP's options)
    past_formats: tuple[str, str] = ("past_key_values.%d.key", "past_key_values.%d.value")  # the names, with %d


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


def _checked(declared: Declared, config: dict, file: Path, search: Any = None) -> Declared:
    """``declared``, with a note for each thing ``config`` (or a genai ``search`` section) declares that kvlab applies
    only in part (no EOS id, sampling). ModelError naming the key and value for a ``bos_token_id`` or ``pad_token_id``
    outside the vocabulary, a context of no position, or an EOS id outside the vocabulary."""
    vocab = declared.vocab
    for key in ("bos_token_id", "pad_token_id"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab):
            raise ModelError(f"{file}: {key} {value!r} must be a token id in the vocabulary [0, {vocab}) or absent")
    if not declared.eos:
        declared.notes += (
            f"{file.name} declares no EOS token (eos_token_id {config.get('eos_token_id', 'absent')!r}): generation "
            "never stops on one, only at max_new_tokens",
        )
    search = search if isinstance(search, dict) else {}
    if search.get("do_sample") is True:
        keys = ", ".join(f"{k}={search[k]!r}" for k in ("temperature", "top_k", "top_p") if k in search)
        declared.notes += (
            f"{file.name}'s search section samples (do_sample=true{', ' + keys if keys else ''}); kvlab decodes "
            "greedily unless given sampling=Sampling(...) (kvlab generate --sample)",
        )
    if declared.context < 1:
        raise ModelError(f"{file}: the context length is {declared.context}; a decoder must hold at least 1 position")
    bad = [e for e in declared.eos if not 0 <= e < vocab]
    if bad:
        raise ModelError(
            f"{file}: eos_token_id {bad[0]} is outside the vocabulary [0, {vocab}); generation could never stop on it"
        )
    return declared


def _names(fmt_key: str, fmt_value: str, layers: int, file: Path) -> tuple[tuple[str, str], ...]:
    try:
        return tuple((fmt_key % i, fmt_value % i) for i in range(layers))
    except (TypeError, ValueError) as exc:
        raise ModelError(f"{file}: the name patterns {fmt_key!r}, {fmt_value!r} must hold one %d") from exc


def declared_genai(path: Path) -> Declared:
    """What a builder output's genai_config.json declares; ModelError: a malformed config, an encoder."""
    file = path / "genai_config.json"
    config = _load_json(file)
    model = _get(config, "model", file)
    if "encoder" in model or any(t in str(model.get("type", "")) for t in _WITH_ENCODER):
        raise ModelError(f"{path}: model type {model.get('type')!r} has an encoder; kvlab supports decoder-only models")
    dec = _get(config, "model.decoder", file)
    layers = _int(config, "model.decoder.num_hidden_layers", file)
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    formats = (
        ins.get("past_key_names", "past_key_values.%d.key"),
        ins.get("past_value_names", "past_key_values.%d.value"),
    )
    past = _names(*formats, layers, file)
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
        notes=_other_eps(dec, file),
        past_formats=formats,
    )
    return _checked(declared, model, file, config.get("search"))


def _other_eps(decoder: dict, file: Path) -> tuple[str, ...]:
    """A note naming the execution providers other than kvlab's whose options ``decoder.session_options`` sets
    (the builder writes them for its ``-e``): kvlab does not open those EPs, so it ignores them. () when none."""
    options = (decoder.get("session_options") or {}).get("provider_options") or []
    names = [name for entry in options if isinstance(entry, dict) for name in entry if name not in KVLAB_EPS]
    if not names:
        return ()
    return (
        f"{file.name} sets provider options for {', '.join(dict.fromkeys(names))}; kvlab runs the CPU and WebGPU "
        "EPs, so it ignores them",
    )


def declared_hf(path: Path, dtype: str | None = None) -> Declared:
    """What a Hugging Face Optimum / transformers.js export declares (its decoder: ``transformers_js_file``).
    ConfigError for an unknown dtype, ModelError for a malformed config, a missing graph or an encoder-decoder."""
    file = path / "config.json"
    config = _load_json(file)
    decoder = transformers_js_file(path, config, dtype)
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
    eos = _eos(text.get("eos_token_id"), file)
    generation = path / "generation_config.json"
    if not eos and generation.is_file():  # where transformers keeps it for many exports
        eos = _eos(_load_json(generation).get("eos_token_id"), generation)
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
        eos,
        roles,
        past,
        _names("present.%d.key", "present.%d.value", layers, file),
        "logits",
        head_dims=_per_layer_head_dims(text, past, file),
    )
    return _checked(declared, text, file)


def transformers_js_file(path: Path, config: dict, dtype: str | None = None) -> str:
    """The decoder file of a transformers.js / onnx-community directory, relative to ``path``, as transformers.js
    chooses it: ``dtype``, else config.json's ``transformers.js_config.dtype``, else "fp32"; then
    ``onnx/model<suffix>.onnx`` or ``model<suffix>.onnx`` beside config.json. ConfigError for an unknown dtype,
    ModelError naming the dtypes present when the file is missing."""
    if dtype is not None and dtype not in TRANSFORMERS_JS_SUFFIX:
        raise ConfigError(
            f"dtype {dtype!r} is not a transformers.js dtype; choose one of {tuple(TRANSFORMERS_JS_SUFFIX)}"
        )
    wanted = dtype
    if wanted is None:
        js = config.get("transformers.js_config") or {}
        named = js.get("dtype") if isinstance(js, dict) else None
        named = named.get("model") if isinstance(named, dict) else named
        wanted = named if isinstance(named, str) and named in TRANSFORMERS_JS_SUFFIX else TRANSFORMERS_JS_DEFAULT
    suffix = TRANSFORMERS_JS_SUFFIX[wanted]
    for folder in ("onnx/", ""):
        if (path / f"{folder}model{suffix}.onnx").is_file():
            return f"{folder}model{suffix}.onnx"
    present = [d for d, sfx in TRANSFORMERS_JS_SUFFIX.items() if any(path.glob(f"**/model{sfx}.onnx"))]
    found = sorted(str(p.relative_to(path)) for p in path.glob("**/*.onnx"))
    how = "" if dtype is not None else " (as config.json's transformers.js_config says)" if wanted == named else ""
    raise ModelError(
        f"{path} has a config.json but no onnx/model{suffix}.onnx, the file of dtype {wanted!r}{how} as "
        "transformers.js names it; "
        + (f"pass dtype= one of {present}" if present else f"the .onnx files here are {found or 'none'}")
    )


def _per_layer_head_dims(text: dict, past: tuple[tuple[str, str], ...], file: Path) -> dict[str, int]:
    """Past input -> head size from a config's ``per_layer_config`` (Gemma 4's larger full-attention heads)."""
    per_layer = text.get("per_layer_config") or {}
    if not isinstance(per_layer, dict):
        raise ModelError(f"{file}: per_layer_config is {per_layer!r:.60}; it must map layer indices to configs")
    out = {}
    for key, cfg in per_layer.items():
        if not (str(key).isdigit() and int(key) < len(past) and isinstance(cfg, dict)):
            raise ModelError(f"{file}: per_layer_config key {key!r} must be a layer index below {len(past)}")
        if "head_dim" in cfg:
            out |= dict.fromkeys(past[int(key)], _int(cfg, "head_dim", file))
    return out
