"""``kvlab chat``: a conversation that keeps its cache between turns (``kvlab.Conversation``), from ``--turn``
messages, from stdin (one message a line), or typed at a prompt; each reply is printed with the positions its turn
reused and prefilled and its time to first token. ``/back`` takes the last turn back (edit it: say it again).
``kvlab chat-bench``: reuse against re-prefill, turn by turn (``kvlab.bench.ttft``), to results.json.

A turn that fails (a turn that does not fit the cache, a bad message) is one line on stderr: a scripted
conversation stops there with exit status 2, a typed one goes on (the conversation is as before the turn).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from ..core.errors import CapacityError, ConfigError, KvlabError
from ..core.lookup import PromptLookup
from ..ort import Conversation, DynamicCache, StaticCache, load, open_device
from . import flags
from .exits import USER_ERROR, one_line, say

BACK = "/back"
DEFAULT_SIZE = 2048  # the static cache's positions where --cache is not given


def add(sub: argparse._SubParsersAction) -> None:
    """The ``chat`` subcommand."""
    p = sub.add_parser("chat", help="a conversation that keeps its cache between turns")
    flags.model(p, default="smollm2")
    flags.device(p)
    p.add_argument("--turn", action="append", help="a user message (repeat for several turns; default: stdin)")
    p.add_argument("--system", help="a system prompt")
    flags.caches(p, f"static@{DEFAULT_SIZE}", "the cache: dynamic, static or static@N")
    flags.counts(p, max_new_tokens=(64, "tokens per reply at most"))
    p.add_argument("--lookup", type=flags.positive_int, metavar="K", help="prompt-lookup decoding, K drafts a step")
    flags.json_flag(p, "one JSON object per turn on stdout")
    p.set_defaults(run=chat_command)


def add_bench(sub: argparse._SubParsersAction) -> None:
    """The ``chat-bench`` subcommand."""
    p = sub.add_parser(
        "chat-bench",
        help="a conversation's time to first token per turn: the kept cache against a re-prefill",
        description="Per turn, a message builds the history; then a short message is measured on the kept cache "
        "against a from-scratch prefill of the same history, in paired rounds (token-id turns of real text).",
    )
    flags.model(p, default="smollm2")
    flags.device(p)
    flags.counts(
        p,
        turns=(8, "turns that build the history"),
        turn_tokens=(480, "tokens of each such turn"),
        new_tokens=(8, "tokens per reply"),
        reps=(2, "paired rounds per turn"),
    )
    p.add_argument("--probe", type=int, default=32, help="tokens of the measured message (0: the turn itself)")
    p.add_argument("--genai", action="store_true", help="onnxruntime-genai's append_tokens on the same conversation")
    flags.out(p, "artifacts/chat-bench", "where results.json goes (default artifacts/chat-bench)", folder=True)
    p.set_defaults(run=chat_command)


def chat_command(args: argparse.Namespace) -> int:
    """Run ``kvlab chat`` or ``kvlab chat-bench``; returns the exit status (Ctrl-C propagates: the caller's 130)."""
    try:
        return _bench(args) if args.command == "chat-bench" else _chat(args)
    except KvlabError as exc:
        say(f"kvlab: error: {args.command}: {one_line(exc)}")
        return USER_ERROR


def _chat(args: argparse.Namespace) -> int:
    names = args.cache or flags.cache_names(f"static@{DEFAULT_SIZE}")
    if len(names) != 1:
        raise ConfigError(f"--cache names {len(names)} of them: a conversation runs one cache")
    [(kind, size)] = names
    if kind == "graph":
        raise ConfigError("--cache graph: a conversation feeds turns of any length; a captured graph has one shape")
    cache = StaticCache(size or DEFAULT_SIZE) if kind == "static" else DynamicCache()
    lookup = PromptLookup(k=args.lookup) if args.lookup is not None else None
    if not args.turn and sys.stdin is None:
        raise ConfigError("no messages: stdin is closed and no --turn was given")
    name, precision = flags.one_model(args.model, "a conversation")
    model = load(name, precision=precision)
    interactive = not args.turn and sys.stdin.isatty()
    with cache, Conversation(model, cache=cache, device=open_device(args.device), system=args.system) as conv:
        for message in _messages(args, interactive):
            if message.strip() == BACK:
                if not _back(conv, args.json) and not interactive:
                    return USER_ERROR  # a scripted /back that failed: the script's later turns would mean otherwise
                continue
            try:
                turn = conv.say(message, args.max_new_tokens, lookup=lookup)
            except KvlabError as exc:
                where = ""
                if isinstance(exc, CapacityError) and args.cache is None:  # a size the user never gave: say whose
                    where = f" ({DEFAULT_SIZE} is chat's default, --cache static@{DEFAULT_SIZE}: give --cache static@N)"
                say(f"kvlab: error: chat: turn {len(conv.turns) + 1}: {one_line(exc)}{where}")
                if interactive:
                    continue
                return USER_ERROR
            _print_turn(conv, turn, args.json)
    return 0


def _messages(args: argparse.Namespace, interactive: bool) -> Iterator[str]:
    """The user's messages: --turn, else stdin's lines (blank ones skipped), typed at a prompt on a terminal."""
    if args.turn:
        yield from args.turn
        return
    if interactive:
        print("kvlab chat: type a message (/back takes the last turn back; Ctrl-D ends)", file=sys.stderr)
    while True:
        try:
            line = input("you> ") if interactive else sys.stdin.readline(flags.MAX_TEXT_BYTES + 1)
        except EOFError:
            return
        if len(line) > flags.MAX_TEXT_BYTES:  # read no further: a line that never ends (/dev/zero)
            raise ConfigError(f"a stdin line holds more than {flags.MAX_TEXT_BYTES} characters; give shorter messages")
        if not interactive and not line:
            return
        if line.strip():
            yield line.rstrip("\r\n")  # a line ending of either kind (a Windows file: CR LF) is not the message


def _back(conv: Conversation, as_json: bool) -> bool:
    """Take the last turn back and say so; False (the error said on stderr) where there is none to take back."""
    try:
        turn = conv.rewind_turn()
    except ConfigError as exc:
        say(f"kvlab: error: chat: {BACK}: {one_line(exc)}")
        return False
    if as_json:
        print(json.dumps({"back": turn.index, "positions": len(conv.ids)}))
    else:
        print(f"[took turn {turn.index} back: the conversation has {len(conv.ids)} positions]", flush=True)
    return True


def _print_turn(conv: Conversation, turn: Any, as_json: bool) -> None:
    ttft = turn.ttft_ms()
    cap, _ = conv.capacity
    fields = {
        "turn": turn.index,
        "reused": turn.reused,
        "prefilled": turn.prefilled,
        "ttft_ms": round(ttft, 2),
        "new_tokens": len(turn.token_ids),
        "stop_reason": turn.stop_reason,
        "positions": len(conv.ids),
        "capacity": cap,
        "drafted": turn.drafted,
        "accepted": turn.accepted,
        "lookup_off": turn.lookup,  # why --lookup proposed nothing this turn ("" when it ran or was not asked)
        "text": turn.text,
    }
    if as_json:
        print(json.dumps(fields), flush=True)
        return
    lookup = f", lookup {turn.accepted}/{turn.drafted} drafts accepted" if turn.drafted else ""
    lookup += f", no prompt lookup: {turn.lookup}" if turn.lookup else ""
    print(
        f"[turn {turn.index}: reused {turn.reused}, prefilled {turn.prefilled} positions, TTFT {ttft:.1f} ms, "
        f"{len(turn.token_ids)} tokens ({turn.stop_reason or 'done'}){lookup}; {len(conv.ids)} of {cap} positions]"
    )
    print(f"assistant: {turn.text.strip()}", flush=True)


def _bench(args: argparse.Namespace) -> int:
    from ..bench import ttft
    from ..bench.results import write_recording

    if args.probe < 0:
        raise ConfigError(f"--probe {args.probe} must be 0 or a positive int")
    name, precision = flags.one_model(args.model, "a conversation")
    fields = ("device", "turns", "turn_tokens", "probe", "new_tokens", "reps", "genai")
    plan = ttft.ConversationPlan(name, precision=precision, **{f: getattr(args, f) for f in fields})
    result = ttft.run(plan, progress=lambda line: print(line, flush=True))
    path = write_recording(args.out / "results.json", result, note="not measured by kvlab chat-bench")
    print(f"wrote {path}")
    differ = [r["turn"] for r in result["rows"] if not (r["tokens_equal"] and r.get("genai_tokens_equal", True))]
    if differ:
        print(
            f"kvlab: chat-bench: the tokens differ in turns {differ} (tokens_equal, genai_tokens_equal)",
            file=sys.stderr,
        )
    return 1 if differ else 0
