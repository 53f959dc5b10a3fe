"""Measure a conversation that keeps its cache (``kvlab.Conversation``) against re-prefilling it every turn, and
prompt-lookup decoding against one token a step: paired, interleaved runs that print what they measure and write it,
with its environment, to data/conversation/<name>.json.

    .venv/bin/python scripts/conversation_bench.py ttft [--turns 8] [--turn-tokens 480] [--reps 2]
    .venv/bin/python scripts/conversation_bench.py lookup [--new 96] [--reps 3]
    .venv/bin/python scripts/conversation_bench.py genai [--turns 4]

ttft: per turn, the time to first token of the reused turn (its prefill step: the positions the cache lacks) and of
a from-scratch prefill of the same history (a fresh StaticCache of the same size), in alternating order; with
``--probe N``, of a message of N tokens said after each turn (then taken back).
lookup: the same greedy reply with and without PromptLookup on a StaticCache, alternating; tokens checked equal.
genai: kvlab's turn against onnxruntime-genai's append_tokens on the same turns (time to first token).

On the CPU EP. For another model or device (phi4-kv on WebGPU, genai beside it): ``kvlab chat --bench``
(kvlab.bench.conversation, results.json with the adapter and environment).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import kvlab
from kvlab import Conversation, PromptLookup, StaticCache, generate

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "conversation"
TEXT = (ROOT / "data" / "prompts" / "long.txt").read_text()


def _turn_ids(model: kvlab.Model, i: int, n: int) -> list[int]:
    """``n`` token ids of real text, different per turn (the text from another offset)."""
    ids = model.encode(TEXT).tolist()
    start = (i * 97) % len(ids)
    ids = ids[start:] + ids[:start]
    return (ids * (n // len(ids) + 1))[:n]


def ttft(args: argparse.Namespace) -> dict:
    model = kvlab.load(args.model)
    size = args.turns * (args.turn_tokens + args.probe + 2 * args.new) + 8
    rows = []
    generate(model, _turn_ids(model, 0, 64), max_new_tokens=2)  # a warm-up, not measured
    with Conversation(model, cache=StaticCache(size)) as conv:
        for i in range(args.turns):
            ids = _turn_ids(model, i, args.turn_tokens)
            turn = conv.say(ids, max_new_tokens=args.new, stop_on_eos=False)
            if args.probe:  # the turn builds the history; a short message after it is what is measured
                ids = _turn_ids(model, i + 50, args.probe)
                turn = conv.say(ids, max_new_tokens=args.new, stop_on_eos=False)
            reused, fresh = [turn.records[0].wall_ms], []
            for rep in range(args.reps):  # alternate: a fresh prefill, then the same turn again from its start
                order = ("fresh", "reuse") if rep % 2 == 0 else ("reuse", "fresh")
                for what in order:
                    if what == "fresh":
                        with StaticCache(size) as cache:
                            g = generate(model, turn.prompt_ids, cache=cache, max_new_tokens=1)
                        fresh.append(g.records[0].wall_ms)
                    else:
                        conv.rewind_turn()
                        again = conv.say(ids, max_new_tokens=args.new, stop_on_eos=False)
                        assert again.token_ids == turn.token_ids
                        reused.append(again.records[0].wall_ms)
            if args.probe:
                conv.rewind_turn()
            row = {
                "turn": i + 1,
                "history_tokens": len(turn.prompt_ids),
                "reused_positions": turn.reused,
                "prefilled_positions": turn.prefilled,
                "reuse_ttft_ms": reused,
                "reprefill_ttft_ms": fresh,
                "ratio_median": statistics.median(reused) / statistics.median(fresh),
            }
            rows.append(row)
            print(
                f"turn {row['turn']}: history {row['history_tokens']:5d} tokens, fed {turn.prefilled:4d} | "
                f"reuse TTFT {statistics.median(reused):8.1f} ms, re-prefill {statistics.median(fresh):8.1f} ms, "
                f"ratio {row['ratio_median']:.3f}",
                flush=True,
            )
    return {"model": model.name, "device": "cpu", "cache": f"static@{size}", "rows": rows}


def lookup(args: argparse.Namespace) -> dict:
    model = kvlab.load(args.model)
    prompt = model.encode(args.prompt).tolist()
    size = len(prompt) + args.new + 8
    runs: dict[str, list[float]] = {"plain": [], "lookup": []}
    stats = {}
    with Conversation(model, cache=StaticCache(size)) as conv:  # a warm-up, not measured
        conv.say(prompt, max_new_tokens=4, lookup=PromptLookup(k=args.k, ngram=args.ngram))
    for rep in range(args.reps):
        for what in ("plain", "lookup") if rep % 2 == 0 else ("lookup", "plain"):
            with Conversation(model, cache=StaticCache(size)) as conv:
                pl = PromptLookup(k=args.k, ngram=args.ngram) if what == "lookup" else None
                start = time.perf_counter()
                turn = conv.say(prompt, max_new_tokens=args.new, stop_on_eos=False, lookup=pl)
                runs[what].append((time.perf_counter() - start) * 1e3)
                stats[what] = turn
    a, b = stats["plain"], stats["lookup"]
    assert a.token_ids == b.token_ids, "prompt lookup changed the greedy tokens"
    verify = [r for r in b.records if r.phase == "verify"]
    out = {
        "model": model.name,
        "device": "cpu",
        "new_tokens": len(a.token_ids),
        "k": args.k,
        "ngram": args.ngram,
        "plain_ms": runs["plain"],
        "lookup_ms": runs["lookup"],
        "steps_plain": len(a.records),
        "steps_lookup": len(b.records),
        "verify_steps": len(verify),
        "drafted": b.drafted,
        "accepted": b.accepted,
        "accepted_per_verify_step": b.accepted / len(verify) if verify else 0.0,
        "tokens_per_step": len(b.token_ids) / len(b.records),
        "speedup_median": statistics.median(runs["plain"]) / statistics.median(runs["lookup"]),
        "verify_step_ms_median": statistics.median(r.wall_ms for r in verify) if verify else None,
        "decode_step_ms_median": statistics.median(r.wall_ms for r in a.records[1:]),
        "text": b.text,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "text"}, indent=1))
    return out


def genai(args: argparse.Namespace) -> dict:
    import onnxruntime_genai as og

    from kvlab.ort.checks.references import genai_model

    model = kvlab.load(args.model)
    og_model = genai_model(model)
    size = args.turns * (args.turn_tokens + args.new) + 8
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=size)
    gen = og.Generator(og_model, params)
    rows = []
    with Conversation(model, cache=StaticCache(size)) as conv:
        for i in range(args.turns):
            ids = _turn_ids(model, i, args.turn_tokens)
            turn = conv.say(ids, max_new_tokens=args.new, stop_on_eos=False)
            seq = [int(t) for t in gen.get_sequence(0)]
            feed = ids
            if seq:  # the reply's last token again with the turn (see tests/test_conversation_genai.py)
                gen.rewind_to(len(seq) - 1)
                feed = [seq[-1], *ids]
            start = time.perf_counter()
            gen.append_tokens(feed)
            gen.generate_next_token()
            first_ms = (time.perf_counter() - start) * 1e3
            tokens = [int(gen.get_next_tokens()[0])]
            while len(tokens) < args.new:
                gen.generate_next_token()
                tokens.append(int(gen.get_next_tokens()[0]))
            row = {
                "turn": i + 1,
                "history_tokens": len(turn.prompt_ids),
                "kvlab_ttft_ms": turn.records[0].wall_ms,
                "genai_ttft_ms": first_ms,
                "tokens_equal": tokens == turn.token_ids,
            }
            rows.append(row)
            print(row, flush=True)
    return {"model": model.name, "device": "cpu", "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("ttft", "lookup", "genai"))
    p.add_argument("--model", default="smollm2")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--turn-tokens", type=int, default=480)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--probe", type=int, default=0, help="measure a message of this many tokens after each turn")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--prompt", default="The capital of France is Paris. The capital of France is")
    p.add_argument("--name", default="")
    args = p.parse_args()
    result = {"ttft": ttft, "lookup": lookup, "genai": genai}[args.what](args)
    from kvlab.bench.results import environment

    result["environment"] = environment({"note": "not measured by this script"})
    result["args"] = vars(args)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{args.name or args.what}-{args.model}-cpu.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
