"""kvlab.lab.by_hand, the numpy KV cache of notebook 00b: both reference caches give the no-cache outputs, the
check tells a right cache from a wrong, missing or copying one, and the byte counts are exact."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.lab import by_hand
from kvlab.lab.by_hand import GrowingKV, PreallocatedKV, check_cache


def test_both_caches_give_the_no_cache_outputs_and_each_others_bit_for_bit():
    layer, xs = by_hand.Layer(), by_hand.inputs(20)
    reference = by_hand.decode_without_cache(layer, xs)
    grown = by_hand.decode_with(GrowingKV(), layer, xs)
    written = by_hand.decode_with(PreallocatedKV(layer.heads, 20, layer.head_dim), layer, xs)
    assert np.allclose(grown, reference, rtol=1e-5, atol=1e-6) and np.array_equal(grown, written)


def test_a_static_cache_refuses_a_position_past_max_len():
    layer, xs = by_hand.Layer(), by_hand.inputs(5)
    with pytest.raises(IndexError, match="4 positions"):
        by_hand.decode_with(PreallocatedKV(layer.heads, 4, layer.head_dim), layer, xs)


class Unwritten:
    def __init__(self, heads, max_len, head_dim):
        pass

    def update(self, k, v): ...


class Copying(PreallocatedKV):
    """Right outputs, but a copy every step: not a static cache."""

    def update(self, k, v):
        keys, values = super().update(k, v)
        return keys.copy(), values.copy()


class OneShort(GrowingKV):
    """Forgets to return the newest position."""

    def update(self, k, v):
        keys, values = super().update(k, v)
        return (keys[:, :-1], values[:, :-1]) if keys.shape[1] > 1 else (keys, values)


def test_the_check_tells_right_from_missing_wrong_and_copying():
    assert check_cache(GrowingKV, "dynamic").ok is True and check_cache(PreallocatedKV, "static").ok is True
    assert check_cache(None, "dynamic").ok is None and check_cache(Unwritten, "static").ok is None
    copying = check_cache(Copying, "static")
    assert copying.ok is False and "step 1 returned a new buffer" in copying.message
    assert check_cache(OneShort, "dynamic").ok is False
    assert check_cache(GrowingKV, "static").ok is False  # built with the static signature: it raises, reported
    with pytest.raises(ValueError, match="'ring'"):
        check_cache(GrowingKV, "ring")


def test_the_byte_counts_are_exact():
    layer, xs = by_hand.Layer(), by_hand.inputs(8)
    per_position = 2 * layer.d_model * 4  # a key and a value, float32
    grown = by_hand.trace(GrowingKV(), layer, xs)
    written = by_hand.trace(PreallocatedKV(layer.heads, 8, layer.head_dim), layer, xs)
    assert grown.written_bytes.tolist() == [per_position * (t + 1) for t in range(8)]
    assert grown.copied_bytes.tolist() == [per_position * t for t in range(8)] and grown.fresh.all()
    assert written.written_bytes.tolist() == [per_position] * 8 and written.fresh.tolist() == [True] + [False] * 7
    assert by_hand.recomputed(layer, xs).written_bytes.tolist() == grown.written_bytes.tolist()
