"""Fewer, larger kernels for batch-1 decode on PyTorch: ``fuse_modules`` rewrites a Llama-family model in place
(q/k/v and gate/up as single GEMMs, RMSNorm through ``F.rms_norm``) and can swap in a decode attention that reads
the static cache where it lies. Same function, same weights; float rounding can differ in the last bits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import check_choice
from .models import TorchModel

ATTENTIONS = ("sdpa", "packed-gqa", "reduce")  # fuse_modules(attention=...): how a decode step attends


def fuse_modules(model: TorchModel, attention: str = "sdpa") -> dict[str, int]:
    """Rewrite a Llama-family model in place for fewer kernels per decode step: q/k/v projections as one GEMM,
    gate/up projections as one GEMM, RMSNorm through ``torch.nn.functional.rms_norm`` (fused on CUDA), and the
    attention of one decode token (``attention``, one of ``ATTENTIONS``):

    - "sdpa": transformers' sdpa, unchanged (K/V copied to every query head, then one sdpa call).
    - "packed-gqa": ``packed_gqa_attention``: sdpa with the query heads of a group as rows (no K/V copies).
    - "reduce": ``reduce_attention``: plain float32 arithmetic that ``torch.compile`` fuses into a few
      reduction kernels reading the cache in place (no K/V copies, no library attention call).

    Same function, same weights; float rounding can differ in the last bits. Idempotent; returns what it replaced
    (counts per kind). ConfigError for another ``attention``. "reduce" is meant to be compiled."""
    check_choice(attention, ATTENTIONS, "attention=")
    done = {"qkv": 0, "gate_up": 0, "rms_norm": 0, "attention": 0}
    if attention != "sdpa" and getattr(model.hf.config, "_attn_implementation", None) == "sdpa":
        name, fn = DECODE_ATTENTION[attention]
        register_attention(name, fn)
        model.hf.config._attn_implementation = name
        done["attention"] = 1
    for name, mod in list(model.hf.named_modules()):
        if all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("q_proj", "k_proj", "v_proj")):
            owner = FusedLinear([mod.q_proj, mod.k_proj, mod.v_proj])
            mod.q_proj, mod.k_proj, mod.v_proj = owner.part(0), owner.part(1), owner.part(2)
            done["qkv"] += 1
        if (
            all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj"))
            and hasattr(mod, "act_fn")
            and type(mod).__name__.endswith("MLP")
        ):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, GatedMLP(mod))
            done["gate_up"] += 1
        if (
            type(mod).__name__.endswith("RMSNorm")
            and isinstance(getattr(mod, "weight", None), nn.Parameter)
            and hasattr(mod, "variance_epsilon")
            and mod.weight.dim() == 1
        ):
            parent, _, child = name.rpartition(".")
            setattr(model.hf.get_submodule(parent) if parent else model.hf, child, RMSNorm(mod))
            done["rms_norm"] += 1
    return done


def _one_decode_token(query: Any, attention_mask: Any, dropout: float) -> bool:
    """True for the case the decode attentions handle: batch 1, one query token, a [1, 1, 1, L] bool mask."""
    return (
        query.shape[0] == 1
        and query.shape[2] == 1
        and not dropout
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.shape[-2] == 1
    )


def packed_gqa_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """sdpa for one decode token with grouped KV heads, without repeating K/V per query head.

    With a mask, transformers' sdpa path copies K and V to every query head (repeat_kv): [B, KVH, L, D] ->
    [B, H, L, D] per layer and step. For a single query token the G = H / KVH query heads of a group are
    instead laid out as G query rows of one KV head: query [B, H, 1, D] -> [B, KVH, G, D], one sdpa call, no
    copy. Everything else (prefill, no mask) goes to transformers' sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, _, d = query.shape
    kvh = key.shape[1]
    if not _one_decode_token(query, attention_mask, dropout) or kvh == h:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    packed = query.reshape(b, kvh, h // kvh, d)  # head kv * G + g -> (kv, g): repeat_kv's head order
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None  # [B, 1, H, D] as transformers returns


def reduce_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention of one decode token written as broadcast products and sums, in float32.

    Under ``torch.compile`` each line becomes (part of) one generated reduction kernel that reads the static
    cache where it lies: scores (a sum over D), softmax (over L), output (a sum over L). No K/V copy per query
    head, no library call with its own setup kernels. Run eagerly it materializes [KVH, G, L, D] products: fine
    for tests, slow for real use. Anything but one decode token goes to transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _one_decode_token(query, attention_mask, dropout):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    _, h, _, d = query.shape
    kvh, L = key.shape[1], key.shape[2]
    scale = d**-0.5 if scaling is None else scaling
    q = query.view(kvh, h // kvh, 1, d).float()  # [KVH, G, 1, D]: query head kv * G + g, as repeat_kv orders them
    scores = (q * key[0, :, None].float()).sum(-1) * scale  # [KVH, G, L]
    scores = scores.masked_fill(~attention_mask.view(1, 1, L), float("-inf"))
    probs = scores.softmax(-1)  # [KVH, G, L]
    out = (probs[..., None] * value[0, :, None].float()).sum(-2)  # [KVH, G, D]
    return out.to(query.dtype).view(1, 1, h, d), None  # [B, 1, H, D] as transformers returns


DECODE_ATTENTION = {
    "packed-gqa": ("kvlab_packed_gqa", packed_gqa_attention),  # name registered with transformers
    "reduce": ("kvlab_reduce", reduce_attention),
}


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
        w = self.weight
        biases = [lin.bias.detach() if lin.bias is not None else w.new_zeros(lin.out_features) for lin in linears]
        has_bias = any(lin.bias is not None for lin in linears)
        self.bias = nn.Parameter(torch.cat(biases), requires_grad=False) if has_bias else None
        self._input: Any = None
        self._parts: Any = None

    def part(self, i: int) -> nn.Module:
        """The module standing in for the ``i``-th Linear."""
        return Part(self, i)

    def compute(self, x: Any, i: int) -> Any:
        """The ``i``-th Linear's output for ``x``: all of them computed in one GEMM when the first is asked for."""
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
        """What the replaced Linear returned for ``x``."""
        return self.owner[0].compute(x, self.i)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up as one GEMM."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj])
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

    def forward(self, x: Any) -> Any:
        """What the replaced MLP returned for ``x``."""
        gate, up = F.linear(x, self.gate_up.weight, self.gate_up.bias).split(self.gate_up.sizes, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class RMSNorm(nn.Module):
    """transformers' RMSNorm through F.rms_norm (one fused kernel on CUDA)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, float(norm.variance_epsilon)

    def forward(self, x: Any) -> Any:
        """As transformers' RMSNorm: normalized in float32, cast back, then scaled."""
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
