"""The decode step of ``kvlab.pytorch.GraphRunner`` over one transformers StaticCache, and its CUDA graph: the step
feeds one token at the cache's own device-side position and writes its argmax back as the next input, so one
captured graph serves every position. ``CapturedStep`` owns the cache, the step's buffers and the graph; the
runner adds the loops (prefill, the lean greedy loop, kvlab's generate contract)."""

from __future__ import annotations

import time

import torch

from .counters import KVWatch
from .models import TorchModel, cache_kwarg


class CapturedStep:
    """One transformers StaticCache of ``max_cache_len`` positions and the decode step over it, captured as a CUDA
    graph (``mode="capture"``), ``torch.compile``d and captured (``"compile"``; on CPU compiled, uncaptured) or
    run eagerly (``"eager"``).

    - The cache's own device counter (layer 0's ``cumulative_length``) is the position: positions, the 4-D
      attention mask (``arange(max_cache_len) <= position``) and the write index are computed on the device
      inside the step.
    - The step's argmax runs inside it and writes the next token into ``tok`` (its input) and into ``history`` at
      position + 1; with ``keep_logits`` its logits into ``logits`` too.
    - ``reset()`` zeroes the counters (and KV) in place: the cache's addresses never change, so the graph stays
      valid across generations (``kv_ptrs``; a reallocation is a RuntimeError).

    The arguments are checked by the runner; this class assumes them valid."""

    def __init__(
        self,
        model: TorchModel,
        max_cache_len: int,
        mode: str,
        compile_mode: str,
        compile_backend: str,
        keep_logits: bool,
        warmup: int,
    ):
        from transformers import StaticCache

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
        self.kv_ptrs = [t.data_ptr() for t in KVWatch.tensors(self.cache)]
        if mode == "compile":
            options = {"mode": compile_mode} if compile_backend == "inductor" else {}
            self._step = torch.compile(
                self._decode_step, backend=compile_backend, fullgraph=True, dynamic=False, **options
            )
        if mode != "eager" and model.device.type == "cuda":
            self._capture(warmup)
        elif mode == "compile":  # CPU: the compiled step runs without a graph (tests check tracing this way)
            with torch.inference_mode():
                self._step()
        self.reset()

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
        pos = self.cache.layers[0].cumulative_length if self.cache.layers[0].is_initialized else None
        if pos is None:  # the very first call allocates the cache at position 0
            position_ids = torch.arange(n, device=ids.device)[None]
            self._pos = torch.zeros((), dtype=torch.long, device=ids.device)
        else:
            self._pos = pos
            position_ids = (pos + torch.arange(n, device=ids.device))[None]  # [1, n]
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
        """One decode token: feeds self.tok at the position, writes logits, argmax into tok and history."""
        pos = self._pos.clone()
        logits = self._forward(self.tok)  # [V]
        nxt = two_stage_argmax(logits, self._cols)
        if self.keep_logits:
            self.logits.copy_(logits)
        self.tok.copy_(nxt.view(1, 1))
        self.history.index_copy_(0, (pos + 1).view(1), nxt.view(1))

    def _capture(self, warmup: int) -> None:
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
        with torch.inference_mode():
            self.cache.reset()
            self.history.zero_()
        now = [t.data_ptr() for t in KVWatch.tensors(self.cache)]
        if now != self.kv_ptrs:
            raise RuntimeError("the static cache was reallocated: the captured graph would read stale addresses")

    def kv_tensors(self) -> list[torch.Tensor]:
        """The static cache's key and value tensors (their addresses never change: the graph reads them)."""
        return KVWatch.tensors(self.cache)

    def replay(self) -> None:
        """One decode step: the captured graph (or the eager step), feeding the token the last step chose."""
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.inference_mode():
                self._step()

    @property
    def position(self) -> int:
        return int(self._pos.item())


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
