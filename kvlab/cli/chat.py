"""``kvlab chat``: a conversation that keeps its cache between turns (``kvlab.Conversation``), from ``--turn``
messages, from stdin (one message a line), or typed at a prompt; each reply is printed with the positions its turn
reused and prefilled and its time to first token. ``/back`` takes the last turn back (edit it: say it again).
``kvlab chat --bench``: reuse against re-prefill, turn by turn (``kvlab.bench.conversation``), to results.json.

A turn that fails (a turn that does not fit the cache, a bad message) is one line on stderr: a scripted
conversation stops there with exit status 2, a typed one goes on (the conversation is as before the turn).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, KvlabError
from ..core.lookup import PromptLookup
from ..ort import Conversation, DynamicCache, StaticCache, load, open_device
from ..presets import BUILTIN_NAMES, PRECISIONS
from .exits import USER_ERROR, one_line, say
from .types import path_arg

BACK = "/back"


def add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="a conversation that keeps its cache between turns (--bench: reuse vs re-prefill)")
    p.add_argument("--model", default="smollm2", help=f"built-in name ({', '.join(BUILTIN_NAMES)}) or a directory")
    p.add_argument("--precision", choices=PRECISIONS, help="precision of a built-in model (default fp32)")
    p.add_argument("--device", default="cpu", choices=("cpu", "webgpu"))
    p.add_argument("--turn", action="append", help="a user message (repeat for several turns; default: stdin)")
    p.add_argument("--system", help="a system prompt")
    p.add_argument("--cache", choices=("static", "dynamic"), default="static")
    p.add_argument("--max-cache-len", type=int, default=2048, help="the static cache's positions (default 2048)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per reply at most")
    p.add_argument("--lookup", type=int, metavar="K", help="prompt-lookup decoding with up to K drafts a step")
    p.add_argument("--json", action="store_true", help="one JSON object per turn on stdout")
    b = p.add_argument_group("--bench: time to first token per turn, reused against re-prefilled")
    b.add_argument("--bench", action="store_true", help="measure instead of chatting (token-id turns of real text)")
    b.add_argument("--turns", type=int, default=8)
    b.add_argument("--turn-tokens", type=int, default=480, help="tokens of each turn that builds the history")
    b.add_argument("--probe", type=int, default=32, help="tokens of the message measured after each turn (0: the turn)")
    b.add_argument("--new-tokens", type=int, default=8, help="tokens per reply")
    b.add_argument("--reps", type=int, default=2, help="paired rounds per turn")
    b.add_argument("--genai", action="store_true", help="onnxruntime-genai's append_tokens on the same conversation")
    b.add_argument("--out", type=path_arg, default=Path("artifacts/chat-bench"), help="where results.json goes")


def chat_command(args: argparse.Namespace) -> int:
    """Run ``kvlab chat``; returns its exit status (Ctrl-C propagates: the caller's 130)."""
    try:
        return _bench(args) if args.bench else _chat(args)
    except KvlabError as exc:
        say(f"kvlab: error: chat: {one_line(exc)}")
        return USER_ERROR


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(f"{flag} {value} must be a positive int")
    return value


def _chat(args: argparse.Namespace) -> int:
    _positive(args.max_new_tokens, "--max-new-tokens")
    cache = StaticCache(_positive(args.max_cache_len, "--max-cache-len")) if args.cache == "static" else DynamicCache()
    lookup = PromptLookup(k=args.lookup) if args.lookup is not None else None
    model = load(args.model, precision=args.precision)
    interactive = not args.turn and sys.stdin.isatty()
    with cache, Conversation(model, cache=cache, device=open_device(args.device), system=args.system) as conv:
        for message in _messages(args, interactive):
            if message.strip() == BACK:
                _back(conv, args.json)
                continue
            try:
                turn = conv.say(message, args.max_new_tokens, lookup=lookup)
            except KvlabError as exc:
                say(f"kvlab: error: chat: turn {len(conv.turns) + 1}: {one_line(exc)}")
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
            line = input("you> ") if interactive else sys.stdin.readline()
        except EOFError:
            return
        if not interactive and not line:
            return
        if line.strip():
            yield line.rstrip("\n")


def _back(conv: Conversation, as_json: bool) -> None:
    try:
        turn = conv.rewind_turn()
    except ConfigError as exc:
        say(f"kvlab: error: chat: {BACK}: {one_line(exc)}")
        return
    if as_json:
        print(json.dumps({"back": turn.index, "positions": len(conv.ids)}))
    else:
        print(f"[took turn {turn.index} back: the conversation has {len(conv.ids)} positions]", flush=True)


def _print_turn(conv: Conversation, turn: Any, as_json: bool) -> None:
    ttft = sum(r.wall_ms for r in turn.records if r.phase == "prefill")
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
        "text": turn.text,
    }
    if as_json:
        print(json.dumps(fields), flush=True)
        return
    lookup = f", lookup {turn.accepted}/{turn.drafted} drafts accepted" if turn.drafted else ""
    print(
        f"[turn {turn.index}: reused {turn.reused}, prefilled {turn.prefilled} positions, TTFT {ttft:.1f} ms, "
        f"{len(turn.token_ids)} tokens ({turn.stop_reason or 'done'}){lookup}; {len(conv.ids)} of {cap} positions]"
    )
    print(f"assistant: {turn.text.strip()}", flush=True)


def _bench(args: argparse.Namespace) -> int:
    from ..bench import conversation

    for flag in ("turns", "turn_tokens", "new_tokens", "reps"):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    if args.probe < 0:
        raise ConfigError(f"--probe {args.probe} must be 0 or a positive int")
    plan = conversation.ConversationPlan(
        model=args.model,
        device=args.device,
        turns=args.turns,
        turn_tokens=args.turn_tokens,
        probe=args.probe,
        new_tokens=args.new_tokens,
        reps=args.reps,
        genai=args.genai,
        precision=args.precision,
    )
    result = conversation.run(plan, progress=lambda line: print(line, flush=True))
    path = conversation.write(result, args.out)
    print(f"wrote {path}")
    differ = [r["turn"] for r in result["rows"] if not (r["tokens_equal"] and r.get("genai_tokens_equal", True))]
    if differ:
        print(
            f"kvlab: chat --bench: the tokens differ in turns {differ} (tokens_equal, genai_tokens_equal)",
            file=sys.stderr,
        )
    return 1 if differ else 0
