"""Measure a conversation that keeps its cache (``kvlab.Conversation``) against re-prefilling it every turn, and
prompt-lookup decoding against one token a step: paired, interleaved runs that print what they measure and write it,
with its environment, to data/conversation/<name>.json (``lookup``: data/prompt-lookup/<name>.json).

    .venv/bin/python data/conversation/conversation_bench.py ttft [--turns 8] [--turn-tokens 480] [--reps 2]
    .venv/bin/python data/conversation/conversation_bench.py lookup [--new 96] [--reps 3] [--device webgpu
        --model phi4-kv --precision fp16 --prompt-file data/prompts/long.txt --repeat 3 --out-dir DIR --name NAME]
    .venv/bin/python data/conversation/conversation_bench.py genai [--turns 4]
    .venv/bin/python data/conversation/conversation_bench.py steps [--device webgpu --model phi4-kv --contexts 256,4096]

ttft: per turn, the time to first token of the reused turn (its prefill step: the positions the cache lacks) and of
a from-scratch prefill of the same history (a fresh StaticCache of the same size), in alternating order; with
``--probe N``, of a message of N tokens said after each turn (then taken back).
lookup: the same greedy reply with and without PromptLookup on a StaticCache, alternating; tokens checked equal; the
drafts accepted at every step, and the decode steps' wall time by the tokens they fed (one, or the last token and
its drafts), so that a multi-token step's cost stands beside a one-token step's. On ``--device`` (default the CPU EP).
genai: kvlab's turn against onnxruntime-genai's append_tokens on the same turns (time to first token).
steps: a step's wall time by the tokens it feeds (``--widths``) at each of ``--contexts`` (a StaticCache).

ttft and genai on the CPU EP. For another model or device (phi4-kv on WebGPU, genai beside it): ``kvlab chat --bench``
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

ROOT = Path(__file__).resolve().parents[2]
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
    model = kvlab.load(args.model, precision=args.precision)
    text = Path(args.prompt_file).read_text() * args.repeat if args.prompt_file else args.prompt * args.repeat
    prompt = model.encode(text).tolist()
    size = len(prompt) + args.new + 8
    runs: dict[str, list[float]] = {"plain": [], "lookup": []}
    decode: dict[str, list[float]] = {"plain": [], "lookup": []}  # the same runs without their prefill step
    stats = {}
    with Conversation(model, cache=StaticCache(size), device=args.device) as conv:  # a warm-up, not measured
        conv.say(prompt, max_new_tokens=4, lookup=PromptLookup(k=args.k, ngram=args.ngram))
    for rep in range(args.reps):
        for what in ("plain", "lookup") if rep % 2 == 0 else ("lookup", "plain"):
            with Conversation(model, cache=StaticCache(size), device=args.device) as conv:
                pl = PromptLookup(k=args.k, ngram=args.ngram) if what == "lookup" else None
                start = time.perf_counter()
                turn = conv.say(prompt, max_new_tokens=args.new, stop_on_eos=False, lookup=pl)
                runs[what].append((time.perf_counter() - start) * 1e3)
                decode[what].append(sum(r.wall_ms for r in turn.records[1:]))
                stats[what] = turn
    a, b = stats["plain"], stats["lookup"]
    if a.token_ids != b.token_ids:  # recorded, not raised: where a package's multi-token steps are wrong, it says so
        print("prompt lookup changed the greedy tokens", flush=True)
    verify = [r for r in b.records if r.phase == "verify"]
    by_width: dict[int, list[float]] = {}  # decode steps of the last lookup run by tokens fed: their wall time
    for r in b.records[1:]:
        by_width.setdefault(r.n_tokens, []).append(r.wall_ms)
    out = {
        "model": model.name,
        "precision": model.info.precision,
        "device": args.device,
        "adapter": kvlab.open_device(args.device).adapter.name,
        "prompt_tokens": len(prompt),
        "prompt": args.prompt_file or args.prompt,
        "repeat": args.repeat,
        "new_tokens": len(a.token_ids),
        "k": args.k,
        "ngram": args.ngram,
        "plain_ms": runs["plain"],
        "lookup_ms": runs["lookup"],
        "plain_decode_ms": decode["plain"],
        "lookup_decode_ms": decode["lookup"],
        "steps_plain": len(a.records),
        "steps_lookup": len(b.records),
        "verify_steps": len(verify),
        "drafted": b.drafted,
        "accepted": b.accepted,
        "accepted_per_verify_step": b.accepted / len(verify) if verify else 0.0,
        "accepted_per_step": [r.accepted for r in b.records[1:]],
        "drafted_per_step": [r.drafted for r in b.records[1:]],
        "tokens_per_step": len(b.token_ids) / len(b.records),
        "speedup_median": statistics.median(runs["plain"]) / statistics.median(runs["lookup"]),
        "decode_speedup_median": statistics.median(decode["plain"]) / statistics.median(decode["lookup"]),
        "verify_step_ms_median": statistics.median(r.wall_ms for r in verify) if verify else None,
        "decode_step_ms_median": statistics.median(r.wall_ms for r in a.records[1:]),
        "step_ms_by_tokens_fed": {n: statistics.median(v) for n, v in sorted(by_width.items())},
        "steps_by_tokens_fed": {n: len(v) for n, v in sorted(by_width.items())},
        "tokens_equal": a.token_ids == b.token_ids,
        "first_difference": next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None),
        "token_ids": a.token_ids,
        "lookup_token_ids": b.token_ids,
        "text": b.text,
    }
    print(json.dumps({k: v for k, v in out.items() if k not in ("text", "token_ids")}, indent=1))
    return out


def steps(args: argparse.Namespace) -> dict:
    """A step's wall time by the tokens it feeds (1, and the widths a lookup verify step has), at each context:
    after a prefill of real text into a StaticCache, steps of every width in turn, ``--reps`` times."""
    from kvlab import Stepper

    model = kvlab.load(args.model, precision=args.precision)
    widths = [int(w) for w in args.widths.split(",")]
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        ids = _turn_ids(model, 0, context + (args.reps + 1) * sum(widths))
        size = len(ids) + 1
        times: dict[int, list[float]] = {w: [] for w in widths}
        with StaticCache(size) as cache, Stepper(model, cache, args.device, size) as s:
            s.step(ids[:context])
            at = context
            for rep in range(args.reps + 1):  # the first round warms each width's shaders: not kept
                for w in widths:
                    _, rec = s.step(ids[at : at + w])
                    at += w
                    if rep:
                        times[w].append(rec.wall_ms)
        row = {"context": context, **{f"step_ms_{w}": statistics.median(times[w]) for w in widths}}
        row["ratio_to_one_token"] = {w: statistics.median(times[w]) / statistics.median(times[1]) for w in widths}
        rows.append(row)
        print(row, flush=True)
    return {
        "model": model.name,
        "precision": model.info.precision,
        "device": args.device,
        "widths": widths,
        "rows": rows,
    }


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
    p.add_argument("what", choices=("ttft", "lookup", "genai", "steps"))
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
    p.add_argument("--device", default="cpu", help="lookup: cpu or webgpu")
    p.add_argument("--precision", default=None, help="lookup: the model's precision (fp32, fp16, int4)")
    p.add_argument("--prompt-file", default="", help="lookup: the prompt's text from this file (instead of --prompt)")
    p.add_argument("--repeat", type=int, default=1, help="lookup: the prompt's text this many times over")
    p.add_argument("--out-dir", default=None, help="where the JSON goes (default: the question's folder in data/)")
    p.add_argument("--contexts", default="256,1024,4096,16384", help="steps: the contexts")
    p.add_argument("--widths", default="1,2,5", help="steps: tokens fed per step")
    args = p.parse_args()
    result = {"ttft": ttft, "lookup": lookup, "genai": genai, "steps": steps}[args.what](args)
    from kvlab.bench.results import write_recording

    result["args"] = vars(args)
    out = args.out_dir or (ROOT / "data" / ("prompt-lookup" if args.what == "lookup" else "conversation"))
    path = Path(out) / f"{args.name or args.what}-{args.model}-{result.get('device', 'cpu')}.json"
    print(f"wrote {write_recording(path, result)}")


if __name__ == "__main__":
    main()
