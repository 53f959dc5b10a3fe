"""Property tests of the validation layer that kvlab's public entry points share (hypothesis): any value of the wrong
type or out of range, for every kind of public argument (counts, sizes, numbers, flags, names, token ids, the CLI's
comma-separated ints), is refused with a kvlab error (a ``KvlabError``, never a bare TypeError, ValueError or
OverflowError from numpy or Python) whose message names the value. Each property drives the public entry point
where that is cheap (the refusal comes before any model, session or device work) and the shared check otherwise.
The profile (``tests/tiers.py``) sets the examples: few in the fast tier."""

from __future__ import annotations

import argparse
import contextlib
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import kvlab
from kvlab import KvlabError, Sampling, StaticCache, generate, open_device
from kvlab.cli.flags import positive_ints
from kvlab.core.devices import BUFFER_CACHE_MODES
from kvlab.core.errors import check_choice, check_flag, check_int
from kvlab.core.generation import check_new_tokens
from kvlab.core.guards import check_token_ids
from kvlab.ort.runtime.options import check_threads, cpu_count, webgpu_options
from kvlab.presets import PRECISIONS, check_precision

pytestmark = pytest.mark.hypothesis

VOCAB = 512  # the toy's

# values of any type but a proper int (bools and floats included: a count is never 2.0 or True)
not_ints = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=3),
    st.complex_numbers(),
    st.builds(np.float64, st.floats(-1e6, 1e6)),
    st.just(np.bool_(True)),
    st.builds(object),
)
non_positive = st.one_of(st.integers(max_value=0), st.builds(np.int64, st.integers(-(2**63), 0)))
bad_counts = st.one_of(not_ints, non_positive)
not_flags = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.just("yes"),
    st.just("False"),
    st.just(np.bool_(True)),
    st.lists(st.booleans(), max_size=2),
)


def refused(call, value, *names: str) -> KvlabError:
    """The kvlab error ``call(value)`` raises; its message holds ``value``'s repr (or one of ``names``)."""
    try:
        call(value)
    except KvlabError as exc:
        text = str(exc)
        wanted = [repr(value)[:40], *names]
        assert any(w in text for w in wanted), f"{text!r} names none of {wanted}"
        return exc
    except Exception as exc:  # noqa: BLE001 (the property: nothing else escapes)
        pytest.fail(f"{value!r}: {type(exc).__name__}: {exc}, not a kvlab error")
    pytest.fail(f"{value!r} was accepted")


@given(bad_counts)
def test_max_new_tokens_of_the_wrong_type_or_range_is_refused(toy, value):
    refused(lambda v: generate(toy, [1, 2], max_new_tokens=v), value)
    refused(check_new_tokens, value)


@given(bad_counts)
def test_max_cache_len_of_the_wrong_type_or_range_is_refused(value):
    refused(StaticCache, value, "max_cache_len=")


@given(st.integers(min_value=4097, max_value=10**40))
def test_max_cache_len_past_the_context_is_refused_before_any_allocation(toy, value):
    refused(lambda v: generate(toy, [1, 2], cache=StaticCache(v), max_new_tokens=1), value, str(value))


@given(st.one_of(not_ints.filter(lambda v: not isinstance(v, (float, np.floating))), st.floats(max_value=1e-30)))
def test_a_temperature_of_the_wrong_type_or_range_is_refused(value):
    refused(lambda v: Sampling(do_sample=True, temperature=v), value, "temperature=")


@given(st.one_of(not_ints, st.integers(max_value=-1)))
def test_top_k_of_the_wrong_type_or_range_is_refused(value):
    refused(lambda v: Sampling(do_sample=True, top_k=v), value, "top_k=")


@given(
    st.one_of(
        st.floats().filter(lambda v: not 0 < v <= 1 or math.isnan(v)),
        st.text(max_size=4),
        st.none(),
        st.booleans(),
    )
)
def test_top_p_of_the_wrong_type_or_range_is_refused(value):
    refused(lambda v: Sampling(do_sample=True, top_p=v), value, "top_p=")


@given(st.one_of(not_ints.filter(lambda v: v is not None), st.integers(max_value=-1)))
def test_a_seed_of_the_wrong_type_or_range_is_refused(value):
    refused(lambda v: Sampling(do_sample=True, seed=v), value, "seed=")


@given(st.one_of(bad_counts.filter(lambda v: v is not None), st.integers(min_value=cpu_count() + 1, max_value=10**30)))
def test_threads_of_the_wrong_type_or_range_are_refused(value):
    refused(lambda v: open_device("cpu", threads=v), value, "threads=")
    refused(check_threads, value, "threads=")


@given(st.one_of(st.text(max_size=12), st.none(), st.integers(), st.booleans(), st.just("CPU"), st.just("cuda")))
def test_an_unknown_device_name_is_refused(value):
    if value in ("cpu", "webgpu"):
        return
    refused(lambda v: open_device(v), value)
    refused(lambda v: kvlab.close_device(v), value)


@given(st.one_of(st.text(max_size=8), st.none(), st.integers(), st.booleans(), st.just("int8"), st.just("FP32")))
def test_an_unknown_precision_is_refused(value):
    if value in PRECISIONS:
        return
    refused(check_precision, value)


@given(st.one_of(st.text(max_size=12), st.integers(), st.booleans(), st.just(""), st.just("Bucket")))
def test_an_unknown_buffer_cache_mode_is_refused(value):
    if value in BUFFER_CACHE_MODES:
        return
    refused(lambda v: webgpu_options(buffer_cache_mode=v), value)


@given(not_flags)
def test_a_flag_that_is_not_a_bool_is_refused(toy, value):
    refused(lambda v: check_flag("progress", v), value, "progress=")
    refused(lambda v: generate(toy, [1, 2], max_new_tokens=1, stop_on_eos=v), value, "stop_on_eos=")
    refused(lambda v: generate(toy, "hi", max_new_tokens=1, chat=v), value, "chat=")
    refused(lambda v: Sampling(do_sample=v), value, "do_sample=")


@given(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()))
def test_check_choice_refuses_what_is_not_a_choice(value):
    if value in ("a", "b"):
        return
    exc = refused(lambda v: check_choice(v, ("a", "b"), "thing "), value)
    assert "choose one of ('a', 'b')" in str(exc)


# token ids: outside the vocabulary (negative, past it, past int64), of the wrong type (floats, bools, strings,
# None), ragged, nested, empty
outside = st.one_of(st.integers(max_value=-1), st.integers(min_value=VOCAB, max_value=10**40))
wrong_element = st.one_of(
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(min_size=1, max_size=3),
    st.none(),
    st.builds(np.float32, st.floats(0, 10, width=32)),
    st.just(np.bool_(False)),
)
bad_id_lists = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), max_size=3).flatmap(
        lambda good: st.tuples(st.just(good), outside).map(lambda t: [*t[0], t[1]])
    ),
    st.lists(wrong_element, min_size=1, max_size=4),
    st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=2, max_size=3).filter(
        lambda rows: len({len(r) for r in rows}) > 1
    ),
    st.just([]),
    st.just([[[1]]]),
    st.builds(lambda v: np.array([v], dtype=np.int64), outside.filter(lambda v: -(2**63) <= v < 2**63)),
)


@given(bad_id_lists)
def test_token_ids_that_are_not_ids_of_the_vocabulary_are_refused(toy, ids):
    exc = refused(lambda v: check_token_ids(v, VOCAB), ids, "token id", "token ids", "batch size", "the prompt")
    assert exc is not None
    refused(lambda v: generate(toy, v, max_new_tokens=1), ids, "token id", "token ids", "batch size", "the prompt")


@given(
    st.one_of(
        st.text(max_size=10).filter(lambda t: not all(p.strip().isdigit() for p in t.split(","))),
        st.integers(max_value=0).map(str),
    )
)
def test_comma_separated_ints_of_the_cli_refuse_anything_else(text):
    values = None
    with contextlib.suppress(ValueError):
        values = [int(v) for v in text.split(",")]
    if values is not None and all(v > 0 for v in values):
        return  # int() takes more than digits (" 1", "+1", "1_0"): then it is a list of positive ints
    with pytest.raises(argparse.ArgumentTypeError) as info:  # argparse turns it into one line, exit 2
        positive_ints(text)
    assert repr(text) in str(info.value)


INT_TYPES = [int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@given(st.integers(1, 127), st.sampled_from(INT_TYPES))
@example(127, np.int8)  # the largest int8: a test that added 1 to it wrapped to -128 (found in a CI rehearsal)
def test_every_integer_type_in_range_is_taken_as_a_python_int(value, kind):
    """Every integer argument goes through check_int: numpy's integers are counts too, returned as Python ints."""
    for taken in (
        check_int(kind(value), "n", 1, 127),
        check_new_tokens(kind(value)),
        StaticCache(kind(value)).max_cache_len,
        check_threads(kind(min(value, cpu_count()))),
    ):
        assert type(taken) is int and taken in (value, min(value, cpu_count()))


@given(st.one_of(not_ints, st.integers(max_value=-1), st.integers(min_value=128)))
def test_check_int_refuses_every_other_value_and_names_it(value):
    assert "must be an int from 0 to 127" in str(refused(lambda v: check_int(v, "n", 0, 127), value))
