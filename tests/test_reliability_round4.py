"""Issue 55's defects, each with the real part: a conversation's cache held by someone else, a conversation called
from two real threads, sizes taken from a flag, non-finite logits on the device path, model files replaced under a
loaded model, special files as outputs, a killed browser-bench's node, and a Ctrl-C during ONNX Runtime's import."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import kvlab
from kvlab import Conversation, StaticCache, Stepper, generate, open_device

A, B = [5, 6, 7, 8], [9, 10]


# -- one owner per cache use: a refused turn does not adopt another's use
def test_a_turn_refused_because_a_stepper_holds_the_cache_does_not_adopt_its_use(toy):
    with Conversation(toy, StaticCache(32)) as reference:
        reference.say(A, 3, stop_on_eos=False)
        expected = reference.say(B, 3, stop_on_eos=False).token_ids
    cache = StaticCache(32)
    with Conversation(toy, cache) as chat:
        chat.say(A, 3, stop_on_eos=False)
        with Stepper(toy, cache, "cpu", 8) as other:  # someone else's sequence in the conversation's cache
            other.step([20, 21, 22])
            with pytest.raises(kvlab.CacheStateError, match="in use by another generation"):
                chat.say(B, 3, stop_on_eos=False)
        assert chat.held == 0  # the other use's positions are not the conversation's
        assert chat.say(B, 3, stop_on_eos=False).token_ids == expected


# -- a conversation is called by one thread at a time
def _hold_a_turn(chat: Conversation) -> tuple[threading.Thread, threading.Event, threading.Event, list]:
    """A thread whose turn waits inside its first step's hook until released; returns it, 'inside', 'go on'."""
    inside, go_on, errors = threading.Event(), threading.Event(), []

    def hook(record):
        inside.set()
        assert go_on.wait(30)

    chat.hooks.append(hook)

    def turn():
        try:
            chat.say(B, 2, stop_on_eos=False)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    t = threading.Thread(target=turn, name="turn-thread")
    t.start()
    assert inside.wait(30)
    return t, go_on, errors


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.say([11, 12], 2),
        lambda c: c.rewind(2),
        lambda c: c.rewind_turn(),
        lambda c: c.close(),
    ],
    ids=["say", "rewind", "rewind_turn", "close"],
)
def test_a_second_thread_calling_a_conversation_during_a_turn_is_refused_and_changes_nothing(toy, call):
    with Conversation(toy, StaticCache(32)) as chat:
        chat.say(A, 3, stop_on_eos=False)
        t, go_on, errors = _hold_a_turn(chat)
        try:
            with pytest.raises(kvlab.CacheStateError, match=r"while turn-thread runs Conversation\.say\(\)"):
                call(chat)
        finally:
            go_on.set()
            t.join(30)
        chat.hooks.pop()
        assert not errors
        assert [(t.index, t.start) for t in chat.turns] == [(1, 0), (2, len(A) + 3)]
        with Conversation(toy, StaticCache(32)) as reference:
            reference.say(A, 3, stop_on_eos=False)
            assert chat.turns[1].token_ids == reference.say(B, 2, stop_on_eos=False).token_ids
        assert chat.rewind_turn().index == 2 and len(chat.ids) == len(A) + 3


def test_turns_from_two_threads_at_once_keep_the_history_whole(toy):
    with Conversation(toy, StaticCache(256)) as chat:
        refused, done = [], []

        def talk():
            for _ in range(10):
                try:
                    done.append(chat.say([5, 6], 2, stop_on_eos=False).index)
                except kvlab.CacheStateError:
                    refused.append(1)

        threads = [threading.Thread(target=talk) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        indices = [t.index for t in chat.turns]
        assert indices == list(range(1, len(indices) + 1)) and sorted(done) == indices
        with Conversation(toy, StaticCache(256)) as reference:
            for turn in chat.turns:
                assert reference.say([5, 6], 2, stop_on_eos=False).token_ids == turn.token_ids


# -- sizes from the run, checked before allocation
def test_tokens_per_read_past_the_run_allocates_for_the_run(toy):
    dev = open_device("cpu")
    live: list[int] = []
    start = time.perf_counter()
    g = generate(
        toy, A, max_new_tokens=4, token_on_device=True, tokens_per_read=10**3, stop_on_eos=False,
        cache=StaticCache(16), on_step=lambda r: live.append(dev.live_tensors),
    )  # fmt: skip
    assert time.perf_counter() - start < 5
    assert len(g.token_ids) == 4
    assert max(live) - min(live) <= 1 and max(live) < 40  # a ring of at most the run's positions + 1


@pytest.mark.parametrize("asked", [10**5, 10**9])
def test_an_absurd_tokens_per_read_is_refused_by_name_before_anything_runs(toy, asked):
    start = time.perf_counter()
    with pytest.raises(kvlab.ConfigError, match=rf"tokens_per_read={asked} must be an int from 1 to"):
        generate(toy, A, max_new_tokens=4, token_on_device=True, tokens_per_read=asked)
    with pytest.raises(kvlab.ConfigError, match=rf"tokens_per_read={asked} must be an int from 1 to"):
        Stepper(toy, StaticCache(16), "cpu", 8, token_on_device=True, tokens_per_read=asked)
    assert time.perf_counter() - start < 5


def test_a_burst_after_a_prefill_that_returned_its_logits_runs(toy):
    # the prefill bound the logits [1, 4, vocab] on the binding the burst's steps reuse: a raw RuntimeError before
    expected = generate(toy, A, max_new_tokens=4, token_on_device=False, stop_on_eos=False).token_ids
    with Stepper(toy, StaticCache(16), "cpu", 8, token_on_device=True, tokens_per_read=10**3) as s:
        first = s.step(np.array(A))[1].token
        records = s.decode(first, 3)
    assert [first, *(r.token for r in records)] == expected
