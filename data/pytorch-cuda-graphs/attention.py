"""The decode attentions of the recorded ``graph-*-fused`` runs (``record.py --attention``): one decode token of a
Llama-family model attending to a static cache where it lies. ``use(model, name)`` registers one with transformers
(masks as for sdpa) and switches ``model`` to it; kvlab's GraphRunner then drives it like sdpa (a bool 4-D mask).
Same function as sdpa; float rounding can differ in the last bits. Imported by ``modes.py`` and its tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvlab.core.errors import check_choice

ATTENTIONS = ("sdpa", "packed-gqa", "reduce")  # --attention: how a decode step attends


def use(model: Any, attention: str) -> int:
    """Switch the kvlab ``TorchModel`` ``model`` (loaded with sdpa) to ``attention`` (one of ``ATTENTIONS``;
    "sdpa" changes nothing); returns how many attentions it replaced (0 or 1). ConfigError for another name."""
    check_choice(attention, ATTENTIONS, "attention=")
    if attention == "sdpa" or getattr(model.hf.config, "_attn_implementation", None) != "sdpa":
        return 0
    name, fn = DECODE_ATTENTION[attention]
    register_attention(name, fn)
    model.hf.config._attn_implementation = name
    return 1


def decode_attention(one_token: Callable[[Any, Any, Any, Any, float | None], Any | None]) -> Callable[..., Any]:
    """An attention function with transformers' signature that runs ``one_token(query, key, value, mask, scaling)``
    for one decode token (batch 1, one query token, a [1, 1, 1, L] bool mask, no dropout) and transformers' sdpa for
    anything else (prefill, no mask), or where ``one_token`` returns None."""

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        one = (
            query.shape[0] == 1
            and query.shape[2] == 1
            and not dropout
            and attention_mask is not None
            and attention_mask.dtype == torch.bool
            and attention_mask.shape[-2] == 1
        )
        out = one_token(query, key, value, attention_mask, scaling) if one else None
        if out is None:
            return sdpa_attention_forward(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                is_causal=is_causal,
                **kwargs,
            )
        return out, None

    return attend


@decode_attention
def packed_gqa_attention(query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any | None:
    """sdpa for one decode token with grouped KV heads, without repeating K/V per query head.

    With a mask, transformers' sdpa path copies K and V to every query head (repeat_kv): [B, KVH, L, D] ->
    [B, H, L, D] per layer and step. For a single query token the G = H / KVH query heads of a group are
    instead laid out as G query rows of one KV head: query [B, H, 1, D] -> [B, KVH, G, D], one sdpa call, no
    copy. None (sdpa runs) without grouped heads."""
    b, h, _, d = query.shape
    kvh = key.shape[1]
    if kvh == h:
        return None
    packed = query.reshape(b, kvh, h // kvh, d)  # head kv * G + g -> (kv, g): repeat_kv's head order
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous()  # [B, 1, H, D] as transformers returns


@decode_attention
def reduce_attention(query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any:
    """Attention of one decode token written as broadcast products and sums, in float32.

    Under ``torch.compile`` each line becomes (part of) one generated reduction kernel that reads the static
    cache where it lies: scores (a sum over D), softmax (over L), output (a sum over L). No K/V copy per query
    head, no library call with its own setup kernels. Run eagerly it materializes [KVH, G, L, D] products: fine
    for tests, slow for real use."""
    _, h, _, d = query.shape
    kvh, L = key.shape[1], key.shape[2]
    scale = d**-0.5 if scaling is None else scaling
    q = query.view(kvh, h // kvh, 1, d).float()  # [KVH, G, 1, D]: query head kv * G + g, as repeat_kv orders them
    scores = (q * key[0, :, None].float()).sum(-1) * scale  # [KVH, G, L]
    scores = scores.masked_fill(~mask.view(1, 1, L), float("-inf"))
    probs = scores.softmax(-1)  # [KVH, G, L]
    out = (probs[..., None] * value[0, :, None].float()).sum(-2)  # [KVH, G, D]
    return out.to(query.dtype).view(1, 1, h, d)  # [B, 1, H, D] as transformers returns


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
