"""Parity with onnxruntime-genai's continuous decoding (``Generator.append_tokens`` / ``rewind_to``) on the same
conversation: every turn's greedy tokens equal. genai 0.18 on the CPU EP gives other tokens when a turn is appended
right after ``generate_next_token`` (its own from-scratch generation over the same history agrees with kvlab, and
so does feeding the reply's last token again with the turn: ``rewind_to(len - 1)``, then ``append_tokens([last,
*turn])``), so the parity runs that way; the timings side by side: ``data/conversation/conversation_bench.py
genai``."""

from __future__ import annotations

from kvlab import Conversation, StaticCache
from kvlab.ort.checks.references import genai_greedy, genai_model

TURNS = [list(range(40, 70)), [7, 300, 301, 302, 9, 11], list(range(100, 110))]
NEW = 8


def _genai_turn(gen, ids: list[int], new: int) -> list[int]:
    """Append a turn (the previous reply's last token fed again with it) and generate its greedy reply."""
    seq = [int(t) for t in gen.get_sequence(0)]
    if seq:
        gen.rewind_to(len(seq) - 1)
        ids = [seq[-1], *ids]
    gen.append_tokens(ids)
    out: list[int] = []
    while len(out) < new and not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def test_turns_and_a_rewind_match_onnxruntime_genai(toy):
    import onnxruntime_genai as og

    og_model = genai_model(toy)
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=256)
    gen = og.Generator(og_model, params)
    with Conversation(toy, cache=StaticCache(256)) as conv:
        for ids in TURNS[:2]:
            turn = conv.say(ids, max_new_tokens=NEW)
            assert turn.token_ids == _genai_turn(gen, ids, NEW) == genai_greedy(toy, turn.prompt_ids, NEW)
        dropped = conv.rewind_turn()
        gen.rewind_to(dropped.start)
        edited = conv.say(TURNS[2], max_new_tokens=NEW)
        assert edited.token_ids == _genai_turn(gen, TURNS[2], NEW)
        assert [int(t) for t in gen.get_sequence(0)] == conv.ids
