"""kvlab.lab.exercises: the checks the notebooks' exercises call say right, wrong (with the hint) or no answer yet,
and never raise for an attendee's answer."""

from __future__ import annotations

import pytest

from kvlab.core.generation import first_divergence
from kvlab.lab.exercises import Verdict, check, check_function, check_prediction, kv_bytes_per_token


def test_the_formula_gives_smollm2_and_kv_heavy_bytes_per_token(toy):
    assert kv_bytes_per_token(30, 3, 64, 4) == 46_080  # SmolLM2-135M, float32
    assert kv_bytes_per_token(12, 8, 128, 4) == 98_304  # kv-heavy: 24 tensors of 4 KiB per token
    info = toy.info
    assert kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_dim, info.dtype.itemsize) == (
        info.bytes_per_token
    )


def test_a_number_is_right_wrong_or_missing():
    assert check(None, 46_080, what="bytes per token").ok is None
    assert check(..., 46_080, what="bytes per token").ok is None
    right = check(46_080, 46_080, what="SmolLM2's KV bytes per token", unit="bytes")
    assert right.ok is True and str(right) == "Right: SmolLM2's KV bytes per token is 46,080 bytes"
    wrong = check(23_040, 46_080, what="bytes per token", hint="keys and values: 2 per layer")
    assert wrong.ok is False and "0.5x the right value" in wrong.message and "hint: keys and values" in wrong.message
    assert check(46_080.4, 46_080, what="x").ok is True  # an integer answer given as a float
    assert check(46_081, 46_080, what="x").ok is False
    assert check(141, 135.0, what="MiB", rel=0.05).ok is True and check(150, 135.0, what="MiB", rel=0.05).ok is False
    assert check("46080", 46_080, what="x").ok is False  # a string is no number: said, not raised


def test_a_word_ignores_case_and_space():
    assert check(" Prefill ", "prefill", what="the wrong phase").ok is True
    assert check("decode", "prefill", what="the wrong phase", hint="section 2").ok is False
    with pytest.raises(TypeError, match="compares numbers or words"):
        check(1, [1], what="x")


def test_a_prediction_is_close_or_off_by_how_much():
    assert check_prediction(None, 64.0, what="the dynamic step", unit="ms").ok is None
    assert check_prediction(70, 64.0, what="the dynamic step", unit="ms").ok is True
    low = check_prediction(30, 64.0, what="the dynamic step", unit="ms")
    assert low.ok is False and "53% too low" in low.message and "64 ms" in low.message


def test_a_function_is_checked_against_kvlabs_on_every_case():
    cases = [([1, 2, 3], [1, 2, 3]), ([1, 2, 3], [1, 5, 3]), ([1, 2], [1, 2, 3]), ([], [])]

    def mine(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)  # forgets unequal lengths

    assert check_function(None, first_divergence, cases, what="first_divergence").ok is None
    wrong = check_function(mine, first_divergence, cases, what="first_divergence")
    assert wrong.ok is False and "for [1, 2], [1, 2, 3] it returned None; the right answer is 2" in wrong.message
    assert check_function(first_divergence, first_divergence, cases, what="f").ok is True
    broken = check_function(lambda a, b: a[10], first_divergence, cases, what="f")
    assert broken.ok is False and "raised IndexError" in broken.message
    assert check_function(3, first_divergence, cases, what="f").ok is False
    unwritten = check_function(lambda a, b: None, first_divergence, cases, what="f")
    assert unwritten.ok is None and "write its body" in unwritten.message


def test_a_verdict_reads_as_html_in_a_notebook():
    html = Verdict(False, "a < b").__repr__(), Verdict(False, "a < b")._repr_html_()
    assert html[0] == "Not yet: a < b" and "a &lt; b" in html[1] and "#d62728" in html[1]
