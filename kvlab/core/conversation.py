"""A conversation, backend-neutral: the token ids it has seen (every turn's input and reply, in order), the turns that
made them, and what the next turn feeds: only the positions the cache does not hold yet.

After a turn the cache holds every id but the reply's last token (``positions_needed``), so the next turn feeds
that token and then its own input. A rewind keeps the first ``n`` ids; the cache keeps what it can of them. Text
turns are rendered with the model's chat template against the messages so far (``chat_delta``); token ids are
taken as they are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import CapacityError, ModelError, check_int
from .generation import Generation, positions_needed

REPLY = "\x00kvlab: the reply\x00"  # where a reply's content goes when the template is asked what follows it

Render = Callable[[Sequence[dict[str, str]], bool], str]


@dataclass
class Turn(Generation):
    """One turn of a conversation: a ``Generation`` whose ``prompt_ids`` are the whole conversation before the reply
    (what a from-scratch ``generate`` would be given), and what the turn did with the cache."""

    index: int = 0  # 1, 2, ...
    start: int = 0  # the history's length before the turn: rewinding there drops it (``rewind_turn``)
    message: str | None = None  # the user's text, for a text turn (None: token ids)
    reused: int = 0  # positions the cache held already and kept
    prefilled: int = 0  # positions the turn's prefill fed (the history the cache lacked, then the turn's input)
    drafted: int = 0  # tokens prompt lookup proposed (0 without lookup)
    accepted: int = 0  # of those, tokens the model confirmed
    lookup: str = ""  # why prompt lookup proposed nothing, when it was asked for and could not run ("" otherwise)

    @property
    def reply_start(self) -> int:
        """The position of the reply's first token in the history."""
        return len(self.prompt_ids)


def chat_delta(render: Render, messages: Sequence[dict[str, str]], text: str, closed: str = "") -> str:
    """The text the chat template ``render(messages, add_generation_prompt)`` puts after the conversation so far for a
    new user message ``text``: the last reply's closing, the user's turn and the generation prompt (everything when no
    reply yet). ``closed``: the reply's last token's text when it ends a turn (the history holds it already). ModelError
    for a template that does not place a reply's content as it is."""
    user = {"role": "user", "content": text}
    if not messages or messages[-1]["role"] != "assistant":
        return render([*messages, user], True)
    full = render([*messages[:-1], {"role": "assistant", "content": REPLY}, user], True)
    if full.count(REPLY) != 1:
        raise ModelError(
            "the model's chat template does not render a reply's content as it is (a template that edits past "
            "replies, e.g. one that strips their reasoning); give the turn as token ids instead"
        )
    after = full.split(REPLY)[1]
    return after[len(closed) :] if closed and after.startswith(closed) else after


@dataclass
class History:
    """What a conversation has seen: ``ids`` (every position, in order), its ``turns`` and its chat ``messages``
    (the system prompt, then a user message and its reply per turn)."""

    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)

    def add(self, turn: Turn, user: str) -> None:
        """A finished turn: its input and reply join the history."""
        self.ids = [*turn.prompt_ids, *turn.token_ids]
        self.turns.append(turn)
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": turn.text}]

    def rewind(self, n: Any, decode: Callable[[list[int]], str]) -> None:
        """Keep the first ``n`` ids (0 <= n <= len(ids)): the turns that start at ``n`` or later are dropped, as is
        one cut inside its input; a turn cut inside its reply keeps the reply's first tokens (``decode`` gives their
        text). ConfigError for another ``n``; nothing changes then."""
        n = check_int(n, "n", 0, len(self.ids), subject=f"rewind({n!r}): n", note=" (the positions of the history)")
        system = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        kept = [t for t in self.turns if t.reply_start <= n]
        if kept and kept[-1].reply_start + len(kept[-1].token_ids) > n:  # cut inside its reply
            tokens = kept[-1].token_ids[: n - kept[-1].reply_start]
            kept[-1] = replace(kept[-1], token_ids=tokens, text=decode(tokens), stop_reason="rewound")
        self.ids, self.turns = self.ids[:n], kept
        self.messages = self.messages[: system + 2 * len(kept)]
        if kept:
            self.messages[-1] = {"role": "assistant", "content": kept[-1].text}


@dataclass(frozen=True)
class TurnPlan:
    """What a turn does, known before any work: the positions the cache keeps (``reused``), the ids it feeds first
    (``feed``: the history the cache lacks, then the turn's input) and the positions it needs, held ones included."""

    reused: int
    feed: list[int]
    positions: int


def plan_turn(
    history: History, held: int, new_ids: Sequence[int], new_tokens: int, capacity: int, what: str
) -> TurnPlan:
    """The next turn's plan; CapacityError, naming the positions used and left, when it does not fit ``capacity``
    (``what`` names the limit, e.g. "max_cache_len"): nothing has changed then, and the conversation goes on."""
    used = len(history.ids)
    needed = positions_needed(used + len(new_ids), new_tokens)
    if needed > capacity:
        index = len(history.turns) + 1
        if used < capacity:
            state = f"the conversation uses {used} of {capacity} positions ({what}), {capacity - used} are left"
        else:  # a reply's last token is in the history, and is fed (takes its position) with the next turn
            state = (
                f"the conversation holds {used} tokens and {what} allows {capacity} positions, so none is left (a "
                "reply's last token takes its position with the next turn)"
            )
        raise CapacityError(
            f"turn {index} does not fit: {state}, and this turn needs {len(new_ids)} for its input and up to "
            f"{new_tokens - 1} for its reply ({needed} in all). Nothing was run and the conversation is as it was: "
            "rewind(n) to free positions, or send a shorter message or fewer max_new_tokens"
        )
    return TurnPlan(held, [*history.ids[held:], *new_ids], needed)
