"""Load a model directory made by the onnxruntime-genai model builder, and inspect its graph.

A directory holds ``genai_config.json``, the decoder graph it names (``model.onnx`` + ``.data`` by default),
``tokenizer.json`` and a chat template. ``load("toy" | "kv-heavy" | "smollm2" | path)`` builds the built-in ones
on first use (``kvlab.ort.build``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.layout import KVLayout
from ..core.errors import ConfigError, ModelError
from ..core.generation import check_token_ids
from ..presets import BUILTIN_NAMES
from .build import ensure_built
from .graph import ONNX_DTYPES, elem_type, load_graph, producers

_WITH_ENCODER = ("whisper", "t5", "bart", "marian", "encoder")


@dataclass(frozen=True)
class ModelInfo:
    """What kvlab needs to know about a decoder to drive its KV cache."""

    name: str  # a short label for plots and records
    path: Path  # the model directory
    decoder_file: str  # the decoder graph genai_config.json names (inspected and run: the same file)
    model_type: str  # genai_config model.type ("llama", "qwen2", ...)
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA: fewer than query heads)
    head_dim: int
    vocab_size: int
    context_length: int  # the longest sequence the model allows (max_cache_len may not exceed it)
    dtype: np.dtype  # dtype of the KV cache tensors
    eos_token_ids: tuple[int, ...]
    input_names: dict[str, str]  # role ("input_ids", "attention_mask") -> graph input name
    past_names: tuple[tuple[str, str], ...]  # per layer: (key input, value input)
    present_names: tuple[tuple[str, str], ...]  # per layer: (key output, value output)
    logits_name: str
    shares_buffers: bool  # every present.* comes from a GroupQueryAttention node (in-place past/present)
    sharing_problem: str = ""  # why not, when shares_buffers is False

    @property
    def onnx_path(self) -> Path:
        return self.path / self.decoder_file

    @property
    def layout(self) -> KVLayout:
        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, np.dtype(self.dtype))

    @property
    def bytes_per_token(self) -> int:
        """KV cache bytes one token occupies across all layers (keys and values)."""
        return self.layout.bytes_per_token

    @property
    def dtype_name(self) -> str:
        return np.dtype(self.dtype).name

    @property
    def kv_inputs(self) -> list[str]:
        """Every past input, key and value per layer, in order."""
        return [n for pair in self.past_names for n in pair]

    @property
    def kv_outputs(self) -> list[str]:
        """Every present output, in the same order as ``kv_inputs``."""
        return [n for pair in self.present_names for n in pair]


def _need(config: dict, dotted: str, where: Path) -> Any:
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ModelError(f"{where}: genai_config.json has no '{dotted}'; is this an onnxruntime-genai model "
                             "builder output?")
        node = node[key]
    return node


def read_info(path: str | os.PathLike, name: str | None = None) -> ModelInfo:
    """Parse genai_config.json and inspect the decoder graph it names (without loading its weights)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"model directory {str(path)!r} does not exist (built-in names: {', '.join(BUILTIN_NAMES)})")
    cfg_file = path / "genai_config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path} has no genai_config.json: not an onnxruntime-genai model builder output "
                         "(build one with `python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e webgpu`)")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{cfg_file} is not valid JSON: {exc}") from exc
    model = _need(config, "model", path)
    if "encoder" in model or any(t in str(model.get("type", "")) for t in _WITH_ENCODER):
        raise ModelError(f"{path}: model type {model.get('type')!r} has an encoder; kvlab supports decoder-only "
                         "models")
    dec = _need(config, "model.decoder", path)
    decoder_file = str(dec.get("filename", "model.onnx"))
    onnx_file = path / decoder_file
    if not onnx_file.is_file():
        raise ModelError(f"{path}: the decoder file {decoder_file!r} named in genai_config.json is missing")
    layers = int(_need(config, "model.decoder.num_hidden_layers", path))
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    key_fmt = ins.get("past_key_names", "past_key_values.%d.key")
    value_fmt = ins.get("past_value_names", "past_key_values.%d.value")
    pkey_fmt, pvalue_fmt = outs.get("present_key_names", "present.%d.key"), outs.get("present_value_names",
                                                                                    "present.%d.value")
    past = tuple((key_fmt % i, value_fmt % i) for i in range(layers))
    present = tuple((pkey_fmt % i, pvalue_fmt % i) for i in range(layers))

    graph = load_graph(onnx_file)
    inputs = {i.name: i for i in graph.graph.input}
    outputs = [o.name for o in graph.graph.output]
    made_by = {n: node.op_type for n, node in producers(graph).items()}
    known = {ins.get("input_ids", "input_ids"): "input_ids",
             ins.get("attention_mask", "attention_mask"): "attention_mask"}
    known.update({n: "past" for pair in past for n in pair})
    extra = [n for n in inputs if n not in known]
    if extra:
        raise ModelError(f"{path}: graph inputs {extra} are not handled by kvlab (it feeds input_ids, "
                         "attention_mask and past_key_values.*)")
    for out_name in [n for pair in present for n in pair]:
        if out_name not in outputs:
            raise ModelError(f"{path}: output {out_name!r} named in genai_config.json is not in {decoder_file}")
    missing = [n for n in known if n not in inputs]
    if missing:
        raise ModelError(f"{path}: inputs {missing} named in genai_config.json are not in {decoder_file}")
    not_gqa = {n: made_by.get(n, "?") for pair in present for n in pair if made_by.get(n) != "GroupQueryAttention"}
    problem = ""
    if not_gqa:
        first = next(iter(not_gqa.items()))
        problem = (f"{len(not_gqa)} present outputs do not come from a GroupQueryAttention node (e.g. {first[0]!r} "
                   f"is made by {first[1]!r}); only GQA writes the new tokens into a shared past/present buffer")
    kv_types = {elem_type(inputs[n]) for pair in past for n in pair}
    dtype = ONNX_DTYPES.get(next(iter(kv_types), 1), f"onnx type {kv_types}")
    if isinstance(dtype, str):
        raise ModelError(f"{path}: KV cache dtype {dtype} is not supported by numpy/ONNX Runtime's Python API")
    eos = model.get("eos_token_id", [])
    eos = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return ModelInfo(
        name=name or path.name, path=path, decoder_file=decoder_file, model_type=str(model.get("type", "?")),
        num_layers=layers, num_heads=int(dec.get("num_attention_heads", 0)),
        num_kv_heads=int(_need(config, "model.decoder.num_key_value_heads", path)),
        head_dim=int(_need(config, "model.decoder.head_size", path)),
        vocab_size=int(_need(config, "model.vocab_size", path)),
        context_length=int(_need(config, "model.context_length", path)), dtype=np.dtype(dtype), eos_token_ids=eos,
        input_names={v: k for k, v in known.items() if v != "past"}, past_names=past, present_names=present,
        logits_name=outs.get("logits", "logits"), shares_buffers=not not_gqa, sharing_problem=problem,
    )


class Model:
    """A loaded model: its info, tokenizer and chat template (sessions belong to devices: ``Device.session``)."""

    def __init__(self, info: ModelInfo):
        self.info = info
        from tokenizers import Tokenizer

        tok_file = info.path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelError(f"{info.path} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(tok_file))

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def onnx_path(self) -> Path:
        return self.info.onnx_path

    # -- text
    @cached_property
    def chat_template(self) -> str | None:
        jinja = self.info.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text()
        cfg = self.info.path / "tokenizer_config.json"
        if cfg.is_file():
            return json.loads(cfg.read_text()).get("chat_template")
        return None

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the model's template (the same Jinja semantics transformers uses)."""
        if self.chat_template is None:
            raise ModelError(f"model {self.name} has no chat template; pass plain text without --chat")
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ConfigError(f"chat message {m!r} must be a dict with 'role' and 'content'")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ConfigError(f"chat template error: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(messages=list(messages),
                                                          add_generation_prompt=add_generation_prompt)

    def encode(self, prompt: str | Sequence[dict[str, str]] | Sequence[int] | np.ndarray, chat: bool = False) -> np.ndarray:
        """Token ids [n] (int64) of a text, chat messages (rendered with the template) or ids (checked)."""
        if isinstance(prompt, np.ndarray) or (isinstance(prompt, (list, tuple)) and prompt
                                              and not isinstance(prompt[0], dict)):
            out = self.check_ids(prompt)
        elif isinstance(prompt, str):
            text = self.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
            out = np.asarray(self.tokenizer.encode(text, add_special_tokens=not chat).ids, np.int64)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt) and prompt:
            out = np.asarray(self.tokenizer.encode(self.apply_chat_template(prompt), add_special_tokens=False).ids,
                             np.int64)
        else:
            raise ConfigError(f"prompt must be text, chat messages or token ids; got {type(prompt).__name__} "
                              f"{prompt!r:.60}")
        if out.size == 0:
            raise ConfigError("the prompt is empty (0 tokens); give at least one token")
        return out

    def check_ids(self, ids: Any) -> np.ndarray:
        """Token ids as a 1-D int64 array, each checked against the vocabulary (batch size 1)."""
        return check_token_ids(ids, self.info.vocab_size)

    def tokens_of(self, text: str, length: int) -> np.ndarray:
        """Exactly ``length`` token ids of real text: ``text`` tokenized and repeated as needed."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ConfigError(f"prompt length {length!r} must be a positive int")
        return np.resize(self.encode(text), int(length)).astype(np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def load(name_or_dir: str | os.PathLike | Model, *, progress: bool = True) -> Model:
    """A built-in model by name (built into the user cache dir on first use) or a model directory."""
    if isinstance(name_or_dir, Model):
        return name_or_dir
    if not isinstance(name_or_dir, (str, os.PathLike)):
        raise ConfigError(f"model must be a name ({', '.join(BUILTIN_NAMES)}) or a directory, got {name_or_dir!r}")
    key = str(name_or_dir)
    if key in BUILTIN_NAMES:
        return Model(read_info(ensure_built(key, progress=progress), name=key))
    if not Path(key).exists():
        raise ModelError(f"model {key!r} is neither a built-in name ({', '.join(BUILTIN_NAMES)}) nor an existing "
                         "directory")
    return Model(read_info(key))
