"""A conversation's time to first token, reused against re-prefilled: ``kvlab chat-bench``.

Per turn, a message of ``turn_tokens`` real-text tokens builds the history (its reply: ``new_tokens`` greedy
tokens); then the measured message (``probe`` tokens, or the turn itself when ``probe`` is 0) is said in
alternating, paired rounds: the conversation that keeps its cache (the measured message taken back with
``rewind_turn`` and said again) against a from-scratch prefill of the same history into a second StaticCache of
the same size, allocated once (the re-prefill pays the prefill, not an allocation). With ``genai``,
onnxruntime-genai follows the same conversation (``rewind_to`` / ``append_tokens``, the reply's last token fed again
with each turn: docs/conversation.md) and its time to first token for the same message joins the row. Every row
says whether the reused turn's tokens equal the from-scratch generation's (and genai's).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from ..ort import Conversation, Model, StaticCache, generate, load, open_device
from ..ort.decode.conversation import default_prefill_chunk

TEXT = (
    "A chat that keeps its cache between turns feeds only what is new: the user's message and the last token of the "
    "reply before it. One that re-prefills feeds the whole conversation again at every turn, so over K turns its "
    "prefill work grows as K squared while the kept cache's grows as K. "
)


@dataclass
class ConversationPlan:
    """What ``run`` measures: ``turns`` turns of ``turn_tokens`` tokens, each followed by a ``probe``-token message
    (0: the turn itself is measured), ``new_tokens`` per reply, ``reps`` paired rounds per turn, and onnxruntime-genai
    beside it when ``genai``."""

    model: str = "smollm2"
    device: str = "cpu"
    turns: int = 8
    turn_tokens: int = 480
    probe: int = 32
    new_tokens: int = 8
    reps: int = 2
    genai: bool = False
    precision: str | None = None

    def size(self) -> int:
        """The StaticCache's positions: every turn, probe and reply, and a margin."""
        return self.turns * (self.turn_tokens + self.probe + self.new_tokens + 1) + self.probe + self.new_tokens + 8


def text_ids(model: Model, i: int, n: int, text: str = TEXT) -> list[int]:
    """``n`` token ids of real text, from another offset for every ``i`` (so the turns differ)."""
    ids = model.encode(text).tolist()
    start = (i * 97) % len(ids)
    ids = ids[start:] + ids[:start]
    return (ids * (n // len(ids) + 1))[:n]


class _Genai:
    """onnxruntime-genai following the same conversation (its generator ``gen``): ``say(ids, new)`` -> (tokens, time
    to first token in ms)."""

    def __init__(self, model: Model, device: str, size: int):
        import onnxruntime_genai as og

        from ..ort.checks.references import genai_model

        self.model = genai_model(model, device)
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=size)
        self.gen = og.Generator(self.model, params)

    def say(self, ids: list[int], new: int) -> tuple[list[int], float]:
        seq = [int(t) for t in self.gen.get_sequence(0)]
        if seq:  # the reply's last token again with the turn (docs/conversation.md says why)
            self.gen.rewind_to(len(seq) - 1)
            ids = [seq[-1], *ids]
        start = time.perf_counter()
        self.gen.append_tokens(ids)
        self.gen.generate_next_token()
        first_ms = (time.perf_counter() - start) * 1e3
        tokens = [int(self.gen.get_next_tokens()[0])]
        while len(tokens) < new:
            self.gen.generate_next_token()
            tokens.append(int(self.gen.get_next_tokens()[0]))
        return tokens, first_ms


def run(plan: ConversationPlan, progress: Any = print) -> dict[str, Any]:
    """The plan's rows (one per turn) and what they were measured with; ``progress`` gets a line per turn."""
    model = load(plan.model, precision=plan.precision)
    device, size = open_device(plan.device), plan.size()
    chunk = default_prefill_chunk(device)
    generate(model, text_ids(model, 0, 16), device=device, max_new_tokens=2)  # a warm-up, not measured
    peer = _Genai(model, plan.device, size) if plan.genai else None
    rows = []
    with (
        StaticCache(size) as kept,
        Conversation(model, cache=kept, device=device) as conv,
        StaticCache(size) as scratch,
    ):
        for i in range(plan.turns):
            built = conv.say(
                text_ids(model, i, plan.turn_tokens), plan.new_tokens, stop_on_eos=False, prefill_chunk=chunk
            )
            if peer is not None:
                peer.say(text_ids(model, i, plan.turn_tokens), plan.new_tokens)
            rows.append(_turn_row(plan, model, conv, scratch, peer, i, built, chunk))
            progress(_line(rows[-1]))
    return {
        "model": model.name,
        "device": str(device.label),
        "cache": f"static@{size}",
        "plan": vars(plan),
        "rows": rows,
    }


def _turn_row(
    plan: ConversationPlan,
    model: Model,
    conv: Conversation,
    scratch: StaticCache,
    peer: _Genai | None,
    i: int,
    built: Any,
    chunk: int | None,
) -> dict[str, Any]:
    """One turn's paired rounds: reused (rewind_turn, say again) and re-prefilled, alternating; genai once."""
    ids = text_ids(model, i + 50, plan.probe) if plan.probe else None
    say = {"max_new_tokens": plan.new_tokens, "stop_on_eos": False, "prefill_chunk": chunk}
    turn = conv.say(ids, **say) if ids else built
    ids = ids or built.prompt_ids[built.start :]
    reused, fresh, equal = [turn.ttft_ms()], [], True
    for rep in range(plan.reps):
        for what in ("fresh", "reuse") if rep % 2 == 0 else ("reuse", "fresh"):
            if what == "fresh":
                with Conversation(model, cache=scratch, device=conv.device) as again:  # the same history, all fed
                    g = again.say(turn.prompt_ids, **say)
                fresh.append(g.ttft_ms())
                equal = equal and g.token_ids == turn.token_ids
            else:
                conv.rewind_turn()
                again = conv.say(ids, **say)
                equal = equal and again.token_ids == turn.token_ids
                reused.append(again.ttft_ms())
    row = {
        "model": model.name,
        "device": conv.device.label.name,
        "adapter": str(conv.device.label.adapter),
        "adapter_kind": conv.device.label.adapter.kind,
        "runtime": conv.device.label.runtime,
        "dtype": model.info.dtype_name,
        "cache": str(conv.cache.spec),
        "turn": i + 1,
        "history_tokens": len(turn.prompt_ids),
        "message_tokens": len(ids),
        "reused_positions": turn.reused,
        "prefilled_positions": turn.prefilled,
        "reuse_ttft_ms": statistics.median(reused),
        "reuse_ttft_runs": reused,
        "reprefill_ttft_ms": statistics.median(fresh) if fresh else float("nan"),
        "reprefill_ttft_runs": fresh,
        "ratio": statistics.median(reused) / statistics.median(fresh) if fresh else float("nan"),
        "tokens_equal": equal,
    }
    if peer is not None:
        before = len(peer.gen.get_sequence(0))
        tokens, first_ms = peer.say(list(ids), plan.new_tokens)
        row.update({"genai_ttft_ms": first_ms, "genai_tokens_equal": tokens == turn.token_ids})
        if plan.probe:
            peer.gen.rewind_to(before)  # the measured message taken back
    if plan.probe:
        conv.rewind_turn()
    return row


def _line(row: dict[str, Any]) -> str:
    genai = f", genai append_tokens {row['genai_ttft_ms']:8.1f} ms" if "genai_ttft_ms" in row else ""
    return (
        f"turn {row['turn']}: history {row['history_tokens']:5d} tokens, fed {row['prefilled_positions']:4d} | "
        f"reuse TTFT {row['reuse_ttft_ms']:8.1f} ms, re-prefill {row['reprefill_ttft_ms']:8.1f} ms "
        f"(x{row['ratio']:.3f}){genai} | tokens equal: {row['tokens_equal']}"
    )
