"""One hand-written GPU kernel: the attention of one decode token over a static KV cache, in Triton.

``decode_attention(query, key, value, mask, scale)`` reads the cache where it lies (no K/V copy per query head),
splits the cache length into tiles that run in parallel (``_tile_partials``: per tile, the softmax maximum,
sum and weighted values of every query head of a KV group) and merges the tiles (``_merge_tiles``): two kernels
per layer, where transformers' sdpa path launches four and ``reduce_attention`` under ``torch.compile`` three.
The arithmetic is float32 throughout. Callable from eager code and from ``torch.compile`` (as a user-defined
Triton kernel), capturable in a CUDA graph (shapes only depend on the cache's size).

Without Triton or off CUDA, ``available()`` is False and callers use plain tensor arithmetic instead.
Measured on an NVIDIA H200: data/h200/README.md.
"""

from __future__ import annotations

from typing import Any

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the kernels are not defined; available() says so
    triton = None


def available(t: Any) -> bool:
    """Whether ``decode_attention`` can run on tensor ``t``'s device (Triton installed, CUDA tensor, or
    Triton's CPU interpreter switched on with TRITON_INTERPRET=1)."""
    import os

    return triton is not None and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def tile_size(length: int) -> int:
    """Cache positions per tile: at least 64, and at most 16 tiles (the merge holds every tile at once)."""
    return max(64, triton.next_power_of_2(-(-length // 16)))


def decode_attention(query: Any, key: Any, value: Any, mask: Any, scale: float) -> Any:
    """Attention of one token: query [1, H, 1, D], key/value [1, KVH, L, D] (the cache; D contiguous),
    mask [1, 1, 1, L] bool (True = attend). Returns [1, 1, H, D] in query's dtype (transformers' layout)."""
    import torch

    _, h, _, d = query.shape
    kvh, length = key.shape[1], key.shape[2]
    g = h // kvh
    block = tile_size(length)
    tiles = -(-length // block)
    gp, dp, sp = triton.next_power_of_2(g), triton.next_power_of_2(d), triton.next_power_of_2(tiles)
    q = query.reshape(h, d).contiguous()  # [H, D]; head kv * G + j serves KV head kv (repeat_kv's order)
    m = torch.empty((kvh, sp, gp), dtype=torch.float32, device=query.device)  # per tile: max score
    s = torch.empty((kvh, sp, gp), dtype=torch.float32, device=query.device)  # per tile: sum of exp
    acc = torch.empty((kvh, sp, gp, dp), dtype=torch.float32, device=query.device)  # per tile: weighted values
    out = torch.empty((h, d), dtype=query.dtype, device=query.device)
    _tile_partials[(kvh, tiles)](q, key, value, mask.reshape(length), m, s, acc, scale, length, g, d,
                                 key.stride(1), key.stride(2), value.stride(1), value.stride(2),
                                 GP=gp, DP=dp, SP=sp, BLOCK=block)
    _merge_tiles[(kvh,)](m, s, acc, out, tiles, g, d, GP=gp, DP=dp, SP=sp)
    return out.view(1, 1, h, d)


if triton is not None:

    @triton.jit
    def _tile_partials(q, k, v, mask, m_out, s_out, acc_out, scale, length, G, D, sk_h, sk_l, sv_h, sv_l,
                       GP: tl.constexpr, DP: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr):
        kv, t = tl.program_id(0), tl.program_id(1)
        g, d = tl.arange(0, GP), tl.arange(0, DP)  # query rows of this KV group, head dimension
        pos = t * BLOCK + tl.arange(0, BLOCK)  # cache positions of this tile
        valid = (pos < length) & (tl.load(mask + pos, mask=pos < length, other=0) != 0)
        gm, dm = g < G, d < D
        qt = tl.load(q + (kv * G + g)[:, None] * D + d[None, :], mask=gm[:, None] & dm[None, :],
                     other=0.0).to(tl.float32)  # [GP, DP]
        kt = tl.load(k + kv * sk_h + pos[:, None] * sk_l + d[None, :], mask=valid[:, None] & dm[None, :],
                     other=0.0).to(tl.float32)  # [BLOCK, DP]
        scores = tl.sum(qt[:, None, :] * kt[None, :, :], axis=2) * scale  # [GP, BLOCK]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        mx = tl.max(scores, axis=1)  # [GP]; -inf where the whole tile is masked
        p = tl.exp(scores - tl.where(mx == float("-inf"), 0.0, mx)[:, None])  # [GP, BLOCK]; masked -> 0
        vt = tl.load(v + kv * sv_h + pos[:, None] * sv_l + d[None, :], mask=valid[:, None] & dm[None, :],
                     other=0.0).to(tl.float32)  # [BLOCK, DP]
        acc = tl.sum(p[:, :, None] * vt[None, :, :], axis=1)  # [GP, DP]
        row = (kv * SP + t) * GP + g  # [GP]
        tl.store(m_out + row, mx)
        tl.store(s_out + row, tl.sum(p, axis=1))
        tl.store(acc_out + row[:, None] * DP + d[None, :], acc)

    @triton.jit
    def _merge_tiles(m_in, s_in, acc_in, out, tiles, G, D, GP: tl.constexpr, DP: tl.constexpr,
                     SP: tl.constexpr):
        kv = tl.program_id(0)
        i, g, d = tl.arange(0, SP), tl.arange(0, GP), tl.arange(0, DP)
        used = i < tiles
        row = (kv * SP + i)[:, None] * GP + g[None, :]  # [SP, GP]
        mx = tl.load(m_in + row, mask=used[:, None], other=float("-inf"))
        top = tl.max(mx, axis=0)  # [GP]: finite (position 0 is always attended)
        w = tl.where(used[:, None], tl.exp(mx - top[None, :]), 0.0)  # [SP, GP]; a masked tile weighs 0
        total = tl.sum(w * tl.load(s_in + row, mask=used[:, None], other=0.0), axis=0)  # [GP]
        acc = tl.load(acc_in + row[:, :, None] * DP + d[None, None, :], mask=used[:, None, None], other=0.0)
        o = tl.sum(w[:, :, None] * acc, axis=0) / total[:, None]  # [GP, DP]
        tl.store(out + (kv * G + g)[:, None] * D + d[None, :], o.to(out.dtype.element_ty),
                 mask=(g < G)[:, None] & (d < D)[None, :])
