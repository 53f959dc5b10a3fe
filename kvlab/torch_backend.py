"""Hugging Face transformers causal LMs on PyTorch through kvlab's contract: the same generation loop, hooks,
per-step ``StepRecord`` rows and ``Generation`` results as the ONNX Runtime path, with transformers'
``DynamicCache`` and ``StaticCache``. The CUDA-graph decode runner over a StaticCache is ``kvlab.torch_graphs``
(``GraphRunner`` and ``fuse_modules`` are reachable from here too). Importing this module imports neither torch
nor onnxruntime; torch and transformers load on first use.

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

import inspect
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

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


def _emit_step(records: list, hooks: Sequence[StepHook], model: "TorchModel", dev: Any, counter: "AllocCounter", *,
               position: int, n: int, token: int, wall: float, run: float, live: int, created: int = 0,
               created_bytes: int = 0, fresh: int = 0) -> TorchStepRecord:
    """Record one step (wall and run in ms and s), append it and call every hook: shared by both loops."""
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
    return rec


def _stop_reason(model: "TorchModel", tokens: Sequence[int], n_new: int, stop_on_eos: bool) -> str | None:
    """Why generation stops after ``tokens`` ("eos", "max_new_tokens"), or None to go on: shared by both loops."""
    if stop_on_eos and tokens[-1] in model.eos_token_ids:
        return "eos"
    return "max_new_tokens" if len(tokens) == n_new else None


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
    watch, records, tokens = _KVWatch(), [], []
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
            _emit_step(records, hooks, model, dev, counter, position=position, n=n, token=token, wall=wall,
                       run=run, live=live, created=created, created_bytes=created_bytes, fresh=fresh)
            position += n
            tokens.append(token)
            stop = _stop_reason(model, tokens, n_new, stop_on_eos)
            if stop:
                break
            feed = torch.tensor([[token]], dtype=torch.long, device=dev)
    return TorchGeneration(model=model.name, device=str(dev), cache=label, dtype=str(model.dtype).replace("torch.", ""),
                           prompt_ids=ids, token_ids=tokens, text=model.decode(tokens), stop_reason=stop,
                           records=records)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or of the shorter end), None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


assert [f.name for f in fields(TorchStepRecord)] == [*COLUMNS, *ALLOC_COLUMNS]


def __getattr__(name: str) -> Any:
    """``torch_backend.GraphRunner`` / ``fuse_modules``: from kvlab.torch_graphs (which imports torch)."""
    if name in ("GraphRunner", "fuse_modules"):
        from . import torch_graphs

        return getattr(torch_graphs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
