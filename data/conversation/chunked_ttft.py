"""A kept-cache turn fed in chunks: the time to first token of a 32-token message (33 positions fed) after a history,
with ``Conversation.say(prefill_chunk=c)`` for each chunk size c, against a from-scratch prefill of the same history.

    python3 data/conversation/chunked_ttft.py [--model phi4-kv --device webgpu --histories 1984,3936
        --chunks 0,1,2,3,4,6,8,11,16,17 --reps 3 --out OUT.json]

Chunk 0: one step (the default on a hardware adapter). The history is real text (kvlab.bench.ttft's turns,
8 reply tokens each) grown to each length; each measured message is taken back (``rewind_turn``). Rows: the median
time to first token per chunk, the median step time by the positions a step fed, the first token (equal across
chunks?), and the re-prefill's time.
"""

from __future__ import annotations

import argparse
import json
import statistics

import kvlab
from kvlab import Conversation, StaticCache, generate
from kvlab.bench.ttft import text_ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="phi4-kv")
    p.add_argument("--device", default="webgpu")
    p.add_argument("--histories", default="1984,3936")
    p.add_argument("--chunks", default="0,1,2,3,4,6,8,11,16,17")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="chunked_ttft.json")
    args = p.parse_args()
    model = kvlab.load(args.model)
    chunks = [int(c) or None for c in args.chunks.split(",")]
    histories = [int(h) for h in args.histories.split(",")]
    size = histories[-1] + 64
    probe = text_ids(model, 50, 32)
    generate(model, text_ids(model, 0, 16), device=args.device, max_new_tokens=2)  # a warm-up, not measured
    rows = []
    with Conversation(model, cache=StaticCache(size), device=args.device) as conv, StaticCache(size) as scratch:
        held = 0
        for i, h in enumerate(histories):
            conv.say(text_ids(model, i, h - 32 - 8 - held), 8, stop_on_eos=False)  # history + the message = h
            held = h - 32
            times: dict[str, list[float]] = {str(c): [] for c in chunks}
            steps: dict[int, list[float]] = {}
            firsts, prompt = {}, None
            for rep in range(args.reps + 1):  # round 0 warms each chunk's shaders: not kept
                for c in chunks if rep % 2 else chunks[::-1]:
                    turn = conv.say(probe, 1, stop_on_eos=False, prefill_chunk=c)
                    conv.rewind_turn()
                    prompt, firsts[str(c)] = turn.prompt_ids, turn.token_ids[0]
                    if rep:
                        times[str(c)].append(turn.ttft_ms())
                        for r in turn.records:
                            if r.phase == "prefill":
                                steps.setdefault(r.n_tokens, []).append(r.wall_ms)
            fresh = []
            for _ in range(2):  # as kvlab.bench.ttft does: a conversation on a second cache, all fed
                with Conversation(model, cache=scratch, device=args.device) as again:
                    fresh.append(again.say(prompt, 1, stop_on_eos=False))
            row = {
                "history_positions": len(prompt),
                "ttft_ms_by_chunk": {c: statistics.median(v) for c, v in times.items()},
                "ttft_runs_by_chunk": times,
                "step_ms_by_positions_fed": {n: statistics.median(v) for n, v in sorted(steps.items())},
                "first_token_by_chunk": firsts,
                "reprefill_ttft_ms": [g.ttft_ms() for g in fresh],
                "reprefill_first_token": fresh[0].token_ids[0],
            }
            rows.append(row)
            best = min(row["ttft_ms_by_chunk"].items(), key=lambda kv: kv[1])
            print(json.dumps({k: v for k, v in row.items() if k != "ttft_runs_by_chunk"}), flush=True)
            print(f"history {len(prompt)}: best chunk {best[0]}: {best[1]:.1f} ms", flush=True)
    from kvlab.bench.results import write_recording

    dev = kvlab.open_device(args.device)
    out = {"model": model.name, "device": str(dev.label), "rows": rows, "args": vars(args)}
    print(f"wrote {write_recording(args.out, out)}")


if __name__ == "__main__":
    main()
