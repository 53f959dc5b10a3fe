"""What quantized KV costs in quality, measured on real text with real weights: SmolLM2-135M-Instruct on PyTorch
(CPU), one row per KV precision (kvlab.pytorch.quantized), each against the full-precision KV run.

- teacher-forced over ``--tokens`` tokens of a real text, fed in chunks of ``--chunk`` through each cache in
  lockstep (so every chunk attends to the quantized past of the chunks before it): top-1 agreement with the
  full-precision run, mean (and max) KL(full || quantized) of the next-token distributions, perplexity;
- greedy generation from a long prompt (an excerpt of the same text and a question): the first generated token
  that differs from the full-precision run's;
- ``kv_bytes_per_token``: the bytes the cache holds after the text (every tensor: packed integers, scales, zero
  points, the unquantized residual window) over the tokens it holds; ``predicted_bytes_per_token`` beside it.

The text: "Special method names" of the Python Language Reference, as every CPython ships it in
``pydoc_data.topics`` (no download, nothing committed; its sha256 and the interpreter version go into the rows).

    python data/kv-quality/kv_quality.py --out data/kv-quality/

(Was ``python -m kvlab.bench.kv_quality``.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.core.errors import ConfigError, check_int
from kvlab.pytorch.counters import held_bytes
from kvlab.pytorch.quantized import KV_PRECISIONS, QuantizedKV, make_quantized

TEXT_SOURCE = "CPython pydoc_data.topics['specialnames'] (the Python Language Reference, 'Special method names')"
DEFAULT_PRECISIONS = ("int8", "int4", "int2", "fp8")
QUESTION = "\n\nIn one sentence, what is the text above about?"
ROW_FIELDS = (
    "kv_precision",
    "kv_bytes_per_token",
    "predicted_bytes_per_token",
    "top1_agreement",
    "kl_mean",
    "kl_max",
    "perplexity",
    "first_divergent_token",
)


def real_text() -> str:
    """The text the table is measured on (``TEXT_SOURCE``), as this interpreter ships it."""
    from pydoc_data.topics import topics

    return topics["specialnames"]


def predicted_bytes_per_token(config: Any, setting: QuantizedKV | None, itemsize: int = 4) -> float:
    """KV bytes per token the format implies (no residual window): keys and values of every layer, with one
    scale and one zero point (float32) per group for the integer backends."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    values = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    if setting is None:
        return float(values * itemsize)
    if setting.bits is None:  # fp8: one byte a value, one scale per tensor
        return float(values)
    return values * (setting.bits / 8 + 2 * 4 / setting.group_size)


def _log_softmax(logits: Any) -> np.ndarray:
    x = logits.float().numpy()
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class Scorer:
    """Running sums of one precision's figures against the reference."""

    def __init__(self) -> None:
        self.agree = self.n = 0
        self.kl_sum = self.kl_max = self.nll = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray, targets: np.ndarray) -> None:
        """Add one chunk: the reference's and this precision's log-probabilities [positions, vocab] and the tokens
        that came next."""
        kl = (np.exp(ref) * (ref - got)).sum(-1)
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        self.nll -= float(got[np.arange(len(targets)), targets].sum())
        self.n += len(targets)

    def figures(self) -> dict[str, float]:
        """Top-1 agreement, mean and max KL, and perplexity over every position added."""
        return {
            "top1_agreement": self.agree / self.n,
            "kl_mean": self.kl_sum / self.n,
            "kl_max": self.kl_max,
            "perplexity": float(np.exp(self.nll / self.n)),
        }


def teacher_forced(model: Any, ids: list[int], settings: dict[str, QuantizedKV | None], chunk: int) -> dict:
    """Every setting's cache fed the same chunks of ``ids`` in lockstep; figures per setting (the reference,
    key "full", scored against itself too: its perplexity is the baseline)."""
    import torch
    from transformers import DynamicCache

    from kvlab.pytorch.models import cache_kwarg

    kw = cache_kwarg(model.hf)
    caches = {
        name: DynamicCache(config=model.hf.config) if s is None else make_quantized(model, s)
        for name, s in settings.items()
    }
    scores = {name: Scorer() for name in settings}
    seconds = dict.fromkeys(settings, 0.0)
    tokens = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, chunk):
            feed = tokens[:, start : min(start + chunk, len(ids) - 1)]
            targets = tokens[0, start + 1 : start + 1 + feed.shape[1]].numpy()
            logp = {}
            for name, cache in caches.items():
                t0 = time.perf_counter()
                out = model.hf(input_ids=feed, use_cache=True, **{kw: cache})
                seconds[name] += time.perf_counter() - t0
                logp[name] = _log_softmax(out.logits[0])
            for name in caches:
                scores[name].add(logp["full"], logp[name], targets)
    n_held = len(ids) - 1
    return {
        name: {**scores[name].figures(), "kv_bytes_per_token": held_bytes(c) / n_held, "forward_s": seconds[name]}
        for name, c in caches.items()
    }


def greedy(model: Any, prompt: list[dict], settings: dict[str, QuantizedKV | None], new_tokens: int) -> dict:
    """Greedy tokens per setting through kvlab.pytorch.generate; the first index where they leave the reference's
    (None: identical)."""
    from kvlab.pytorch.generate import generate

    runs = {
        name: generate(
            model, prompt, chat=True, max_new_tokens=new_tokens, stop_on_eos=False, cache="dynamic" if s is None else s
        )
        for name, s in settings.items()
    }
    ref = runs["full"].token_ids
    out = {}
    for name, g in runs.items():
        diff = next((i for i, (a, b) in enumerate(zip(ref, g.token_ids)) if a != b), None)
        out[name] = {"first_divergent_token": diff, "greedy_text": g.text, "greedy_tokens": list(g.token_ids)}
    return out


def environment_row() -> dict[str, Any]:
    """kvlab's environment record plus the packages this benchmark runs on."""
    from importlib.metadata import PackageNotFoundError, version

    from kvlab.bench.results import environment

    env = environment({})
    for pkg in ("torch", "transformers", "optimum-quanto", "hqq"):
        try:
            env[f"{pkg}_version"] = version(pkg)
        except PackageNotFoundError:
            env[f"{pkg}_version"] = None
    env["python"] = sys.version.split()[0]
    return env


def run(
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS,
    n_tokens: int = 4096,
    chunk: int = 512,
    new_tokens: int = 24,
    prompt_tokens: int = 300,
) -> dict[str, Any]:
    """The quality table: one row per KV precision (the full-precision reference first). ConfigError for a bad
    argument; ModelError when a precision's package is missing."""
    from kvlab.pytorch.models import load

    for name, v in (("n_tokens", n_tokens), ("chunk", chunk), ("new_tokens", new_tokens)):
        check_int(v, name, 1)
    settings: dict[str, QuantizedKV | None] = {"full": None, **{p: QuantizedKV(p) for p in precisions}}
    model = load("smollm2")
    all_ids = model.encode(real_text())
    if len(all_ids) < n_tokens + 1:
        raise ConfigError(
            f"n_tokens={n_tokens}: the text has only {len(all_ids)} tokens; use at most {len(all_ids) - 1}"
        )
    ids = all_ids[: n_tokens + 1]
    t0 = time.perf_counter()
    forced = teacher_forced(model, ids, settings, chunk)
    excerpt = model.tokenizer.decode(all_ids[:prompt_tokens])
    gen = greedy(model, [{"role": "user", "content": excerpt + QUESTION}], settings, new_tokens)
    rows = []
    for name, s in settings.items():
        row = {
            "kv_precision": "float32" if s is None else s.precision,
            "backend": "none" if s is None else s.backend,
            "group_size": None if s is None or s.bits is None else s.group_size,
            "residual_length": None if s is None or s.bits is None else s.residual_length,
            "predicted_bytes_per_token": predicted_bytes_per_token(model.config, s),
            **forced[name],
            **gen[name],
        }
        rows.append({k: row[k] for k in ROW_FIELDS} | row)
    return {
        "model": "smollm2 (SmolLM2-135M-Instruct, real weights, float32 on CPU)",
        "text": TEXT_SOURCE,
        "text_sha256": hashlib.sha256(real_text().encode()).hexdigest(),
        "n_tokens": n_tokens,
        "chunk": chunk,
        "greedy": {"prompt_tokens": prompt_tokens, "question": QUESTION.strip(), "new_tokens": new_tokens},
        "seconds": time.perf_counter() - t0,
        "environment": environment_row(),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    """``run``'s rows as an aligned text table."""
    cols = ("B/token", 9), ("predicted", 9), ("top1", 7), ("KL mean", 9), ("KL max", 8), ("ppl", 8), ("diverge", 7)
    lines = [f"{'kv_precision':<12} " + " ".join(f"{c:>{w}}" for c, w in cols)]
    for r in result["rows"]:
        d = "-" if r["first_divergent_token"] is None else str(r["first_divergent_token"])
        lines.append(
            f"{r['kv_precision']:<12} {r['kv_bytes_per_token']:>9.0f} {r['predicted_bytes_per_token']:>9.0f} "
            f"{r['top1_agreement']:>7.4f} {r['kl_mean']:>9.5f} {r['kl_max']:>8.3f} {r['perplexity']:>8.3f} {d:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line: print the table (and write kv-quality.json with ``--out``); returns 0."""
    p = argparse.ArgumentParser(prog="kv_quality.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="directory for kv-quality.json (printed only when absent)")
    p.add_argument("--precisions", default=",".join(DEFAULT_PRECISIONS), help=f"of {', '.join(KV_PRECISIONS)}")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    a = p.parse_args(argv)
    result = run(tuple(x for x in a.precisions.split(",") if x), a.tokens, a.chunk, a.new_tokens)
    print(table(result))
    print(f"{result['n_tokens']} tokens of {result['text']}; {result['seconds']:.0f} s")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "kv-quality.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
