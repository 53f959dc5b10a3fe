"""What kvlab knows about a decoder (``ModelInfo``), read from a model directory by ``read_info``: what its config
declares (``kvlab.ort.models.declared``: an onnxruntime-genai builder output or a Hugging Face ONNX export), checked
against its graph at load time, so that a wrong config is named here and not by ONNX Runtime at the first run; what
each layer keeps is read from the graph (``kvlab.ort.models.layers``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...core.cache_layout import CacheEntry, CacheLayout
from ...core.errors import ConfigError, ModelError
from ...presets import BUILTIN_NAMES
from . import mobius
from .declared import BUILDER_HINT, Declared, declared_genai, declared_hf
from .graph import ONNX_DTYPES, attr, elem_type, load_graph, producers, projection_width, uses, weight_format
from .layers import KNOWN_OPS, attention_reading, borrows_kv, read_layers
from .rewrites import needs_plain, plain_graph


@dataclass(frozen=True)
class ModelInfo:
    """What kvlab needs to know about a decoder to drive its KV cache."""

    name: str  # a short label for plots and records
    path: Path  # the model directory
    decoder_file: str  # the graph kvlab runs: the one its config names, or kvlab's plain copy of it (notes say why)
    model_type: str  # the config's model type ("llama", "qwen2", ...)
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA: fewer than query heads)
    head_dim: int
    vocab_size: int
    context_length: int  # the longest sequence the model allows (max_cache_len may not exceed it)
    dtype: np.dtype  # dtype of the KV cache tensors
    logits_dtype: np.dtype  # dtype of the logits output (the activations')
    weights: str  # what the projections hold, read from the graph: "float32", "float16", "int4", "int8"
    eos_token_ids: tuple[int, ...]
    input_names: dict[str, str]  # role ("input_ids", "attention_mask", "position_ids") -> graph input name
    logits_name: str
    layout: CacheLayout  # what every layer keeps: its kind and its entries (past input, present output, shape)
    shares_buffers: bool  # every growing present.* comes from a GroupQueryAttention node (in-place past/present)
    sharing_problem: str = ""  # why not, when shares_buffers is False
    config_file: str = "genai_config.json"  # the layout: "genai_config.json" (a builder's) or "config.json" (HF's)
    unread_inputs: tuple[str, ...] = ()  # graph inputs no node reads: kvlab binds nothing to them
    notes: tuple[str, ...] = ()  # what kvlab read and does not apply, one line each

    @property
    def onnx_path(self) -> Path:
        """The decoder graph's file."""
        return self.path / self.decoder_file

    @property
    def entries(self) -> tuple[CacheEntry, ...]:
        """Every past/present pair the caches hold, in layer order (keys, values and states)."""
        return self.layout.entries

    @property
    def bytes_per_token(self) -> int:
        """KV cache bytes one token occupies across all layers (keys and values; states do not grow)."""
        return self.layout.bytes_per_token

    @property
    def dtype_name(self) -> str:
        """The KV cache's dtype, by name ("float32", "float16")."""
        return np.dtype(self.dtype).name

    @property
    def precision(self) -> str:
        """What the graph holds, in words, e.g. 'int4 weights, float16 activations, float16 KV cache'."""
        return f"{self.weights} weights, {np.dtype(self.logits_dtype).name} activations, {self.dtype_name} KV cache"


def read_info(path: str | os.PathLike, name: str | None = None, dtype: str | None = None) -> ModelInfo:
    """The ``ModelInfo`` of a model directory (either layout), its config checked against its graph (``dtype``: a
    transformers.js variant). ModelError for a missing directory, the first disagreement, or what kvlab cannot feed or
    hold; ConfigError for an unknown dtype or one given for a builder directory."""
    path = Path(path)
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"  # a file: its folder, perhaps
        raise ModelError(f"model directory {str(path)!r} {what} (built-in names: {', '.join(BUILTIN_NAMES)})")
    d = _declared(path, dtype)
    onnx_file = path / d.decoder_file
    if not onnx_file.is_file():
        raise ModelError(f"{path}: the decoder file {d.decoder_file!r} named in {d.config_file} is missing")
    graph = load_graph(onnx_file)
    mobius.check(graph, path)
    inputs = {i.name: i for i in graph.graph.input}
    outputs = {o.name: o for o in graph.graph.output}
    declared = _cache_inputs(d, inputs, borrows_kv(graph))
    _check_layer_count(d, inputs, declared, path)
    unread = _check_names(d, graph, inputs, outputs, declared, path)
    _cross_check(d, graph, inputs, outputs, path)
    first = d.past[0][0] if d.past else next(iter(declared), None)
    types = {"KV cache": elem_type(inputs[first]) if first else 1, "logits": elem_type(outputs[d.logits])}
    dtypes = [ONNX_DTYPES.get(t, f"onnx type {t}") for t in types.values()]
    for what, dt in zip(types, dtypes):
        if isinstance(dt, str):
            raise ModelError(f"{path}: {what} dtype {dt} is not supported by numpy/ONNX Runtime's Python API")
    problem = _sharing_problem(d, graph)
    decoder_file, notes = d.decoder_file, d.notes
    if needs_plain(graph):  # a ring buffer asked of GroupQueryAttention, a state window of 0: kvlab runs it plain
        plain = plain_graph(SimpleNamespace(onnx_path=onnx_file, name=name or path.name))
        decoder_file = plain.relative_to(path).as_posix()
        notes += (
            f"{d.decoder_file} asks GroupQueryAttention for a ring buffer (sliding_window_cache) or sets state_window"
            f"=0: kvlab runs {decoder_file}, without them (a sliding layer reads the same window of a buffer that "
            "keeps every position; RingStaticCache holds only the window)",
        )
    return ModelInfo(
        name=name or path.name,
        path=path,
        decoder_file=decoder_file,
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
        input_names={role: n for n, role in d.roles.items() if role != "past" and n in inputs},
        logits_name=d.logits,
        layout=read_layers(graph, d.layers, declared, d.head_dim, d.kv_heads, path),
        shares_buffers=not problem,
        sharing_problem=problem,
        config_file=d.config_file,
        unread_inputs=unread,
        notes=notes,
    )


def _declared(path: Path, dtype: str | None = None) -> Declared:
    """What the directory's config declares, in whichever layout it has; ModelError where it has neither,
    ConfigError for a ``dtype`` given for a builder directory."""
    if (path / "genai_config.json").is_file():
        if dtype is not None:
            raise ConfigError(
                f"dtype={dtype!r} chooses among a transformers.js directory's onnx/model_<dtype>.onnx files; {path} "
                "is an onnxruntime-genai builder directory, whose genai_config.json names its one decoder"
            )
        return declared_genai(path)
    if (path / "config.json").is_file():
        return declared_hf(path, dtype)
    raise ModelError(
        f"{path} has no genai_config.json: not an onnxruntime-genai model builder output "
        f"(build one with `{BUILDER_HINT}`), nor a Hugging Face ONNX export (config.json + "
        "model.onnx)"
    )


def _cache_inputs(d: Declared, inputs: dict, shared: bool = False) -> dict[str, tuple[int, str, str]]:
    """Each cache input the graph has: past name -> (layer, role, present name). Where layers hold states or borrow KV,
    ``d`` keeps only the KV pairs the graph has."""
    pairs = list(enumerate(zip(d.past, d.present)))  # (layer, ((key, value) past, (key, value) present))
    if d.states or shared:
        pairs = [(i, (p, q)) for i, (p, q) in pairs if p[0] in inputs or p[1] in inputs]
        d.past, d.present = tuple(p for _, (p, _) in pairs), tuple(q for _, (_, q) in pairs)
        d.roles = {n: r for n, r in d.roles.items() if r != "past" or any(n in p for p in d.past)}
    declared = {past: (i, role, present) for i, (p, q) in pairs for past, present, role in zip(p, q, ("key", "value"))}
    for role, (fmt_in, fmt_out) in d.states.items():
        declared.update({fmt_in % i: (i, role, fmt_out % i) for i in range(d.layers) if fmt_in % i in inputs})
    return declared


def _check_layer_count(d: Declared, inputs: dict, declared: dict, path: Path) -> None:
    """ModelError where the config's layer count is not the layers whose KV inputs the graph has (hybrids and KV-shared
    graphs are counted by their attention ops instead: ``_cross_check``)."""
    if d.states or len(d.past) != d.layers or not d.past:  # (a graph whose layers borrow KV: fewer pasts)
        return
    pattern = re.compile(re.escape(d.past_formats[0]).replace("%d", r"(\d+)") + "$")
    layers = {int(m.group(1)) for n in inputs if (m := pattern.match(n))}
    if layers and max(layers) + 1 != d.layers:
        raise ModelError(
            f"{path}: {d.config_file} says num_hidden_layers = {d.layers}, but {d.decoder_file} has KV inputs "
            f"({d.past_formats[0]!r}) for {max(layers) + 1} layers; the config and the graph disagree"
        )


def _check_names(d: Declared, graph: Any, inputs: dict, outputs: dict, declared: dict, path: Path) -> tuple[str, ...]:
    """The graph inputs no node reads (left unbound). ModelError for an input kvlab does not feed that a node reads
    (naming the nodes), or an input or output the config names that the graph lacks."""
    read_by = uses(graph)
    extra = [n for n in inputs if n not in d.roles and n not in declared]
    unread = tuple(n for n in extra if not read_by.get(n))
    extra = [n for n in extra if n not in unread]
    if extra:
        found = "; ".join(
            f"{n!r} is read by " + ", ".join(f"{node.op_type} node {node.name!r}" for node, _ in read_by[n])
            for n in extra[:4]
        )
        raise ModelError(
            f"{path}: graph inputs {extra} are not handled by kvlab ({found}); it feeds input_ids, "
            "attention_mask, position_ids and the cache inputs its config names, read by "
            f"{KNOWN_OPS}"
        )
    unread += tuple(n for n, role in d.roles.items() if n in inputs and role != "past" and not read_by.get(n))
    missing = [n for n, role in d.roles.items() if n not in inputs and role != "position_ids"]
    if missing:
        raise ModelError(f"{path}: inputs {missing} named in {d.config_file} are not in {d.decoder_file}")
    for out_name in [*(present for _, _, present in declared.values()), d.logits]:
        if out_name not in outputs:
            raise ModelError(f"{path}: output {out_name!r} named in {d.config_file} is not in {d.decoder_file}")
    return unread


def _sharing_problem(d: Declared, graph: Any) -> str:
    """Why a static cache cannot share its past and present buffers on this graph ("" when it can): every present
    output must come from a GroupQueryAttention node. Names the first node that makes one instead."""
    made_by = producers(graph)
    gqa = "GroupQueryAttention"
    not_gqa = {n: made_by.get(n) for pair in d.present for n in pair if getattr(made_by.get(n), "op_type", "") != gqa}
    if not not_gqa:
        return ""
    present, node = next(iter(not_gqa.items()))
    maker = f"{node.op_type!r} node {node.name!r}" if node is not None else "no node"
    reader = attention_reading(uses(graph), present)
    if reader is not None and reader is not node and reader.op_type != "Softmax":
        maker += f", read by {reader.op_type} node {reader.name!r}"
    return (
        f"{len(not_gqa)} present outputs do not come from a GroupQueryAttention node ({present!r} is made by "
        f"{maker}); only GroupQueryAttention writes the new tokens into a shared past/present buffer. What works: "
        f"a DynamicCache on this graph; for a StaticCache, rebuild the model with the onnxruntime-genai builder "
        f"(`{BUILDER_HINT}`), whose attention is GroupQueryAttention"
    )


def _dim(value_info: Any, axis: int) -> int | None:
    dims = value_info.type.tensor_type.shape.dim
    return dims[axis].dim_value if len(dims) > axis and dims[axis].HasField("dim_value") else None


def _cross_check(d: Declared, graph: Any, inputs: dict, outputs: dict, path: Path) -> None:
    """Every declared number the graph also holds must agree with it: ModelError naming the first that does not."""

    def agree(what: str, declared: int, actual: int | None, where: str) -> None:
        if actual is not None and declared != actual:
            raise ModelError(
                f"{path}: {d.config_file} says {what} = {declared}, but {where} in {d.decoder_file} "
                f"says {actual}; the config and the graph disagree"
            )

    for key, _ in d.past:
        agree("num_key_value_heads", d.kv_heads, _dim(inputs[key], 1), f"input {key!r}")
        agree("head_size", d.head_dims.get(key, d.head_dim), _dim(inputs[key], 3), f"input {key!r}")
    agree("vocab_size", d.vocab, _dim(outputs[d.logits], 2), f"output {d.logits!r}")
    gqa = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    if gqa:
        agree(
            "num_hidden_layers (attention layers)" if not d.states else "the attention layers (KV inputs)",
            d.layers if not d.states else len(d.past),
            len(gqa),
            "the count of GroupQueryAttention nodes",
        )
    for node in gqa[:1]:
        agree("num_key_value_heads", d.kv_heads, attr(node, "kv_num_heads"), f"{node.name!r} kv_num_heads")
        if d.heads:
            agree("num_attention_heads", d.heads, attr(node, "num_heads"), f"{node.name!r} num_heads")
        width = projection_width(graph, node.input[0])
        packed = len(node.input) > 2 and not node.input[1] and not node.input[2]  # one q|k|v projection
        per_token = d.heads + 2 * d.kv_heads if packed else d.heads
        if d.heads and width and width % per_token == 0:
            agree(
                "head_size",
                d.head_dim,
                width // per_token,
                f"the {'q|k|v' if packed else 'q'} projection feeding {node.name!r} (width {width})",
            )
    for node in [n for n in graph.graph.node if n.op_type == "MultiHeadAttention"][:1]:
        if d.heads:
            agree("num_attention_heads", d.heads, attr(node, "num_heads"), f"{node.name!r} num_heads")
    inits = {t.name: t for t in graph.graph.initializer}
    rotary = [(n, 7) for n in gqa] + [(n, 2) for n in graph.graph.node if n.op_type == "RotaryEmbedding"]
    for node, index in rotary:  # the cos cache: GroupQueryAttention's input 7, RotaryEmbedding's input 2
        cos = inits.get(node.input[index]) if len(node.input) > index else None
        columns = cos.dims[1] if cos is not None and len(cos.dims) == 2 else None
        past = inputs.get(node.input[3]) or outputs.get(node.input[3]) if len(node.input) > 3 else None
        head = (_dim(past, 3) if past is not None else None) or d.head_dim  # its past keys say (Gemma 4: two sizes)
        if node.op_type == "GroupQueryAttention" and columns and (columns % 8 or 2 * columns > head):
            raise ModelError(
                f"{path}: the rotary table of {node.name!r} has {columns} columns, for heads of {head}; "
                "ONNX Runtime's GroupQueryAttention takes a multiple of 8 up to head_size / 2 and fails at the "
                "first run otherwise ('cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8'), as "
                "onnxruntime-genai does: its partial rotary dimension needs to be a multiple of 16"
            )
        if cos is not None and cos.dims and d.context > cos.dims[0]:
            raise ModelError(
                f"{path}: {d.config_file} says context_length = {d.context}, but the rotary table of "
                f"{node.name!r} holds {cos.dims[0]} positions; a longer sequence would fail inside "
                "ONNX Runtime ('cos_cache dimension 0 shall not be less than total_sequence_length')"
            )
