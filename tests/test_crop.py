"""``cache.crop(n)``: a cache rewound to its first ``n`` positions goes on as if it had only ever seen them, in every
slot or in none. Growing KV keeps copies of its first positions, a fixed buffer keeps its bytes (the next steps
overwrite the rest), a state refuses by name (it needs a snapshot); a refused or failed crop changes nothing."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import kvlab
from kvlab import CacheStateError, ConfigError, DynamicCache, StaticCache, Stepper, open_device
from kvlab.ort.checks.faults import Injected, fault

PROMPT = [5, 6, 7, 8, 9]


def _cache(kind: str) -> kvlab.Cache:
    if kind == "dynamic":
        return DynamicCache()
    return StaticCache(32, states="in-place" if kind == "static in place" else "swap")


def _greedy(stepper: Stepper, ids: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """The prefill of ``ids``, then ``steps`` greedy decode steps: the tokens and each step's last logits."""
    logits, _ = stepper.step(ids)
    tokens, seen = [int(np.argmax(logits))], [logits]
    for _ in range(steps):
        logits, _ = stepper.step([tokens[-1]])
        tokens.append(int(np.argmax(logits)))
        seen.append(logits)
    return tokens, seen


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_cropped_cache_goes_on_as_if_it_had_seen_only_its_first_positions(toy, kind, device):
    dev = open_device(device)
    with _cache(kind) as cache, Stepper(toy, cache, dev, 16) as s:
        tokens, logits = _greedy(s, PROMPT, 4)  # the cache holds the prompt and 4 decode tokens
        assert cache.seq_length == len(PROMPT) + 4
        live = dev.live_tensors
        cache.crop(len(PROMPT) + 1)  # the prompt and the first decode token: as after the second step
        assert cache.seq_length == len(PROMPT) + 1
        assert dev.live_tensors == live  # a dynamic cache's copies replace its presents, one for one
        if kind == "dynamic":
            assert cache.live_bytes == cache.used_bytes_at(cache.seq_length)  # exactly the positions kept
        again, again_logits = [], []
        for token in tokens[1:4]:
            out, record = s.step([token])
            again.append(int(np.argmax(out)))
            again_logits.append(out)
        assert again == tokens[2:5]
        np.testing.assert_allclose(np.stack(again_logits), np.stack(logits[2:5]), rtol=0, atol=1e-5)
        assert record.position == len(PROMPT) + 3


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_crop_to_zero_starts_over_and_to_the_length_changes_nothing(toy, kind):
    with _cache(kind) as cache, Stepper(toy, cache, "cpu", 16) as s:
        first, _ = _greedy(s, PROMPT, 3)
        held = [t.data_ptr for t in cache.tensors]
        cache.crop(cache.seq_length)
        assert [t.data_ptr for t in cache.tensors] == held
        cache.crop(0)
        assert cache.seq_length == 0
        assert _greedy(s, PROMPT, 3)[0] == first


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("bad", [-1, 7, 2.0, True, "3", None])
def test_crop_takes_an_int_from_0_to_the_length(toy, kind, bad):
    with _cache(kind) as cache, Stepper(toy, cache, "cpu", 16) as s:
        s.step(PROMPT[:6])
        wanted = rf"crop\({re.escape(repr(bad))}\): n must be an int from 0 to 5 \(the positions held\)"
        with pytest.raises(ConfigError, match=wanted):
            cache.crop(bad)
        assert cache.seq_length == 5


def test_crop_is_refused_on_a_disposed_cache_and_from_another_thread_while_one_uses_it(toy):
    cache = StaticCache(32)
    with Stepper(toy, cache, "cpu", 16) as s:
        s.step(PROMPT)
        errors = []
        other = threading.Thread(target=lambda: _catch(errors, lambda: cache.crop(2)))
        other.start()
        other.join(30)
        assert len(errors) == 1 and isinstance(errors[0], CacheStateError), errors
        assert "another thread uses it" in str(errors[0]) and cache.seq_length == len(PROMPT)
        cache.crop(2)  # the thread that uses it may
    cache.crop(1)  # and anyone, once nobody uses it
    assert cache.seq_length == 1
    cache.dispose()
    with pytest.raises(CacheStateError, match="disposed"):
        cache.crop(0)


def _catch(errors: list, call) -> None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        errors.append(exc)


def test_crop_is_refused_between_a_steps_commit_and_its_settle(toy):
    """A hook runs after the commit: a crop there would rewind a step that may still be rolled back."""
    with DynamicCache() as cache:

        def crop_in_the_hook(record) -> None:
            if record.phase == "decode":
                cache.crop(1)

        with Stepper(toy, cache, "cpu", 16, hooks=[crop_in_the_hook]) as s:
            logits, _ = s.step(PROMPT)
            with pytest.raises(CacheStateError, match="in the middle of a step"):
                s.step([int(np.argmax(logits))])
            assert cache.seq_length == len(PROMPT)  # the step was rolled back


def test_a_crop_that_fails_midway_changes_nothing(toy):
    """The copies are made for every layer before any is installed: the third copy's allocation fails, and the
    cache still holds every position, on the tensors it had."""
    dev = open_device("cpu")
    with DynamicCache() as cache, Stepper(toy, cache, dev, 16) as s:
        tokens, _ = _greedy(s, PROMPT, 2)
        held, live = [t.data_ptr for t in cache.tensors], dev.live_tensors
        with fault("allocate", at_call=3), pytest.raises(Injected):
            cache.crop(3)
        assert cache.seq_length == len(PROMPT) + 2 and [t.data_ptr for t in cache.tensors] == held
        assert dev.live_tensors == live  # the two copies made were released
        out, _ = s.step([tokens[-1]])  # and it goes on
        assert cache.seq_length == len(PROMPT) + 3


@pytest.mark.parametrize("kind", ["dynamic", "static", "static in place"])
def test_a_state_refuses_to_be_cropped_by_name_and_nothing_changes(kind):
    """A conv state sums up every position it saw: rewinding it needs a snapshot; crop(0) starts over."""
    model = kvlab.load("conv-toy")
    with _cache(kind) as cache, Stepper(model, cache, "cpu", 16) as s:
        tokens, _ = _greedy(s, PROMPT, 2)
        held = [t.data_ptr for t in cache.tensors]
        with pytest.raises(
            CacheStateError, match=r"cannot crop to 3 of 7 positions: layer \d+'s conv state .*snapshot"
        ):
            cache.crop(3)
        assert cache.seq_length == len(PROMPT) + 2 and [t.data_ptr for t in cache.tensors] == held
        out, _ = s.step([tokens[-1]])
        cache.crop(0)
        assert _greedy(s, PROMPT, 2)[0] == tokens
