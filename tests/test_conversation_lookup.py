"""Prompt-lookup decoding in a conversation: drafts found in the conversation, verified in one multi-token step,
the rest cropped; greedy tokens identical to one token per step, always. A model whose layers keep states cannot
crop rejected drafts: its turns run one token a step and say why."""

from __future__ import annotations

import pytest

import kvlab
from kvlab import Conversation, DynamicCache, PromptLookup, StaticCache
from kvlab.core.lookup import propose, verify
from kvlab.ort.decode.conversation import NO_CROP

REPEATING = [5, 6, 7, 8, 9, 10, 11] * 5  # the turn's input repeats: drafts are found from the first step on
TURNS = [REPEATING, [7, 300, 301, *REPEATING[:10]]]
NEW = 24


def _cache(kind: str) -> kvlab.Cache:
    return DynamicCache() if kind == "dynamic" else StaticCache(256)


def _turns(model, kind, lookup):
    with Conversation(model, cache=_cache(kind)) as conv:
        turns = [conv.say(ids, max_new_tokens=NEW, lookup=lookup) for ids in TURNS]
        assert conv.cache.seq_length == len(conv.ids) - 1  # the rejected drafts are cropped
        return turns


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize(
    "name", ["toy", "kv-heavy", "sliding-toy", "gemma2-toy", "mistral-toy", "hybrid-toy", "conv-toy"]
)
def test_prompt_lookup_gives_the_greedy_tokens_of_one_token_a_step(name, kind):
    model = kvlab.load(name)
    plain = _turns(model, kind, None)
    fast = _turns(model, kind, PromptLookup(k=4, ngram=2))
    for a, b in zip(plain, fast):
        assert a.token_ids == b.token_ids and a.prompt_ids == b.prompt_ids
    if model.info.layout.states:
        assert all(t.lookup == NO_CROP and t.drafted == 0 for t in fast)
        assert all(r.phase != "verify" for t in fast for r in t.records)
        return
    assert sum(t.drafted for t in fast) > 0 and all(t.lookup == "" for t in fast)
    for t in fast:  # each step's tokens: a prefill's or decode step's one, a verify step's accepted drafts and one
        made = sum(r.accepted + (r.token >= 0) if r.phase == "verify" else 1 for r in t.records)
        undecided = sum(r.phase == "verify" and r.token < 0 for r in t.records)  # near-ties left to the next step
        assert made == len(t.token_ids) and len(t.records) <= len(t.token_ids) + undecided
        assert all(0 <= r.accepted <= r.drafted <= 4 for r in t.records)
        assert t.accepted == sum(r.accepted for r in t.records) and t.drafted == sum(r.drafted for r in t.records)


def test_prompt_lookup_accepts_drafts_on_repetitive_text_and_takes_fewer_steps(kv_heavy):
    """kv-heavy repeats itself (its greedy tokens cycle), so most drafts are right."""
    with Conversation(kv_heavy, cache=StaticCache(256)) as conv:
        turn = conv.say([957, 657, 784, 654, 784, 286, 818], max_new_tokens=40, lookup=PromptLookup(k=4, ngram=2))
    assert turn.accepted > 0 and len(turn.records) < len(turn.token_ids)


def test_drafts_never_run_past_max_new_tokens_or_the_cache(toy):
    """A StaticCache of exactly the positions the turn needs: the last steps draft fewer tokens."""
    needed = len(REPEATING) + NEW - 1
    with Conversation(toy, cache=StaticCache(needed)) as conv, Conversation(toy, cache=StaticCache(needed)) as plain:
        fast = conv.say(REPEATING, max_new_tokens=NEW, lookup=PromptLookup(k=8, ngram=3))
        assert fast.token_ids == plain.say(REPEATING, max_new_tokens=NEW).token_ids
        assert len(fast.token_ids) == NEW or fast.stop_reason == "eos"


def test_propose_takes_what_followed_the_latest_earlier_match():
    ids = [1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 5, 1, 2, 3]
    assert propose(ids, 2, 3) == [7, 6]  # the latest earlier [1, 2, 3] was followed by 7, 6
    assert propose(ids, 5, 3, stop={5}) == [7, 6]  # cut before an end of turn
    assert propose([4, 5, 6, 5], 3, 2) == [6, 5]  # no [6, 5] before: the last token alone matches
    assert propose([1, 2, 3], 4, 2) == [] and propose([1], 4, 2) == [] and propose(ids, 0, 3) == []


def test_verify_keeps_the_drafts_the_argmax_confirms_and_its_next_choice():
    import numpy as np

    logits = np.zeros((4, 10))
    logits[[0, 1, 2, 3], [4, 5, 9, 1]] = 1.0  # the model would say 4, 5, 9, then 1
    assert verify(logits, [4, 5, 6]) == (2, 9)
    assert verify(logits, [4, 5, 9]) == (3, 1)
    assert verify(logits, [3, 5, 9]) == (0, 4)


def test_a_row_within_the_margin_leaves_its_position_undecided():
    """A near-tie in a multi-token row may round the other way in a one-token step (measured on an NVIDIA H200 in
    fp16: kvlab.core.lookup), so verification stops before it: the drafts before it are accepted, its token is -1."""
    import numpy as np

    logits = np.zeros((4, 10), np.float16)
    logits[[0, 1, 2, 3], [4, 5, 9, 1]] = 1.0
    logits[2, 6] = 0.95  # row 2's choice (9) leads draft 6 by 0.05
    assert verify(logits, [4, 5, 6], margin=0.25) == (2, -1)
    assert verify(logits, [4, 5, 6], margin=0.01) == (2, 9)
    assert verify(logits, [4, 5, 6]) == (2, 9)  # margin 0: every row decides
    logits[0, 3] = 1.0  # an exact tie in the first row: nothing is decided there
    assert verify(logits, [4, 5, 6], margin=1e-3) == (0, -1)
    assert PromptLookup().margin_for(np.float16) == 0.25 and PromptLookup().margin_for("float32") == 1e-4
    assert PromptLookup(margin=0).margin_for(np.float16) == 0.0


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), True, "0.1"])
def test_a_bad_margin_is_refused_naming_it(bad):
    with pytest.raises(kvlab.ConfigError, match="margin"):
        PromptLookup(margin=bad)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_margin_no_row_meets_gives_the_greedy_tokens_one_token_at_a_time(toy, kind):
    """Every verify step undecided: each is followed by a one-token step at the same position, and the tokens are
    plain greedy's."""
    plain = _turns(toy, kind, None)
    careful = _turns(toy, kind, PromptLookup(k=4, ngram=2, margin=1e9))
    assert [t.token_ids for t in careful] == [t.token_ids for t in plain]
    verifies = [r for t in careful for r in t.records if r.phase == "verify"]
    assert verifies and all(r.token == -1 and r.accepted == 0 for r in verifies)
    for t in careful:
        phases = [r.phase for r in t.records]
        assert all(b == "decode" for a, b in zip(phases, phases[1:]) if a == "verify")
