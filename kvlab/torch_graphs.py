"""kvlab's CUDA-graph decode runner over a transformers StaticCache, and the rewrites that cut kernels per step.

- ``GraphRunner``: prefill uncaptured, then one captured decode step replayed per token (``mode="capture"``),
  optionally ``torch.compile``d first (``mode="compile"``); ``mode="eager"`` runs the same device-side step
  without a graph (CPU, tests). Records, hooks and sampling follow ``kvlab.torch_backend``'s contract.
- ``fuse_modules``: q/k/v and gate/up as single GEMMs, RMSNorm as ``F.rms_norm``, a choice of decode attention.
- A two-stage argmax that stays on the device (captured with the step).

Measured on an NVIDIA H200: ``data/h200/README.md``; the lesson: ``notebooks/05_pytorch_cuda_graphs.ipynb``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .errors import CapacityError, ConfigError, DeviceError
from .generate import Sampling
from .instrument import StepHook
from .torch_backend import (ATTENTION, AllocCounter, TorchGeneration, TorchModel, _capacity, _check_new_tokens,
                            _emit_step, _hooks, _KVWatch, _stop_reason, _sync, cache_kwarg)

MODES = ("eager", "capture", "compile")


# ----------------------------------------------------------------------------------------------------------------
# fewer, larger kernels for batch-1 decode (GraphRunner(fuse=True))


ATTENTIONS = ("sdpa", "packed-gqa", "reduce")  # fuse_modules(attention=...): how a decode step attends


def fuse_modules(model: TorchModel, attention: str = "sdpa") -> dict[str, int]:
    """Rewrite a Llama-family model in place for fewer kernels per decode step: q/k/v projections as one GEMM,
    gate/up projections as one GEMM, RMSNorm through ``torch.nn.functional.rms_norm`` (fused on CUDA), and the
    attention of one decode token (``attention``, one of ``ATTENTIONS``):

    - "sdpa": transformers' sdpa, unchanged (K/V copied to every query head, then one sdpa call).
    - "packed-gqa": ``packed_gqa_attention``: sdpa with the query heads of a group as rows (no K/V copies).
    - "reduce": ``reduce_attention``: plain float32 arithmetic that ``torch.compile`` fuses into a few
      reduction kernels reading the cache in place (no K/V copies, no library attention call).

    Same function, same weights; float rounding can differ in the last bits. Idempotent; returns what it replaced.
    Measured on the H200 (data/h200/README.md): "packed-gqa" lost on SmolLM2-135M (cuDNN picks a prefill kernel
    for G query rows) and was a wash on Llama-1B; "reduce", compiled, is the fastest (Llama-1B bf16: 1.30 ->
    1.25 ms per token, 1.12-1.20 with ``compile_mode="max-autotune-no-cudagraphs"``)."""
    if attention not in ATTENTIONS:
        raise ConfigError(f"attention={attention!r}; choose one of {ATTENTIONS}")
    done = {"qkv": 0, "gate_up": 0, "rms_norm": 0, "attention": 0}
    if attention != "sdpa" and getattr(model.hf.config, "_attn_implementation", None) == "sdpa":
        name, fn = DECODE_ATTENTION[attention]
        register_attention(name, fn)
        model.hf.config._attn_implementation = name
        done["attention"] = 1
    for name, mod in list(model.hf.named_modules()):
        if all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("q_proj", "k_proj", "v_proj")):
            owner = FusedLinear([mod.q_proj, mod.k_proj, mod.v_proj])
            mod.q_proj, mod.k_proj, mod.v_proj = owner.head(), owner.part(1), owner.part(2)
            done["qkv"] += 1
        if (all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj"))
                and hasattr(mod, "act_fn") and type(mod).__name__.endswith("MLP")):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, GatedMLP(mod))
            done["gate_up"] += 1
        if (type(mod).__name__.endswith("RMSNorm") and isinstance(getattr(mod, "weight", None), nn.Parameter)
                and hasattr(mod, "variance_epsilon") and mod.weight.dim() == 1):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, RMSNorm(mod))
            done["rms_norm"] += 1
    return done


def _one_decode_token(query: Any, attention_mask: Any, dropout: float) -> bool:
    """True for the case the decode attentions handle: batch 1, one query token, a [1, 1, 1, L] bool mask."""
    return (query.shape[0] == 1 and query.shape[2] == 1 and not dropout and attention_mask is not None
            and attention_mask.dtype == torch.bool and attention_mask.shape[-2] == 1)


def packed_gqa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """sdpa for one decode token with grouped KV heads, without repeating K/V per query head.

    With a mask, transformers' sdpa path copies K and V to every query head (repeat_kv): [B, KVH, L, D] ->
    [B, H, L, D] per layer and step. For a single query token the G = H / KVH query heads of a group are
    instead laid out as G query rows of one KV head: query [B, H, 1, D] -> [B, KVH, G, D], one sdpa call, no
    copy. Everything else (prefill, no mask) goes to transformers' sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, _, d = query.shape
    kvh = key.shape[1]
    if not _one_decode_token(query, attention_mask, dropout) or kvh == h:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    packed = query.reshape(b, kvh, h // kvh, d)  # head kv * G + g -> (kv, g): repeat_kv's head order
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None  # [B, 1, H, D] as transformers returns


def reduce_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """Attention of one decode token written as broadcast products and sums, in float32.

    Under ``torch.compile`` each line becomes (part of) one generated reduction kernel that reads the static
    cache where it lies: scores (a sum over D), softmax (over L), output (a sum over L). No K/V copy per query
    head, no library call with its own setup kernels. Run eagerly it materializes [KVH, G, L, D] products: fine
    for tests, slow for real use. Anything but one decode token goes to transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _one_decode_token(query, attention_mask, dropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    _, h, _, d = query.shape
    kvh, L = key.shape[1], key.shape[2]
    scale = d ** -0.5 if scaling is None else scaling
    q = query.view(kvh, h // kvh, 1, d).float()  # [KVH, G, 1, D]: query head kv * G + g, as repeat_kv orders them
    scores = (q * key[0, :, None].float()).sum(-1) * scale  # [KVH, G, L]
    scores = scores.masked_fill(~attention_mask.view(1, 1, L), float("-inf"))
    probs = scores.softmax(-1)  # [KVH, G, L]
    out = (probs[..., None] * value[0, :, None].float()).sum(-2)  # [KVH, G, D]
    return out.to(query.dtype).view(1, 1, h, d), None  # [B, 1, H, D] as transformers returns


DECODE_ATTENTION = {"packed-gqa": ("kvlab_packed_gqa", packed_gqa_attention),  # name registered with transformers
                    "reduce": ("kvlab_reduce", reduce_attention)}


def register_attention(name: str, fn: Callable[..., Any]) -> None:
    """Register an attention function with transformers' attention and mask interfaces (masks as for sdpa)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)


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
        return Part(self, 0)

    def part(self, i: int) -> nn.Module:
        return Part(self, i)

    def compute(self, x: Any, i: int) -> Any:
        if i == 0 or self._input is not x:  # the first projection (or an unexpected order): compute all
            self._input = x
            self._parts = F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        out = self._parts[i]
        if i == len(self.sizes) - 1:
            self._input = self._parts = None  # keep nothing alive between steps
        return out


class Part(nn.Module):
    """One output of a FusedLinear, standing in for the Linear it replaced."""

    def __init__(self, owner: FusedLinear, i: int):
        super().__init__()
        self.i = i
        self.owner = [owner]  # a list: not registered twice as a submodule
        if i == 0:
            self.fused = owner  # registered once, by the first part

    def forward(self, x: Any) -> Any:
        return self.owner[0].compute(x, self.i)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up as one GEMM."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj])
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

    def forward(self, x: Any) -> Any:
        gate, up = F.linear(x, self.gate_up.weight, self.gate_up.bias).split(self.gate_up.sizes, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class RMSNorm(nn.Module):
    """transformers' RMSNorm through F.rms_norm (one fused kernel on CUDA)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, float(norm.variance_epsilon)

    def forward(self, x: Any) -> Any:  # as transformers: normalize in float32, cast, then scale
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


# ----------------------------------------------------------------------------------------------------------------
# the CUDA-graph decode runner


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
    fuse: ``fuse_modules`` first (q/k/v and gate/up as single GEMMs, fused RMSNorm): fewer kernels per step;
    attention: its decode attention (``ATTENTIONS``; "reduce" pays off only compiled).
    keep_logits=False: the step keeps only its argmax (greedy only; a little faster).
    """

    def __init__(self, model: TorchModel, max_cache_len: int, *, mode: str = "capture", fuse: bool = False,
                 attention: str = "sdpa", compile_mode: str = "default", compile_backend: str = "inductor",
                 keep_logits: bool = True, warmup: int = 3):
        if not isinstance(model, TorchModel):
            raise ConfigError(f"model must be a TorchModel (torch_backend.load(...)), got {model!r}")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}; choose one of {MODES}")
        attn = getattr(model.hf.config, "_attn_implementation", "sdpa")
        if attn not in (*ATTENTION, *(name for name, _ in DECODE_ATTENTION.values())):
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

        if attention != "sdpa" and not fuse:
            raise ConfigError(f"attention={attention!r} is one of fuse_modules' rewrites: pass fuse=True with it")
        self.fused = fuse_modules(model, attention=attention) if fuse else {}
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
        now = [t.data_ptr() for t in _KVWatch.tensors(self.cache)]
        if now != self.kv_ptrs:
            raise RuntimeError("the static cache was reallocated: the captured graph would read stale addresses")

    def _replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.inference_mode():
                self._step()

    @property
    def position(self) -> int:
        return int(self._pos.item())

    # -- generation ----------------------------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """reset(), then feed the prompt uncaptured; returns its last logits [V] (float32, on device)."""
        n = len(ids)
        if n < 1:
            raise ConfigError("the prompt is empty: give at least one token")
        if n > self.max_cache_len:
            raise CapacityError(f"a prompt of {n} tokens does not fit max_cache_len={self.max_cache_len}")
        self.reset()
        with torch.inference_mode():
            logits = self._forward(torch.tensor([list(ids)], dtype=torch.long, device=self.model.device))
        return logits

    def start(self, ids: Sequence[int]) -> None:
        """prefill(ids), then feed its greedy token to the step: each replay from here decodes one more token."""
        first = self.prefill(ids).argmax()
        self.tok.copy_(first.view(1, 1))
        self.history[len(ids)] = first

    def decode_greedy(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The lean loop: start, then replay max_new_tokens - 1 steps with no host sync in between."""
        n_new = _check_new_tokens(max_new_tokens)
        _capacity(self.max_cache_len, len(ids) + n_new - 1)
        self.start(ids)
        for _ in range(n_new - 1):
            self._replay()
        out = self.history[len(ids): len(ids) + n_new].tolist()  # one sync
        _sync(self.model.device)
        return [int(t) for t in out]

    def generate(self, prompt: Any, *, max_new_tokens: int = 32, chat: bool = False,
                 sampling: Sampling | None = None, stop_on_eos: bool = True,
                 on_step: StepHook | Iterable[StepHook] | None = None) -> TorchGeneration:
        """kvlab's contract (records, hooks, sampling) over the graph: one replay and one host sync per token."""
        model, dev = self.model, self.model.device
        n_new = _check_new_tokens(max_new_tokens)
        ids = model.encode(prompt, chat=chat)
        _capacity(self.max_cache_len, len(ids) + n_new - 1)
        sampling = sampling or Sampling()
        if sampling.do_sample and not self.keep_logits:
            raise ConfigError("sampling needs the step's logits: build the GraphRunner with keep_logits=True")
        choose = sampling.chooser()
        hooks, records, tokens = _hooks(on_step), [], []
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
            _emit_step(records, hooks, model, dev, counter, position=position, n=n, token=token, wall=wall, run=run,
                       live=live)
            position += n
            tokens.append(token)
            stop = _stop_reason(model, tokens, n_new, stop_on_eos)
            if stop:
                break
        _sync(dev)
        return TorchGeneration(model=model.name, device=str(dev), cache=f"graph-{self.mode}(max_cache_len="
                               f"{self.max_cache_len})", dtype=str(model.dtype).replace("torch.", ""),
                               prompt_ids=list(ids), token_ids=tokens, text=model.decode(tokens), stop_reason=stop,
                               records=records)


def argmax_cols(n: int) -> int:
    """Row length for the two-stage argmax of n values: the largest divisor of n in [64, 1024], else 0."""
    return max([c for c in range(64, min(n, 1024) + 1) if n % c == 0] or [0])


def _argmax(x: torch.Tensor, cols: int) -> torch.Tensor:
    """argmax of a 1-D tensor in two stages (rows of ``cols``, then the rows' maxima): a parallel reduction where a
    single-block one takes ~30 us on a 128k vocabulary. Ties resolve to the first index, as argmax does."""
    n = x.shape[0]
    if not cols or n % cols or n // cols < 2:
        return x.argmax()
    vals, idx = x.view(n // cols, cols).max(dim=1)  # [R], [R]
    row = vals.argmax()
    return row * cols + idx.gather(0, row.view(1)).squeeze(0)  # gather: no host sync (capturable)
