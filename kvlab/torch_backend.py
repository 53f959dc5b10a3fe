"""Hugging Face transformers causal LMs on PyTorch through kvlab's contract: the same generation loop, hooks,
per-step ``StepRecord`` rows and ``Generation`` results as the ONNX Runtime path, with transformers'
``DynamicCache`` and ``StaticCache``, and ``GraphRunner``: a CUDA-graph decode loop over a StaticCache.

Supported: transformers >= 5.0, < 6 (the per-layer ``StaticLayer`` with a device ``cumulative_length``; the model
argument is ``cache=`` from 5.24 on and ``past_key_values=`` before: chosen by ``cache_kwarg``), torch >= 2.4.

Per-step columns (``kvlab.instrument.COLUMNS``) keep their meaning; how they are measured here:

- ``run_ms``: the model's forward call; on CUDA up to a ``torch.cuda.synchronize()`` (exact device time + launch).
- ``cache_tensors_allocated`` / ``cache_bytes_allocated``: KV tensors of the cache that are new objects after the
  step (compared by identity, layer by layer): exact on every device. DynamicCache: 2 per layer every step
  (concatenation); StaticCache: 2 per layer at its lazy allocation, then 0.
- ``new_buffers``: of those, storages whose data_ptr this cache never held before (a lower bound, as on ORT).
- ``live_cache_bytes``, ``used_cache_bytes``: exact; ``rss_bytes``: process RSS (proxy).

``TorchStepRecord`` adds the allocator's churn per step (``ALLOC_COLUMNS``):

- on CUDA, exact, from ``torch.cuda.memory_stats()`` deltas over the step: ``alloc_requests``
  (``allocation.all.allocated``: tensors asked of the caching allocator), ``alloc_bytes``
  (``allocated_bytes.all.allocated``) and ``segments`` (``segment.all.allocated``: cudaMalloc calls);
- on CPU there is no allocator statistic: ``alloc_requests``/``alloc_bytes`` count the tensors (and bytes) the
  step's aten operators returned that are not views or in-place results of their inputs (a
  ``TorchDispatchMode`` counter; a proxy for malloc calls; opt in with ``count_cpu_allocs=True``: it runs every
  op through Python and slows a CPU step ~10x, so wall_ms is then not a timing), else -1; ``segments`` is -1.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from .errors import CapacityError, ConfigError, DeviceError, ModelError
from .generate import Generation, Sampling
from .instrument import COLUMNS, StepHook, StepRecord, rss_bytes

if TYPE_CHECKING:  # pragma: no cover
    import torch

TRANSFORMERS_RANGE = (5, 6)  # [5.0, 6.0): per-layer StaticLayer with a device cumulative_length
DTYPES = ("float32", "float16", "bfloat16")
ATTENTION = ("sdpa", "eager")  # the attention implementations a 4-D mask can drive
CACHES = ("dynamic", "static")
ALLOC_COLUMNS: dict[str, tuple[str, str]] = {
    "alloc_requests": ("CUDA: caching-allocator requests during the step (memory_stats allocation.all.allocated "
                       "delta); CPU: non-view, non-in-place tensors returned by aten ops (opt-in, else -1)",
                       "exact on CUDA, proxy on CPU"),
    "alloc_bytes": ("bytes of those requests", "exact on CUDA, proxy on CPU"),
    "segments": ("CUDA: new cudaMalloc segments during the step (segment.all.allocated delta); CPU: -1",
                 "exact on CUDA"),
}
# Random-weight shapes for benchmarks (timings do not depend on weight values).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                         rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                     rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=False,
                 max_position_embeddings=4096),
}


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ModelError("the PyTorch backend needs torch: pip install 'kvlab[build]'") from exc
    return torch


def check_transformers() -> str:
    """The installed transformers version; raises when it is outside the supported range."""
    try:
        import transformers
    except ImportError as exc:
        raise ModelError("the PyTorch backend needs transformers>=5.0,<6: pip install 'kvlab[build]'") from exc
    major = int(transformers.__version__.split(".")[0])
    if not TRANSFORMERS_RANGE[0] <= major < TRANSFORMERS_RANGE[1]:
        raise ModelError(f"transformers {transformers.__version__} is not supported: kvlab's PyTorch backend needs "
                         f">={TRANSFORMERS_RANGE[0]}.0,<{TRANSFORMERS_RANGE[1]} (per-layer StaticCache API)")
    return transformers.__version__


def cache_kwarg(hf_model: Any) -> str:
    """The forward argument that takes the cache: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    params = inspect.signature(hf_model.forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise ModelError(f"{type(hf_model).__name__}.forward takes neither cache= nor past_key_values=; "
                     "not a causal LM with a KV cache")


@dataclass
class TorchModel:
    """A transformers causal LM (eval mode, one device, one dtype) with its tokenizer when it has one."""

    hf: Any  # PreTrainedModel
    name: str
    tokenizer: Any = None  # a transformers tokenizer, or None (token-id prompts only)

    @property
    def device(self) -> "torch.device":
        return next(self.hf.parameters()).device

    @property
    def dtype(self) -> "torch.dtype":
        return next(self.hf.parameters()).dtype

    @property
    def config(self) -> Any:
        return self.hf.config.get_text_config(decoder=True)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
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
        if isinstance(prompt, np.ndarray) or (isinstance(prompt, (list, tuple)) and prompt
                                              and not isinstance(prompt[0], dict)):
            ids = np.asarray(prompt)
            ids = ids.reshape(-1) if ids.ndim == 2 and ids.shape[0] == 1 else ids
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise ConfigError(f"token ids must be a 1-D list of ints (batch size 1), got shape {ids.shape} "
                                  f"dtype {ids.dtype}")
            bad = ids[(ids < 0) | (ids >= self.vocab_size)]
            if bad.size:
                raise ConfigError(f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {self.vocab_size})")
            return ids.astype(np.int64).tolist()
        if self.tokenizer is None:
            raise ConfigError(f"model {self.name!r} has no tokenizer: give the prompt as token ids")
        if isinstance(prompt, str) and not chat:
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            out = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        raise ConfigError(f"prompt must be a text, chat messages or token ids, got {type(prompt).__name__}: "
                          f"{prompt!r:.80}")

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def _dtype(dtype: str | Any) -> "torch.dtype":
    torch = _torch()
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; choose one of {DTYPES}")
    return getattr(torch, dtype)


def _device(device: str | Any) -> "torch.device":
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device; choose 'cpu' or 'cuda[:N]'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: kvlab's PyTorch backend runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device={device!r} asked for, but torch {torch.__version__} sees no CUDA device")
    return dev


def load(source: str | os.PathLike | Any, *, device: str = "cpu", dtype: str = "float32",
         attn_implementation: str = "sdpa", name: str | None = None) -> TorchModel:
    """A transformers causal LM: a kvlab built-in name ("toy", "kv-heavy", "smollm2": the checkpoint the ONNX
    model was built from), a local Hugging Face directory, or an already loaded ``PreTrainedModel``."""
    torch = _torch()
    check_transformers()
    if attn_implementation not in ATTENTION:
        raise ConfigError(f"attn_implementation={attn_implementation!r}; choose one of {ATTENTION}")
    dev, dt = _device(device), _dtype(dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(source, (str, os.PathLike)):
        if not hasattr(source, "config") or not hasattr(source, "forward"):
            raise ConfigError(f"source must be a built-in name, a directory or a transformers model, got {source!r}")
        cache_kwarg(source)
        hf = source.to(device=dev, dtype=dt).eval()
        hf.config._attn_implementation = attn_implementation
        return TorchModel(hf, name or type(source).__name__)
    from . import build

    path = Path(source)
    if str(source) in build.RECIPES:
        path = build.hf_dir(str(source))
        if not (path / "config.json").is_file():
            build.ensure_built(str(source))
        name = name or str(source)
    if not (path / "config.json").is_file():
        raise ModelError(f"{str(source)!r} is neither a built-in model ({', '.join(build.RECIPES)}) nor a Hugging "
                         "Face model directory with a config.json")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation=attn_implementation).to(dev).eval()
    cache_kwarg(hf)
    tok = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
    return TorchModel(hf, name or path.name, tok)


def random_model(shape: str = "smollm2-135m", *, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 std: float = 0.02, attn_implementation: str = "sdpa") -> TorchModel:
    """A random-weight Llama of a named shape (``SHAPES``), built directly on ``device`` (no tokenizer)."""
    torch = _torch()
    check_transformers()
    if shape not in SHAPES:
        raise ConfigError(f"shape={shape!r} is unknown; choose one of {sorted(SHAPES)}")
    if attn_implementation not in ATTENTION:
        raise ConfigError(f"attn_implementation={attn_implementation!r}; choose one of {ATTENTION}")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = attn_implementation
    dev, dt = _device(device), _dtype(dtype)
    torch.manual_seed(seed)
    with dev:
        hf = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    return TorchModel(hf.to(dt).eval(), f"{shape}-random")


# ----------------------------------------------------------------------------------------------------------------
# per-step counters


@dataclass
class TorchStepRecord(StepRecord):
    """A StepRecord plus the allocator's churn of the step (ALLOC_COLUMNS; exact on CUDA)."""

    alloc_requests: int = -1
    alloc_bytes: int = -1
    segments: int = -1


def _record(**values: Any) -> TorchStepRecord:
    """A TorchStepRecord; StepRecord fields this backend does not measure (e.g. a handoff's copy_bytes) are 0."""
    names = [f.name for f in fields(TorchStepRecord)]
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"unknown record fields {sorted(unknown)}")
    return TorchStepRecord(**{n: values.get(n, 0) for n in names})


def frame(records: Iterable[StepRecord]):
    """Records as a DataFrame with kvlab's COLUMNS plus ALLOC_COLUMNS."""
    import pandas as pd

    return pd.DataFrame([asdict(r) for r in records], columns=[*COLUMNS, *ALLOC_COLUMNS])


@dataclass
class TorchGeneration(Generation):
    """A kvlab Generation whose frame() also shows the allocator columns."""

    def frame(self):
        return frame(self.records)


class AllocCounter:
    """Allocator requests/bytes/segments over a region: exact memory_stats deltas on CUDA, an op-output proxy on
    CPU (see the module docstring). ``with counter: ...`` then ``counter.result`` = (requests, bytes, segments)."""

    _KEYS = ("allocation.all.allocated", "allocated_bytes.all.allocated", "segment.all.allocated")

    def __init__(self, device: "torch.device", cpu_proxy: bool = True):
        self.cuda = device.type == "cuda"
        self.device = device
        self.cpu_proxy = cpu_proxy
        self.result = (-1, -1, -1)
        self._mode = None

    def _stats(self) -> tuple[int, int, int]:
        s = _torch().cuda.memory_stats(self.device)
        return tuple(int(s.get(k, 0)) for k in self._KEYS)  # type: ignore[return-value]

    def __enter__(self) -> "AllocCounter":
        if self.cuda:
            self._before = self._stats()
        elif self.cpu_proxy:
            self._mode = _op_output_counter()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            after = self._stats()
            self.result = tuple(a - b for a, b in zip(after, self._before))  # type: ignore[assignment]
        elif self._mode is not None:
            self._mode.__exit__(*exc)
            self.result = (self._mode.count, self._mode.nbytes, -1)
            self._mode = None


def _op_output_counter():
    """A TorchDispatchMode counting fresh (non-view, non-in-place) tensors returned by aten ops."""
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0
            self.nbytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._schema.is_mutable or getattr(func, "is_view", False) or torch.Tag.view_copy in func.tags:
                return out
            inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    self.count += 1
                    self.nbytes += t.untyped_storage().nbytes()
            return out

    return _Counter()


class _KVWatch:
    """Which KV tensors of a transformers cache are new objects after a step (exact, by identity)."""

    def __init__(self) -> None:
        self.prev: list[Any] = []
        self.seen: set[int] = set()

    @staticmethod
    def tensors(cache: Any) -> list[Any]:
        out = []
        for layer in getattr(cache, "layers", []):
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is not None and getattr(t, "numel", lambda: 0)():
                    out.append(t)
        return out

    def diff(self, cache: Any) -> tuple[int, int, int, int]:
        """(tensors created, their bytes, fresh data_ptrs among them, live bytes)."""
        now = self.tensors(cache)
        prev_ids = {id(t) for t in self.prev}
        created = [t for t in now if id(t) not in prev_ids]
        fresh = 0
        for t in created:
            if t.data_ptr() not in self.seen:
                fresh += 1
                self.seen.add(t.data_ptr())
        self.prev = now
        return (len(created), sum(t.nbytes for t in created), fresh, sum(t.nbytes for t in now))


# ----------------------------------------------------------------------------------------------------------------
# eager generation


def make_cache(model: TorchModel, cache: Any, max_cache_len: int) -> Any:
    """A transformers cache from ``"dynamic"``/``"static"``, a kvlab DynamicCache/StaticCache (mapped to the
    transformers one of the same kind and size) or a transformers Cache (used as is)."""
    from transformers import Cache as HFCache
    from transformers import DynamicCache as HFDynamic
    from transformers import StaticCache as HFStatic

    from . import caches as kv

    if isinstance(cache, HFCache):
        if isinstance(cache, HFStatic):
            _check_capacity(cache, max_cache_len)
        with _torch().inference_mode():
            cache.reset()
        return cache
    if isinstance(cache, kv.StaticCache):
        return HFStatic(config=model.hf.config, max_cache_len=_capacity(cache.max_cache_len, max_cache_len))
    if isinstance(cache, kv.DynamicCache) or cache == "dynamic":
        return HFDynamic(config=model.hf.config)
    if cache == "static":
        return HFStatic(config=model.hf.config, max_cache_len=max_cache_len)
    raise ConfigError(f"cache={cache!r}; choose one of {CACHES}, kvlab.DynamicCache(), kvlab.StaticCache(n) or a "
                      "transformers Cache")


def _capacity(max_cache_len: int, needed: int) -> int:
    if needed > max_cache_len:
        raise CapacityError(f"{needed} positions needed (prompt + max_new_tokens - 1) but max_cache_len="
                            f"{max_cache_len}")
    return max_cache_len


def _check_capacity(cache: Any, needed: int) -> None:
    size = cache.get_max_length()
    _capacity(int(size), needed)


def _sync(device: "torch.device") -> None:
    if device.type == "cuda":
        _torch().cuda.synchronize(device)


def _hooks(on_step: StepHook | Iterable[StepHook] | None) -> list[StepHook]:
    return [] if on_step is None else [on_step] if callable(on_step) else list(on_step)


def _check_new_tokens(max_new_tokens: Any) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a positive int")
    return int(max_new_tokens)


def generate(model: TorchModel, prompt: Any, *, cache: Any = "dynamic", max_new_tokens: int = 32,
             max_cache_len: int | None = None, chat: bool = False, sampling: Sampling | None = None,
             stop_on_eos: bool = True, on_step: StepHook | Iterable[StepHook] | None = None,
             count_cpu_allocs: bool = False) -> TorchGeneration:
    """Eager generation with a transformers cache, one forward per step, one record (and hook call) per step.

    ``cache``: "dynamic" | "static" | kvlab.DynamicCache() | kvlab.StaticCache(n) | a transformers Cache.
    A static cache defaults to exactly prompt + max_new_tokens - 1 positions."""
    torch = _torch()
    if not isinstance(model, TorchModel):
        raise ConfigError(f"model must be a kvlab.torch_backend.TorchModel (torch_backend.load(...)), got {model!r}")
    n_new = _check_new_tokens(max_new_tokens)
    ids = model.encode(prompt, chat=chat)
    needed = len(ids) + n_new - 1
    hf_cache = make_cache(model, cache, max_cache_len or needed)
    label = (f"static(max_cache_len={hf_cache.get_max_length()})" if type(hf_cache).__name__ == "StaticCache"
             else "dynamic")
    choose = (sampling or Sampling()).chooser()
    kw, dev, hooks = cache_kwarg(model.hf), model.device, _hooks(on_step)
    watch, records, tokens, stop = _KVWatch(), [], [], "max_new_tokens"
    feed = torch.tensor([ids], dtype=torch.long, device=dev)
    position = 0
    with torch.inference_mode():
        while True:
            start = time.perf_counter()
            n = int(feed.shape[1])
            with AllocCounter(dev, count_cpu_allocs) as counter:
                t0 = time.perf_counter()
                out = model.hf(input_ids=feed, use_cache=True, logits_to_keep=1, **{kw: hf_cache})
                _sync(dev)
                run = time.perf_counter() - t0
                logits = out.logits[0, -1].float().cpu().numpy()
            token = choose(logits)
            created, created_bytes, fresh, live = watch.diff(hf_cache)
            wall = (time.perf_counter() - start) * 1e3
            rec = _record(
                step=len(records), phase="prefill" if position == 0 else "decode", device=dev.type,
                position=position, n_tokens=n, token=token, wall_ms=wall, run_ms=run * 1e3,
                overhead_ms=wall - run * 1e3, cache_tensors_allocated=created, cache_bytes_allocated=created_bytes,
                new_buffers=fresh, live_cache_bytes=live, used_cache_bytes=(position + n) * model.bytes_per_token,
                rss_bytes=rss_bytes(), alloc_requests=counter.result[0], alloc_bytes=counter.result[1],
                segments=counter.result[2])
            records.append(rec)
            for hook in hooks:
                hook(rec)
            position += n
            tokens.append(token)
            if stop_on_eos and token in model.eos_token_ids:
                stop = "eos"
                break
            if len(tokens) == n_new:
                break
            feed = torch.tensor([[token]], dtype=torch.long, device=dev)
    return TorchGeneration(model=model.name, device=str(dev), cache=label, dtype=str(model.dtype).replace("torch.", ""),
                           prompt_ids=ids, token_ids=tokens, text=model.decode(tokens), stop_reason=stop,
                           records=records)


# ----------------------------------------------------------------------------------------------------------------
# fewer, larger kernels for batch-1 decode (optional: GraphRunner(fuse=True))


def fuse_modules(model: TorchModel, packed_gqa: bool = False) -> dict[str, int]:
    """Rewrite a Llama-family model in place for fewer kernels per decode step: q/k/v projections as one GEMM,
    gate/up projections as one GEMM, RMSNorm through ``torch.nn.functional.rms_norm`` (fused on CUDA), and with
    ``packed_gqa=True`` sdpa replaced by ``PACKED_GQA`` attention (decode without copying K/V per query head).
    Same function, same weights; float rounding can differ in the last bit. Idempotent; returns what it replaced.

    Measured on the H200 (data/h200): packed GQA removes 2 copy kernels per layer, but with G query rows cuDNN
    picks a prefill kernel (13.8 us vs 5 us per call at 768 positions) and memory-efficient SDPA is worse still
    (46 us): a loss on SmolLM2-135M, a wash on Llama-1B. Hence off by default."""
    torch = _torch()
    nn = torch.nn
    done = {"qkv": 0, "gate_up": 0, "rms_norm": 0, "packed_gqa_attention": 0}
    if packed_gqa and getattr(model.hf.config, "_attn_implementation", None) == "sdpa":
        register_packed_gqa()
        model.hf.config._attn_implementation = PACKED_GQA
        done["packed_gqa_attention"] = 1
    for name, mod in list(model.hf.named_modules()):
        if all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("q_proj", "k_proj", "v_proj")):
            owner = _FusedLinear([mod.q_proj, mod.k_proj, mod.v_proj])
            mod.q_proj, mod.k_proj, mod.v_proj = owner.head(), owner.part(1), owner.part(2)
            done["qkv"] += 1
        if (all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj"))
                and hasattr(mod, "act_fn") and type(mod).__name__.endswith("MLP")):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, _GatedMLP(mod))
            done["gate_up"] += 1
        if (type(mod).__name__.endswith("RMSNorm") and isinstance(getattr(mod, "weight", None), nn.Parameter)
                and hasattr(mod, "variance_epsilon") and mod.weight.dim() == 1):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, _RMSNorm(mod))
            done["rms_norm"] += 1
    return done


PACKED_GQA = "kvlab_packed_gqa"  # an attention implementation name registered with transformers


def packed_gqa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """sdpa for one decode token with grouped KV heads, without repeating K/V per query head.

    With a mask, transformers' sdpa path copies K and V to every query head (repeat_kv): [B, KVH, L, D] ->
    [B, H, L, D] per layer and step. For a single query token the G = H / KVH query heads of a group are
    instead laid out as G query rows of one KV head: query [B, H, 1, D] -> [B, KVH, G, D], one sdpa call, no
    copy. Everything else (prefill, no mask, no groups) goes to transformers' sdpa unchanged. Off by default: see
    ``fuse_modules`` for what it measured."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    b, h, q, d = query.shape
    if q != 1 or groups == 1 or attention_mask is None or dropout or attention_mask.shape[-2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    packed = query.reshape(b, h // groups, groups, d)  # head kv * G + g -> (kv, g): repeat_kv's head order
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None  # [B, 1, H, D] as transformers returns


def register_packed_gqa() -> None:
    """Register PACKED_GQA with transformers' attention and mask interfaces (masks as for sdpa)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_GQA, packed_gqa_attention)
    AttentionMaskInterface.register(PACKED_GQA, sdpa_mask)


@functools.lru_cache(maxsize=None)
def _fused_classes():
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    class FusedLinear(nn.Module):
        """Several Linears on the same input as one GEMM; the first call computes all, the others read parts."""

        def __init__(self, linears: list[Any]):
            super().__init__()
            self.sizes = [lin.out_features for lin in linears]
            self.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]), requires_grad=False)
            biases = [lin.bias for lin in linears]
            self.bias = (None if all(b is None for b in biases) else nn.Parameter(torch.cat(
                [b.detach() if b is not None else torch.zeros(n, dtype=self.weight.dtype, device=self.weight.device)
                 for b, n in zip(biases, self.sizes)]), requires_grad=False))
            self._input: Any = None
            self._parts: Any = None

        def head(self) -> nn.Module:
            return _Part(self, 0)

        def part(self, i: int) -> nn.Module:
            return _Part(self, i)

        def compute(self, x: Any, i: int) -> Any:
            if i == 0 or self._input is not x:  # the first projection (or an unexpected order): compute all
                self._input = x
                self._parts = F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
            out = self._parts[i]
            if i == len(self.sizes) - 1:
                self._input = self._parts = None  # keep nothing alive between steps
            return out

    class Part(nn.Module):
        def __init__(self, owner: FusedLinear, i: int):
            super().__init__()
            self.i = i
            self.owner = [owner]  # a list: not registered twice as a submodule
            if i == 0:
                self.fused = owner  # registered once, by the first part

        def forward(self, x: Any) -> Any:
            return self.owner[0].compute(x, self.i)

    class GatedMLP(nn.Module):
        def __init__(self, mlp: nn.Module):
            super().__init__()
            self.gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj])
            self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

        def forward(self, x: Any) -> Any:
            gate, up = F.linear(x, self.gate_up.weight, self.gate_up.bias).split(self.gate_up.sizes, dim=-1)
            return self.down_proj(self.act_fn(gate) * up)

    class RMSNorm(nn.Module):
        def __init__(self, norm: nn.Module):
            super().__init__()
            self.weight, self.eps = norm.weight, float(norm.variance_epsilon)

        def forward(self, x: Any) -> Any:  # as transformers: normalize in float32, cast, then scale
            return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    return FusedLinear, Part, GatedMLP, RMSNorm


def _FusedLinear(linears: list[Any]) -> Any:
    return _fused_classes()[0](linears)


def _Part(owner: Any, i: int) -> Any:
    return _fused_classes()[1](owner, i)


def _GatedMLP(mlp: Any) -> Any:
    return _fused_classes()[2](mlp)


def _RMSNorm(norm: Any) -> Any:
    return _fused_classes()[3](norm)


# ----------------------------------------------------------------------------------------------------------------
# the CUDA-graph decode runner


MODES = ("eager", "capture", "compile")


class GraphRunner:
    """Decode over one transformers StaticCache with a captured CUDA graph per step.

    - The cache's own device counter (layer 0's ``cumulative_length``) is the position: positions, the 4-D
      attention mask (``arange(max_cache_len) <= position``) and the write index are computed on the device
      inside the step, so one captured graph serves every position.
    - Valid-window writes: every step writes exactly the tokens it is fed at [position, position + n); prefill
      runs uncaptured at its exact length, so no padding ever enters the cache; the mask hides stale slots.
    - The step's argmax runs inside the graph and writes the next token into the input buffer (and into a token
      history at position + 1): ``decode_greedy`` replays N times with no host sync in between.
    - ``reset()`` zeroes the counters (and KV) in place: no reallocation, the graph stays valid across generations.

    mode: "capture" (capture the eager step), "compile" (torch.compile the step, fullgraph, then capture it;
    on CPU the compiled step runs without a graph), "eager" (no graph: the same device-side step, run eagerly).
    fuse: ``fuse_modules`` first (q/k/v and gate/up as single GEMMs, fused RMSNorm): fewer kernels per step. keep_logits=False: the step keeps only its argmax (greedy only; a little faster).
    """

    def __init__(self, model: TorchModel, max_cache_len: int, *, mode: str = "capture", fuse: bool = False,
                 compile_mode: str = "default", compile_backend: str = "inductor", keep_logits: bool = True,
                 warmup: int = 3):
        torch = _torch()
        if not isinstance(model, TorchModel):
            raise ConfigError(f"model must be a TorchModel (torch_backend.load(...)), got {model!r}")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}; choose one of {MODES}")
        attn = getattr(model.hf.config, "_attn_implementation", "sdpa")
        if attn not in (*ATTENTION, PACKED_GQA):
            raise ConfigError(f"the model's attention implementation is {attn!r}; GraphRunner drives {ATTENTION} "
                              "with a 4-D mask (load(..., attn_implementation='sdpa'))")
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 2:
            raise ConfigError(f"max_cache_len={max_cache_len!r} must be an int >= 2")
        ctx = getattr(model.config, "max_position_embeddings", None)
        if ctx and max_cache_len > ctx:
            raise ConfigError(f"max_cache_len={max_cache_len} exceeds the model's max_position_embeddings={ctx}")
        if mode == "capture" and model.device.type != "cuda":
            raise DeviceError(f"mode={mode!r} captures a CUDA graph but the model is on {model.device}; move it to "
                              "'cuda' or use mode='eager'")
        from transformers import StaticCache

        self.fused = fuse_modules(model) if fuse else {}
        self.model, self.mode, self.max_cache_len = model, mode, max_cache_len
        self.attn = "eager" if model.hf.config._attn_implementation == "eager" else "sdpa"  # the mask's format
        self.keep_logits = keep_logits
        self._cols = argmax_cols(model.vocab_size)
        self.kw = cache_kwarg(model.hf)
        dev = model.device
        self.cache = StaticCache(config=model.hf.config, max_cache_len=max_cache_len)
        self.tok = torch.zeros((1, 1), dtype=torch.long, device=dev)  # the decode input, written by the step
        self.history = torch.zeros(max_cache_len + 1, dtype=torch.long, device=dev)  # token at each position
        self.logits = torch.zeros(model.vocab_size, dtype=torch.float32, device=dev)  # last step's logits
        self.slots = torch.arange(max_cache_len, device=dev)  # [L]
        self.graph = None
        self.setup_s = {"compile_warmup_s": 0.0, "capture_s": 0.0}
        self._step = self._decode_step
        with torch.inference_mode():
            self._forward(torch.zeros((1, 1), dtype=torch.long, device=dev))  # allocates the cache (lazy init)
        self._pos = self.cache.layers[0].cumulative_length  # 0-d device tensor: the position counter
        self.kv_ptrs = [t.data_ptr() for t in _KVWatch.tensors(self.cache)]
        if mode == "compile":
            options = {"mode": compile_mode} if compile_backend == "inductor" else {}
            self._step = torch.compile(self._decode_step, backend=compile_backend, fullgraph=True, dynamic=False,
                                       **options)
        if mode != "eager" and model.device.type == "cuda":
            self._capture(warmup)
        elif mode == "compile":  # CPU: the compiled step runs without a graph (tests check tracing this way)
            with torch.inference_mode():
                self._step()
        self.reset()

    # -- the step ------------------------------------------------------------------------------------------------
    def _mask(self, n: int) -> "torch.Tensor":
        """[1, 1, n, L] attention mask for n tokens fed at the current position (bool for sdpa, additive else)."""
        torch = _torch()
        rows = self._pos + torch.arange(n, device=self.slots.device)  # [n] absolute positions
        allowed = (self.slots[None, :] <= rows[:, None])[None, None]  # [1, 1, n, L]
        if self.attn == "sdpa":
            return allowed
        dt = self.model.dtype
        return torch.zeros((), dtype=dt, device=rows.device).masked_fill(~allowed, torch.finfo(dt).min)

    def _forward(self, ids: "torch.Tensor") -> "torch.Tensor":
        """Feed ids [1, n] at the current position; returns the last logits [V] (float32)."""
        torch = _torch()
        n = ids.shape[1]
        pos = self.cache.layers[0].cumulative_length if self.cache.layers[0].is_initialized else None
        if pos is None:  # the very first call allocates the cache at position 0
            position_ids = torch.arange(n, device=ids.device)[None]
            self._pos = torch.zeros((), dtype=torch.long, device=ids.device)
        else:
            self._pos = pos
            position_ids = (pos + torch.arange(n, device=ids.device))[None]  # [1, n]
        out = self.model.hf(input_ids=ids, attention_mask=self._mask(n), position_ids=position_ids,
                            use_cache=True, logits_to_keep=1, **{self.kw: self.cache})
        return out.logits[0, -1].float()

    def _decode_step(self) -> None:
        """One decode token: feeds self.tok at the position, writes logits, argmax into tok and history."""
        pos = self._pos.clone()
        logits = self._forward(self.tok)  # [V]
        nxt = _argmax(logits, self._cols)
        if self.keep_logits:
            self.logits.copy_(logits)
        self.tok.copy_(nxt.view(1, 1))
        self.history.index_copy_(0, (pos + 1).view(1), nxt.view(1))

    def _capture(self, warmup: int) -> None:
        torch = _torch()
        dev = self.model.device
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(max(1, warmup)):  # warm-up (and compile) off the capture
                self._step()
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        self.reset()
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize(dev)
        self.setup_s = {"compile_warmup_s": t1 - t0, "capture_s": time.perf_counter() - t1}

    def reset(self) -> None:
        """Empty the cache in place (addresses unchanged: the captured graph stays valid)."""
        with _torch().inference_mode():
            self.cache.reset()
            self.history.zero_()
        now = [t.data_ptr() for t in _KVWatch.tensors(self.cache)]
        if now != self.kv_ptrs:
            raise RuntimeError("the static cache was reallocated: the captured graph would read stale addresses")

    def _replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with _torch().inference_mode():
                self._step()

    @property
    def position(self) -> int:
        return int(self._pos.item())

    # -- generation ----------------------------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int]) -> "torch.Tensor":
        """reset(), then feed the prompt uncaptured; returns its last logits [V] (float32, on device)."""
        torch = _torch()
        n = len(ids)
        if n < 1:
            raise ConfigError("the prompt is empty: give at least one token")
        if n > self.max_cache_len:
            raise CapacityError(f"a prompt of {n} tokens does not fit max_cache_len={self.max_cache_len}")
        self.reset()
        with torch.inference_mode():
            logits = self._forward(torch.tensor([list(ids)], dtype=torch.long, device=self.model.device))
        return logits

    def decode_greedy(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The lean loop: prefill, then replay max_new_tokens - 1 steps with no host sync in between."""
        torch = _torch()
        n_new = _check_new_tokens(max_new_tokens)
        _capacity(self.max_cache_len, len(ids) + n_new - 1)
        logits = self.prefill(ids)
        first = logits.argmax()
        self.tok.copy_(first.view(1, 1))
        self.history[len(ids)] = first
        for _ in range(n_new - 1):
            self._replay()
        out = self.history[len(ids): len(ids) + n_new].tolist()  # one sync
        _sync(self.model.device)
        return [int(t) for t in out]

    def generate(self, prompt: Any, *, max_new_tokens: int = 32, chat: bool = False,
                 sampling: Sampling | None = None, stop_on_eos: bool = True,
                 on_step: StepHook | Iterable[StepHook] | None = None) -> TorchGeneration:
        """kvlab's contract (records, hooks, sampling) over the graph: one replay and one host sync per token."""
        torch = _torch()
        model, dev = self.model, self.model.device
        n_new = _check_new_tokens(max_new_tokens)
        ids = model.encode(prompt, chat=chat)
        _capacity(self.max_cache_len, len(ids) + n_new - 1)
        sampling = sampling or Sampling()
        if sampling.do_sample and not self.keep_logits:
            raise ConfigError("sampling needs the step's logits: build the GraphRunner with keep_logits=True")
        choose = sampling.chooser()
        hooks, records, tokens, stop = _hooks(on_step), [], [], "max_new_tokens"
        host_tok = torch.zeros((1, 1), dtype=torch.long, pin_memory=dev.type == "cuda")
        live = sum(t.nbytes for t in _KVWatch.tensors(self.cache))
        position = 0
        while True:
            start = time.perf_counter()
            n = len(ids) if position == 0 else 1
            with AllocCounter(dev, cpu_proxy=False) as counter:
                t0 = time.perf_counter()
                if position == 0:
                    logits = self.prefill(ids)
                    self.logits.copy_(logits)
                else:
                    self._replay()
                _sync(dev)
                run = time.perf_counter() - t0
                if sampling.do_sample:
                    token = choose(self.logits.cpu().numpy())
                elif position == 0:
                    token = int(self.logits.argmax().item())
                else:
                    token = int(self.tok.item())  # the graph's own argmax
                if position == 0 or sampling.do_sample:  # greedy decode: the graph already fed its argmax
                    host_tok[0, 0] = token
                    self.tok.copy_(host_tok, non_blocking=True)
            wall = (time.perf_counter() - start) * 1e3
            rec = _record(
                step=len(records), phase="prefill" if position == 0 else "decode", device=dev.type,
                position=position, n_tokens=n, token=token, wall_ms=wall, run_ms=run * 1e3,
                overhead_ms=wall - run * 1e3, cache_tensors_allocated=0, cache_bytes_allocated=0, new_buffers=0,
                live_cache_bytes=live, used_cache_bytes=(position + n) * model.bytes_per_token,
                rss_bytes=rss_bytes(), alloc_requests=counter.result[0], alloc_bytes=counter.result[1],
                segments=counter.result[2])
            records.append(rec)
            for hook in hooks:
                hook(rec)
            position += n
            tokens.append(token)
            if stop_on_eos and token in model.eos_token_ids:
                stop = "eos"
                break
            if len(tokens) == n_new:
                break
        _sync(dev)
        return TorchGeneration(model=model.name, device=str(dev), cache=f"graph-{self.mode}(max_cache_len="
                               f"{self.max_cache_len})", dtype=str(model.dtype).replace("torch.", ""),
                               prompt_ids=list(ids), token_ids=tokens, text=model.decode(tokens), stop_reason=stop,
                               records=records)


def argmax_cols(n: int) -> int:
    """Row length for the two-stage argmax of n values: the largest divisor of n in [64, 1024], else 0."""
    return max([c for c in range(64, min(n, 1024) + 1) if n % c == 0] or [0])


def _argmax(x: "torch.Tensor", cols: int) -> "torch.Tensor":
    """argmax of a 1-D tensor in two stages (rows of ``cols``, then the rows' maxima): a parallel reduction where a
    single-block one takes ~30 us on a 128k vocabulary. Ties resolve to the first index, as argmax does."""
    n = x.shape[0]
    if not cols or n % cols or n // cols < 2:
        return x.argmax()
    vals, idx = x.view(n // cols, cols).max(dim=1)  # [R], [R]
    row = vals.argmax()
    return row * cols + idx.gather(0, row.view(1)).squeeze(0)  # gather: no host sync (capturable)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or of the shorter end), None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


assert [f.name for f in fields(TorchStepRecord)] == [*COLUMNS, *ALLOC_COLUMNS]
