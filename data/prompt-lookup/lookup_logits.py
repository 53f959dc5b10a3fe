"""Why prompt lookup's greedy tokens can differ from one token a step: the logits of each verification step's rows
against the one-token step's logits at the same position, up to and at the first token that differs.

    python3 data/prompt-lookup/lookup_logits.py [--model phi4-kv --precision fp16 --device webgpu --repeat 3 --new 96
        --k 4 --ngram 3 --out OUT.json]

Two greedy replies to the same prompt (data/prompts/long.txt, ``--repeat`` times) on one StaticCache each: one token
a step, keeping every step's logits; and prompt lookup as kvlab.ort.decode.conversation runs it (drafts from
kvlab.core.lookup.propose, one multi-token step, verify, crop), keeping every row of every step. A token of the
lookup reply was chosen from a row of a step of ``width`` tokens; while both replies agree up to it, that row and the
one-token step's logits predict the same position from the same tokens. Per such token: max |diff| over the
vocabulary, the top-2 margin of each, the token each picks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import kvlab
from kvlab import StaticCache, Stepper
from kvlab.core.lookup import propose, verify

TEXT = (Path(__file__).resolve().parents[2] / "data" / "prompts" / "long.txt").read_text()


def margin(row: np.ndarray) -> float:
    top2 = np.partition(row, -2)[-2:]
    return float(top2[1] - top2[0])


def plain(model, prompt, new, device) -> tuple[list[int], list[np.ndarray]]:
    """One token a step: the tokens and the logits [vocab] each was chosen from."""
    with StaticCache(len(prompt) + new + 8) as cache, Stepper(model, cache, device, len(prompt) + new + 8) as s:
        logits, _ = s.step(prompt)
        tokens, rows = [int(np.argmax(logits))], [logits.astype(np.float32)]
        while len(tokens) < new:
            logits, _ = s.step(tokens[-1:])
            tokens.append(int(np.argmax(logits)))
            rows.append(logits.astype(np.float32))
    return tokens, rows


def lookup(model, prompt, new, device, k, ngram) -> tuple[list[int], list[np.ndarray], list[int]]:
    """Prompt lookup: the tokens, the logits row each was chosen from, and the width of the step that gave it."""
    eos = model.info.eos_token_ids
    with StaticCache(len(prompt) + new + 8) as cache, Stepper(model, cache, device, len(prompt) + new + 8) as s:
        logits, _ = s.step(prompt)
        tokens, rows, widths = [int(np.argmax(logits))], [logits.astype(np.float32)], [len(prompt)]
        while len(tokens) < new:
            drafts = propose([*prompt, *tokens], min(k, new - len(tokens) - 1), ngram, eos)
            logits, _ = s.step([tokens[-1], *drafts], logits_out="all")
            accepted, token = verify(logits, drafts)
            tokens += [*drafts[:accepted], token]
            rows += [logits[i].astype(np.float32) for i in range(accepted + 1)]
            widths += [len(drafts) + 1] * (accepted + 1)
            cache.crop(len(prompt) + len(tokens) - 1)
    return tokens, rows, widths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="phi4-kv")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--device", default="webgpu")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--new", type=int, default=96)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--out", default="lookup_logits.json")
    args = p.parse_args()
    model = kvlab.load(args.model, precision=args.precision)
    prompt = model.encode(TEXT * args.repeat).tolist()
    lookup(model, prompt, 4, args.device, args.k, args.ngram)  # a warm-up (shaders of each width), not kept
    a, a_rows = plain(model, prompt, args.new, args.device)
    b, b_rows, widths = lookup(model, prompt, args.new, args.device, args.k, args.ngram)
    b, b_rows, widths = b[: args.new], b_rows[: args.new], widths[: args.new]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    compared = []
    for i in range(1, len(b) if first is None else first + 1):  # the prefill's token (0) is the same step in both
        x, y = a_rows[i], b_rows[i]
        compared.append(
            {
                "token": i,
                "width": widths[i],
                "max_abs_diff": float(np.abs(x - y).max()),
                "margin_one_token": margin(x),
                "margin_lookup": margin(y),
                "pick_one_token": int(np.argmax(x)),
                "pick_lookup": int(np.argmax(y)),
            }
        )
    multi = [c for c in compared if c["width"] > 1]
    one = [c for c in compared if c["width"] == 1]
    diffs = sorted(c["max_abs_diff"] for c in multi)
    margins = [margin(r) for r in a_rows[1:]]
    summary = {
        "tokens_equal": a == b,
        "first_difference": first,
        "at_first_difference": compared[-1] if first is not None else None,
        "rows_compared_multi_token": len(multi),
        "rows_compared_one_token": len(one),
        "max_abs_diff_multi_token": {"median": float(np.median(diffs)), "max": diffs[-1]} if diffs else None,
        "max_abs_diff_one_token_rows": max((c["max_abs_diff"] for c in one), default=None),
        "one_token_margins": {"median": float(np.median(margins)), "min": float(min(margins))},
        "one_token_margins_below_median_multi_diff": int(sum(m < np.median(diffs) for m in margins)) if diffs else None,
        "one_token_margins_below_max_multi_diff": int(sum(m < diffs[-1] for m in margins)) if diffs else None,
        "one_token_steps": len(margins),
    }
    print(json.dumps(summary, indent=1))
    from kvlab.bench.results import write_recording

    out = {
        "model": model.name,
        "precision": model.info.precision,
        "device": args.device,
        "adapter": kvlab.open_device(args.device).adapter.name,
        "prompt_tokens": len(prompt),
        **summary,
        "compared": compared,
        "token_ids": a,
        "lookup_token_ids": b,
        "one_token_margin_per_token": margins,
        "args": vars(args),
    }
    print(f"wrote {write_recording(args.out, out)}")


if __name__ == "__main__":
    main()
