"""kvlab's CUDA-graph decode runner over one transformers StaticCache: the prompt is prefilled uncaptured, then one
decode step is captured as a CUDA graph and replayed per token (``mode="capture"``), ``torch.compile``d first
(``"compile"``; on CPU compiled but uncaptured), or run eagerly (``"eager"``).

One graph serves every position: the step computes its position ids, mask and write index from the cache's own
device-side counter, and its argmax writes the next token into the step's input (``tok``) and ``history``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..core.errors import CapacityError, ConfigError, DeviceError, check_choice, check_int
from ..core.generation import Generation, Sampling, check_new_tokens, positions_needed
from ..core.labels import CacheSpec
from ..core.records import CacheStep, StepHook, hook_list
from .counters import counting_allocs, kv_tensors
from .fuse import fuse_modules
from .generate import StepLog, check_capacity, sync
from .models import TorchModel, cache_kwarg

MODES = ("eager", "capture", "compile")


class GraphRunner:
    """Decode over one transformers StaticCache of ``max_cache_len`` positions with one captured step. Every step
    writes exactly the tokens it is fed at [position, position + n) (the prefill runs uncaptured at its exact
    length); ``decode_greedy`` replays with no host sync in between, ``generate`` keeps kvlab's contract (records,
    hooks, sampling) with one sync per token; ``reset()`` empties the cache in place, so the graph stays valid.

    ``mode``: see the module docstring. ``fuse``: ``fuse_modules`` first. The model's attention is "eager" or one that
    takes sdpa's bool mask. ``compile_mode``, ``compile_backend``: ``torch.compile``'s. ``keep_logits=False``: the
    step keeps only its argmax (greedy only). ``warmup``: steps run before the capture. Raises ConfigError for a bad
    argument or a model it cannot drive, DeviceError for ``mode="capture"`` off CUDA."""

    def __init__(
        self,
        model: TorchModel,
        max_cache_len: int,
        *,
        mode: str = "capture",
        fuse: bool = False,
        compile_mode: str = "default",
        compile_backend: str = "inductor",
        keep_logits: bool = True,
        warmup: int = 3,
    ):
        from transformers import StaticCache

        check_runner(model, max_cache_len, mode)
        self.fused = fuse_modules(model) if fuse else {}
        self.model, self.mode, self.max_cache_len, self.keep_logits = model, mode, max_cache_len, keep_logits
        self.attn = "eager" if model.hf.config._attn_implementation == "eager" else "sdpa"  # the mask's format
        self.kw = cache_kwarg(model.hf)
        self._cols = argmax_cols(model.vocab_size)
        dev = model.device
        self.cache = StaticCache(config=model.hf.config, max_cache_len=max_cache_len)
        self.tok = torch.zeros((1, 1), dtype=torch.long, device=dev)  # the decode input, written by the step
        self.history = torch.zeros(max_cache_len + 1, dtype=torch.long, device=dev)  # token at each position
        self.logits = torch.zeros(model.vocab_size, dtype=torch.float32, device=dev)  # last step's logits
        self.slots = torch.arange(max_cache_len, device=dev)  # [L]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.setup_s = {"compile_warmup_s": 0.0, "capture_s": 0.0}
        with torch.inference_mode():
            self._forward(torch.zeros((1, 1), dtype=torch.long, device=dev))  # allocates the cache (lazy init)
        self._pos = self.cache.layers[0].cumulative_length  # 0-d device tensor: the position counter
        self.kv_ptrs = [t.data_ptr() for t in self.kv_tensors()]
        self._step = self._decode_step
        if mode == "compile":
            options = {"mode": compile_mode} if compile_backend == "inductor" else {}
            self._step = torch.compile(
                self._decode_step, backend=compile_backend, fullgraph=True, dynamic=False, **options
            )
        if mode != "eager" and dev.type == "cuda":
            self._capture(warmup)
        elif mode == "compile":  # CPU: the compiled step runs without a graph (tests check tracing this way)
            with torch.inference_mode():
                self._step()
        self.reset()

    def kv_tensors(self) -> list[torch.Tensor]:
        """The static cache's key and value tensors (their addresses never change: the graph reads them)."""
        return kv_tensors(self.cache)

    def reset(self) -> None:
        """The cache emptied in place; RuntimeError if it was reallocated (the graph would read stale addresses)."""
        with torch.inference_mode():
            self.cache.reset()
            self.history.zero_()
        if [t.data_ptr() for t in self.kv_tensors()] != self.kv_ptrs:
            raise RuntimeError("the static cache was reallocated: the captured graph would read stale addresses")

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """``reset()``, then the prompt fed uncaptured; returns its last logits [V] (float32, on the device).
        ConfigError for an empty prompt, CapacityError for one longer than ``max_cache_len``."""
        n = len(ids)
        if n < 1:
            raise ConfigError("the prompt is empty: give at least one token")
        if n > self.max_cache_len:
            raise CapacityError(f"a prompt of {n} tokens does not fit max_cache_len={self.max_cache_len}")
        self.reset()
        with torch.inference_mode():
            return self._forward(torch.tensor([list(ids)], dtype=torch.long, device=self.model.device))

    def start(self, ids: Sequence[int]) -> None:
        """``prefill(ids)``, then its greedy token fed to the step: each replay from here decodes one more token."""
        first = self.prefill(ids).argmax()
        self.tok.copy_(first.view(1, 1))
        self.history[len(ids)] = first

    def replay(self) -> None:
        """One decode step: the captured graph (or the step itself), feeding the token the last step chose."""
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.inference_mode():
                self._step()

    def decode_greedy(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The lean loop: ``start``, then ``max_new_tokens - 1`` replays with no host sync in between; returns the
        new tokens. CapacityError when they do not fit the cache."""
        n_new = check_new_tokens(max_new_tokens)
        check_capacity(self.max_cache_len, positions_needed(len(ids), n_new))
        self.start(ids)
        for _ in range(n_new - 1):
            self.replay()
        out = self.history[len(ids) : len(ids) + n_new].tolist()  # one sync
        sync(self.model.device)
        return [int(t) for t in out]

    def generate(
        self,
        prompt: Any,
        *,
        max_new_tokens: int = 32,
        chat: bool = False,
        sampling: Sampling | None = None,
        stop_on_eos: bool = True,
        on_step: StepHook | Iterable[StepHook] | None = None,
    ) -> Generation:
        """``kvlab.pytorch.generate``'s contract (records, hooks, sampling) over the graph: one replay and one host
        sync per token. ConfigError for sampling without ``keep_logits``, CapacityError when the tokens do not fit."""
        model, dev = self.model, self.model.device
        n_new = check_new_tokens(max_new_tokens)
        ids = model.encode(prompt, chat=chat)
        check_capacity(self.max_cache_len, positions_needed(len(ids), n_new))
        sampling = sampling or Sampling()
        if sampling.do_sample and not self.keep_logits:
            raise ConfigError("sampling needs the step's logits: build the GraphRunner with keep_logits=True")
        choose = sampling.chooser() if sampling.do_sample else None
        log = StepLog(model, hook_list(on_step), n_new, stop_on_eos)
        host_tok = torch.zeros((1, 1), dtype=torch.long, pin_memory=dev.type == "cuda")
        memory = CacheStep(live_bytes=sum(t.nbytes for t in self.kv_tensors()))
        stop = None
        while stop is None:
            start, prefill = time.perf_counter(), ids if not log.records else None
            with counting_allocs(dev, cpu_proxy=False) as allocs:
                token, run = self._token_step(prefill, choose, host_tok)
            stop = log.add(len(ids) if prefill else 1, token, time.perf_counter() - start, run, memory, allocs)
        sync(dev)
        return log.generation(CacheSpec("static", self.max_cache_len, f"graph-{self.mode}"), ids, stop)

    def _token_step(
        self, prompt: Sequence[int] | None, choose: Callable[[Any], int] | None, host_tok: torch.Tensor
    ) -> tuple[int, float]:
        """One position of ``generate``: the prefill of ``prompt`` or (None) one replay; then the token (``choose``'s,
        else the graph's own argmax) and the seconds to its sync. A host token is copied into the step's input."""
        t0 = time.perf_counter()
        if prompt is not None:
            self.logits.copy_(self.prefill(prompt))
        else:
            self.replay()
        sync(self.model.device)
        run = time.perf_counter() - t0
        if choose is not None:
            token = choose(self.logits.cpu().numpy())
        elif prompt is not None:
            token = int(self.logits.argmax().item())
        else:
            token = int(self.tok.item())  # the graph's own argmax
        if prompt is not None or choose is not None:  # greedy decode: the graph already fed its argmax
            host_tok[0, 0] = token
            self.tok.copy_(host_tok, non_blocking=True)
        return token, run

    def _mask(self, n: int) -> torch.Tensor:
        """[1, 1, n, L] attention mask for n tokens fed at the current position (bool for sdpa, additive else)."""
        rows = self._pos + torch.arange(n, device=self.slots.device)  # [n] absolute positions
        allowed = (self.slots[None, :] <= rows[:, None])[None, None]  # [1, 1, n, L]
        if self.attn == "sdpa":
            return allowed
        dt = self.model.dtype
        return torch.zeros((), dtype=dt, device=rows.device).masked_fill(~allowed, torch.finfo(dt).min)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ids [1, n] at the current position; returns the last logits [V] (float32)."""
        n = ids.shape[1]
        layer = self.cache.layers[0]
        if layer.is_initialized:
            self._pos = layer.cumulative_length
        else:  # the very first call allocates the cache at position 0
            self._pos = torch.zeros((), dtype=torch.long, device=ids.device)
        position_ids = (self._pos + torch.arange(n, device=ids.device))[None]  # [1, n]
        out = self.model.hf(
            input_ids=ids,
            attention_mask=self._mask(n),
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self.kw: self.cache},
        )
        return out.logits[0, -1].float()

    def _decode_step(self) -> None:
        """One decode token: feeds ``tok`` at the position, writes logits, argmax into ``tok`` and ``history``."""
        pos = self._pos.clone()
        logits = self._forward(self.tok)  # [V]
        nxt = two_stage_argmax(logits, self._cols)
        if self.keep_logits:
            self.logits.copy_(logits)
        self.tok.copy_(nxt.view(1, 1))
        self.history.index_copy_(0, (pos + 1).view(1), nxt.view(1))

    def _capture(self, warmup: int) -> None:
        """``warmup`` steps (and the compile) on a side stream, then the capture; ``setup_s`` times each."""
        dev = self.model.device
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(max(1, warmup)):
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


def check_runner(model: Any, max_cache_len: Any, mode: str) -> None:
    """ConfigError for a bad argument or a model GraphRunner cannot drive; DeviceError: capture off CUDA."""
    if not isinstance(model, TorchModel):
        raise ConfigError(f"model must be a TorchModel (kvlab.pytorch.load(...)), got {model!r}")
    check_choice(mode, MODES, "mode=")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    attn = getattr(model.hf.config, "_attn_implementation", "sdpa")
    if attn != "eager" and ALL_MASK_ATTENTION_FUNCTIONS.get(attn) is not sdpa_mask:
        raise ConfigError(
            f"the model's attention implementation is {attn!r}; GraphRunner drives 'eager' or one that takes "
            "sdpa's 4-D mask (load(..., attn_implementation='sdpa'))"
        )
    max_cache_len = check_int(max_cache_len, "max_cache_len", 2)
    ctx = getattr(model.config, "max_position_embeddings", None)
    if ctx and max_cache_len > ctx:
        raise ConfigError(f"max_cache_len={max_cache_len} exceeds the model's max_position_embeddings={ctx}")
    if mode == "capture" and model.device.type != "cuda":
        raise DeviceError(
            f"mode={mode!r} captures a CUDA graph but the model is on {model.device}; move it to "
            "'cuda' or use mode='eager'"
        )


def argmax_cols(n: int) -> int:
    """Row length for the two-stage argmax of n values: the largest divisor of n in [64, 1024], else 0."""
    return max([c for c in range(64, min(n, 1024) + 1) if n % c == 0] or [0])


def two_stage_argmax(x: torch.Tensor, cols: int) -> torch.Tensor:
    """argmax of a 1-D tensor in two stages (rows of ``cols``, then the rows' maxima): a parallel reduction where
    torch's argmax reduces a large vocabulary in a single block. Ties resolve to the first index, as argmax does."""
    n = x.shape[0]
    if not cols or n % cols or n // cols < 2:
        return x.argmax()
    vals, idx = x.view(n // cols, cols).max(dim=1)  # [R], [R]
    row = vals.argmax()
    return row * cols + idx.gather(0, row.view(1)).squeeze(0)  # gather: no host sync (capturable)
