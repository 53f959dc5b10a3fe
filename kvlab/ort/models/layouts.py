"""Reading a model directory into a ``ModelInfo``: what its config declares, checked against its graph.

Two layouts are read:

- an onnxruntime-genai model builder output: ``genai_config.json`` naming the decoder graph (``model.onnx`` by
  default) and its input/output names;
- a Hugging Face Optimum / transformers.js export: ``config.json`` beside ``model.onnx`` (or ``onnx/model.onnx``),
  inputs ``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.N.key|value``.

Every number the config declares that the graph also holds (layers, KV heads, head size, vocabulary, the rotary
table's length) is compared with the graph here, at load time, so a wrong config is named here, not by ONNX
Runtime at the first run. What each layer keeps (KV, a sliding window's KV, conv and recurrent states) is read from
the graph by ``kvlab.ort.models.layers``: the config names the inputs, the ops that read them say what they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ModelError
from ...core.layout import STATE_ROLES
from .graph import ONNX_DTYPES, elem_type, load_graph, producers, uses, weight_format
from .info import ModelInfo
from .layers import known_ops, read_layers

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


def _load_json(file: Path) -> dict:
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{file} is not valid JSON: {exc}") from exc
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
    return Declared(
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
    return Declared(
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
    )


def read_info(path: Path, name: str | None = None) -> ModelInfo:
    """The ``ModelInfo`` of a model directory (either layout), its config checked against its graph; ModelError
    naming the first disagreement, or what kvlab cannot feed or hold."""
    if (path / "genai_config.json").is_file():
        d = declared_genai(path)
    elif (path / "config.json").is_file():
        d = declared_hf(path)
    else:
        raise ModelError(
            f"{path} has no genai_config.json: not an onnxruntime-genai model builder output "
            f"(build one with `{BUILDER_HINT}`), nor a Hugging Face ONNX export (config.json + "
            "model.onnx)"
        )
    onnx_file = path / d.decoder_file
    if not onnx_file.is_file():
        raise ModelError(f"{path}: the decoder file {d.decoder_file!r} named in {d.config_file} is missing")
    graph = load_graph(onnx_file)
    inputs = {i.name: i for i in graph.graph.input}
    outputs = {o.name: o for o in graph.graph.output}
    pairs = list(enumerate(zip(d.past, d.present)))  # (layer, ((key, value) past, (key, value) present))
    if d.states:  # a hybrid: each layer has KV or states; the KV pairs are those the graph has
        pairs = [(i, (p, q)) for i, (p, q) in pairs if p[0] in inputs or p[1] in inputs]
        d.past, d.present = tuple(p for _, (p, _) in pairs), tuple(q for _, (_, q) in pairs)
        d.roles = {n: r for n, r in d.roles.items() if r != "past" or any(n in p for p in d.past)}
    declared = {past: (i, role, present) for i, (p, q) in pairs for past, present, role in zip(p, q, ("key", "value"))}
    for role, (fmt_in, fmt_out) in d.states.items():
        declared.update({fmt_in % i: (i, role, fmt_out % i) for i in range(d.layers) if fmt_in % i in inputs})
    extra = [n for n in inputs if n not in d.roles and n not in declared]
    if extra:
        read_by = uses(graph)
        found = "; ".join(
            f"{n!r} is read by "
            + (", ".join(f"{node.op_type} node {node.name!r}" for node, _ in read_by.get(n, [])) or "no node")
            for n in extra[:4]
        )
        raise ModelError(
            f"{path}: graph inputs {extra} are not handled by kvlab ({found}); it feeds input_ids, "
            "attention_mask, position_ids and the cache inputs its config names, read by "
            f"{known_ops()}"
        )
    missing = [n for n, role in d.roles.items() if n not in inputs and role != "position_ids"]
    if missing:
        raise ModelError(f"{path}: inputs {missing} named in {d.config_file} are not in {d.decoder_file}")
    for out_name in [*(n for pair in d.present for n in pair), d.logits]:
        if out_name not in outputs:
            raise ModelError(f"{path}: output {out_name!r} named in {d.config_file} is not in {d.decoder_file}")
    _cross_check(d, graph, inputs, outputs, path)
    cache = read_layers(graph, d.layers, declared, d.head_dim, d.kv_heads, path)
    made_by = {n: node.op_type for n, node in producers(graph).items()}
    not_gqa = {n: made_by.get(n, "?") for pair in d.present for n in pair if made_by.get(n) != "GroupQueryAttention"}
    problem = ""
    if not_gqa:
        first = next(iter(not_gqa.items()))
        problem = (
            f"{len(not_gqa)} present outputs do not come from a GroupQueryAttention node (e.g. {first[0]!r} "
            f"is made by {first[1]!r}); only GQA writes the new tokens into a shared past/present buffer. "
            f"Rebuild the model with the onnxruntime-genai builder (`{BUILDER_HINT}`), whose attention is GQA"
        )
    first = next(iter(declared), None)
    dtypes = [
        ONNX_DTYPES.get(t, f"onnx type {t}")
        for t in (
            elem_type(inputs[d.past[0][0]] if d.past else inputs[first]) if first else 1,
            elem_type(outputs[d.logits]),
        )
    ]
    for what, dt in zip(("KV cache", "logits"), dtypes):
        if isinstance(dt, str):
            raise ModelError(f"{path}: {what} dtype {dt} is not supported by numpy/ONNX Runtime's Python API")
    roles = {role: n for n, role in d.roles.items() if role != "past" and n in inputs}
    return ModelInfo(
        name=name or path.name,
        path=path,
        decoder_file=d.decoder_file,
        model_type=d.model_type,
        num_layers=d.layers,
        num_heads=d.heads,
        num_kv_heads=d.kv_heads,
        head_dim=d.head_dim,
        vocab_size=d.vocab,
        context_length=d.context,
        dtype=np.dtype(dtypes[0]),
        logits_dtype=np.dtype(dtypes[1]),
        weights=weight_format(graph),
        eos_token_ids=d.eos,
        input_names=roles,
        past_names=d.past,
        present_names=d.present,
        logits_name=d.logits,
        shares_buffers=not not_gqa,
        sharing_problem=problem,
        cache_layout=cache,
    )


def _projection_width(graph: Any, inits: dict, name: str) -> int | None:
    """Output width of the MatMul (fp32/fp16 weights) or MatMulNBits (int4: its N) that makes ``name``, through a
    bias Add; None when the graph makes it some other way."""
    producer = {o: n for n in graph.graph.node for o in n.output}
    node = producer.get(name)
    if node is not None and node.op_type == "Add":
        node = next(
            (producer[i] for i in node.input if i in producer and producer[i].op_type in ("MatMul", "MatMulNBits")),
            None,
        )
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), None)
    if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
        dims = inits[node.input[1]].dims
        return int(dims[-1]) if len(dims) == 2 else None
    return None


def _dim(value_info: Any, axis: int) -> int | None:
    dims = value_info.type.tensor_type.shape.dim
    return dims[axis].dim_value if len(dims) > axis and dims[axis].HasField("dim_value") else None


def _cross_check(d: Declared, graph: Any, inputs: dict, outputs: dict, path: Path) -> None:
    """Every declared number the graph also holds must agree with it."""

    def agree(what: str, declared: int, actual: int | None, where: str) -> None:
        if actual is not None and declared != actual:
            raise ModelError(
                f"{path}: {d.config_file} says {what} = {declared}, but {where} in {d.decoder_file} "
                f"says {actual}; the config and the graph disagree"
            )

    for key, _ in d.past:
        agree("num_key_value_heads", d.kv_heads, _dim(inputs[key], 1), f"input {key!r}")
        agree("head_size", d.head_dim, _dim(inputs[key], 3), f"input {key!r}")
    agree("vocab_size", d.vocab, _dim(outputs[d.logits], 2), f"output {d.logits!r}")
    inits = {t.name: t for t in graph.graph.initializer}
    gqa = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    if gqa:
        agree(
            "num_hidden_layers (attention layers)" if not d.states else "the attention layers (KV inputs)",
            d.layers if not d.states else len(d.past),
            len(gqa),
            "the count of GroupQueryAttention nodes",
        )
    for node in gqa[:1]:
        attrs = {a.name: a.i for a in node.attribute}
        agree("num_key_value_heads", d.kv_heads, attrs.get("kv_num_heads"), f"{node.name!r} kv_num_heads")
        if d.heads:
            agree("num_attention_heads", d.heads, attrs.get("num_heads"), f"{node.name!r} num_heads")
        width = _projection_width(graph, inits, node.input[0])
        packed = len(node.input) > 2 and not node.input[1] and not node.input[2]  # one q|k|v projection
        per_token = d.heads + 2 * d.kv_heads if packed else d.heads
        if d.heads and width and width % per_token == 0:
            agree(
                "head_size",
                d.head_dim,
                width // per_token,
                f"the {'q|k|v' if packed else 'q'} projection feeding {node.name!r} (width {width})",
            )
        cos = inits.get(node.input[7]) if len(node.input) > 7 else None
        if cos is not None and cos.dims and d.context > cos.dims[0]:
            raise ModelError(
                f"{path}: {d.config_file} says context_length = {d.context}, but the rotary table of "
                f"{node.name!r} holds {cos.dims[0]} positions; a longer sequence would fail inside "
                "ONNX Runtime ('cos_cache dimension 0 shall not be less than total_sequence_length')"
            )
