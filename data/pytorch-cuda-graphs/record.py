"""Benchmark the PyTorch decode paths on one device: eager DynamicCache, eager StaticCache, transformers'
``generate(cache_implementation="static")`` (with its auto-compile) and kvlab's GraphRunner (capture-only and
compiled step + graph). Random weights, batch 1. Writes one JSON per configuration.

    .venv/bin/python data/pytorch-cuda-graphs/record.py --out OUT_DIR [--configs smollm2-135m:float16,...]
                                  [--prompt 512] [--new 256] [--modes ...] [--device cuda]

Each configuration runs in its own subprocess with inductor's caches disabled, so every compile is cold and
first-call latencies are honest. (Was ``python -m kvlab.bench.pytorch``; notebook 05 imports ``run_config`` from here.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_counters import copy_bandwidth, environment, peak, peak_reset, set_inductor
from modes import Workload, eager, graph, hf, top2_margins

from kvlab.core.generation import first_divergence
from kvlab.pytorch.generate import sync

MODES = (
    "eager-dynamic",
    "eager-static",
    "graph-capture",
    "graph-compile",
    "hf-dynamic",
    "hf-static-compile",
    "graph-capture-fused",
    "graph-compile-fused",
    "graph-eager",
)
DEFAULT_MODES = MODES[:8]  # graph-*-fused rewrite the model, so they run last; graph-eager: a CPU plumbing check
DEFAULT_CONFIGS = "smollm2-135m:float16,smollm2-135m:bfloat16,llama-1b:bfloat16"
# the random-weight shapes recorded here (timings do not depend on weight values): hidden size, MLP size, layers,
# query heads, KV heads, vocabulary, rope theta; head_dim 64, tied embeddings, 8192 positions. Any other name is one
# of kvlab.pytorch.SHAPES ("tiny": the CPU check)
SHAPES = {
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 100000.0),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256, 500000.0),
}


def llama_fields(shape: str) -> dict[str, Any] | str:
    """The LlamaConfig fields of a shape of ``SHAPES``, else ``shape`` itself (a name kvlab.pytorch knows)."""
    if shape not in SHAPES:
        return shape
    hidden, mlp, layers, heads, kv_heads, vocab, theta = SHAPES[shape]
    return dict(
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        vocab_size=vocab,
        tie_word_embeddings=True,
        rope_theta=theta,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
    )


def run_config(
    shape: str,
    dtype: str,
    prompt_len: int,
    new: int,
    modes: list[str],
    device: str,
    repeats: int = 3,
    attention: str = "sdpa",
    compile_mode: str = "default",
    inductor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One configuration: the random-weight ``shape`` in ``dtype`` on ``device``, a ``prompt_len``-token prompt and
    ``new`` tokens, each of ``modes`` run in MODES order (a failing mode records its error, the others still run).
    Returns ``{"config", "results" (one dict per mode), "environment"}``."""
    import torch

    import kvlab.pytorch as tb

    dev = torch.device(device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = tb.random_model(llama_fields(shape), device=device, dtype=dtype)
    model.name = f"{shape}-random"
    model.hf.generation_config.eos_token_id = None  # never stop early: every mode makes exactly `new` tokens
    info = _describe(shape, dtype, prompt_len, new, model, time.perf_counter() - t0, attention, compile_mode, inductor)
    set_inductor(inductor or {})
    info.update(_roofline(dev, model, info["weight_bytes"], prompt_len + new))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.vocab_size, (prompt_len,), generator=gen).tolist()
    work = Workload(model, dev, ids, new, repeats, attention, compile_mode)
    done = _Results(f"[{shape} {dtype}]", work)
    for name in MODES:
        if name in modes:
            done.record(name, lambda name=name: _MEASURES[name](work, done))
    return {"config": info, "results": done.results, "environment": environment()}


# what each mode measures, given the workload and the modes done before it
_MEASURES: dict[str, Callable[[Workload, _Results], dict[str, Any]]] = {
    "eager-dynamic": lambda w, done: eager(w, "dynamic"),
    "eager-static": lambda w, done: eager(w, "static"),
    "graph-capture": lambda w, done: graph(w, "capture", False, done.reference, done.margins),
    "graph-compile": lambda w, done: graph(w, "compile", False, done.reference, done.margins),
    "hf-dynamic": lambda w, done: hf(w, static=False),
    "hf-static-compile": lambda w, done: hf(w, static=True),
    "graph-capture-fused": lambda w, done: graph(w, "capture", True, done.reference, done.margins),
    "graph-compile-fused": lambda w, done: graph(w, "compile", True, done.reference, done.margins),
    "graph-eager": lambda w, done: graph(w, "eager", False, done.reference, done.margins),
}


def _describe(
    shape: str,
    dtype: str,
    prompt_len: int,
    new: int,
    model: Any,
    build_s: float,
    attention: str,
    compile_mode: str,
    inductor: dict[str, Any] | None,
) -> dict[str, Any]:
    """The configuration as its JSON records it: the model's size, the workload and the settings."""
    return {
        "shape": shape,
        "dtype": dtype,
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "batch": 1,
        "params": sum(p.numel() for p in model.hf.parameters()),
        "weight_bytes": sum(p.nbytes for p in model.hf.parameters()),
        "model_build_s": build_s,
        "fused_attention": attention,
        "compile_mode": compile_mode,
        "inductor": inductor or {},
    }


def _roofline(dev: Any, model: Any, weight_bytes: int, positions: int) -> dict[str, Any]:
    """KV bytes per token and, on CUDA, the copy bandwidth and the time a step takes at it to read the weights and
    a full cache of ``positions``."""
    out: dict[str, Any] = {"kv_bytes_per_token": model.bytes_per_token}
    if dev.type == "cuda":
        bw = copy_bandwidth(dev)
        out["copy_bandwidth_GBps"] = bw / 1e9
        out["roofline_ms_per_token"] = (weight_bytes + positions * model.bytes_per_token) / bw * 1e3
    return out


@dataclass
class _Results:
    """Each mode's result as it is recorded, compared with what ran before it: eager DynamicCache's tokens (the
    ``reference``, with its top-2 ``margins``) and eager StaticCache's."""

    label: str  # "[shape dtype]", before each progress line
    work: Workload
    results: dict[str, Any] = field(default_factory=dict)
    reference: list[int] | None = None
    margins: list[float] = field(default_factory=list)

    def record(self, name: str, measure: Callable[[], dict[str, Any]]) -> None:
        """Run one mode with the peak memory reset, compare its tokens and keep its result (or its error)."""
        dev = self.work.dev
        print(f"{self.label} {name} ...", flush=True)
        try:
            sync(dev)
            peak_reset(dev)
            res = measure()
            res["peak_bytes"] = peak(dev)
            self._compare(name, res)
            self.results[name] = res
            print(
                f"{self.label} {name}: {res.get('ms_per_token'):.3f} ms/token, allocs/step "
                f"{res.get('alloc_requests_per_step')}, first call {res.get('first_call_s', float('nan')):.2f} s, "
                f"equal {res.get('tokens_equal_eager_dynamic')}",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - one failing mode must not lose the others
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            print(f"{self.label} {name} FAILED: {exc}", flush=True)

    def _compare(self, name: str, res: dict[str, Any]) -> None:
        if self.reference is None and name == "eager-dynamic":
            self.reference = res["tokens"]
        if self.reference is not None:
            i = res["first_divergence_vs_eager_dynamic"] = first_divergence(res["tokens"], self.reference)
            res["tokens_equal_eager_dynamic"] = i is None
            if i is not None and self.margins and i < len(self.margins):
                res["eager_dynamic_top2_margin_at_divergence"] = self.margins[i]
        if "eager-static" in self.results and name != "eager-static":
            res["first_divergence_vs_eager_static"] = first_divergence(
                res["tokens"], self.results["eager-static"]["tokens"]
            )
        if name == "eager-dynamic":
            self.margins[:] = margins = top2_margins(self.work, res["tokens"])
            res["top2_margin"] = {
                "min": min(margins),
                "median": sorted(margins)[len(margins) // 2],
                "steps_below_0.05": sum(m < 0.05 for m in margins),
                "first_20": [round(m, 4) for m in margins[:20]],
            }


def main(argv: list[str] | None = None) -> int:
    """This script: each configuration in its own subprocess (``--one``), then summary.md; returns the exit status."""
    ap = _parser()
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; choose from {MODES}")
    bad = [kv for kv in a.inductor if "=" not in kv]
    if bad:
        ap.error(f"--inductor takes KEY=VALUE, got {bad}")
    inductor = {k: _literal(v) for k, v in (kv.split("=", 1) for kv in a.inductor)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.one:
        shape, dtype = a.one.split(":")
        res = run_config(
            shape, dtype, a.prompt, a.new, modes, a.device, a.repeats, a.attention, a.compile_mode, inductor
        )
        res["command"] = " ".join([Path(sys.executable).name, "data/pytorch-cuda-graphs/record.py", *sys.argv[1:]])
        (out / f"{shape}_{dtype}{a.tag}.json").write_text(json.dumps(res, indent=1))
        return 0
    rc = 0
    for config in a.configs.split(","):
        if config.count(":") != 1:
            ap.error(f"config {config!r} must be shape:dtype, e.g. smollm2-135m:float16")
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}  # cold compiles: honest first calls
        rc |= subprocess.run(_one_config_command(a, config, out), env=env).returncode
    summary = summarize(out)
    print(summary)
    (out / "summary.md").write_text(summary)
    return rc


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="record.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON files")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated shape:dtype list")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {MODES}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix for the JSON file names")
    ap.add_argument(
        "--attention", default="sdpa", help="decode attention of the fused graph modes (attention.ATTENTIONS)"
    )
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of graph-compile*")
    ap.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a torch._inductor.config entry for this run, e.g. coordinate_descent_tuning=True",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one config in this process
    return ap


def _one_config_command(a: argparse.Namespace, config: str, out: Path) -> list[str]:
    """This command for one ``config`` in its own process (``--one``), with every other flag as given."""
    return [
        sys.executable,
        __file__,
        "--one",
        config,
        "--out",
        str(out),
        "--prompt",
        str(a.prompt),
        "--new",
        str(a.new),
        "--modes",
        a.modes,
        "--device",
        a.device,
        "--repeats",
        str(a.repeats),
        "--tag",
        a.tag,
        "--attention",
        a.attention,
        "--compile-mode",
        a.compile_mode,
        *(f"--inductor={kv}" for kv in a.inductor),
    ]


def _literal(text: str) -> Any:
    """A Python literal (True, 3, 'x') where the text is one, else the text itself."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def summarize(out: Path) -> str:
    """A markdown table of every JSON in ``out``."""
    lines = [
        "| file | mode | ms/token | tokens/s | allocs/step | first call s | peak MiB | first divergence from "
        "eager | teacher-forced agreement |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in sorted(out.glob("*.json")):
        for mode, r in json.loads(f.read_text())["results"].items():
            if "error" in r:
                lines.append(f"| {f.stem} | {mode} | error: {r['error'][:60]} | | | | | | |")
                continue
            tf = r.get("teacher_forced")
            agree = f"{tf['agree']}/{tf['steps']}" if tf else "-"
            lines.append(
                f"| {f.stem} | {mode} | {r['ms_per_token']:.3f} | {r['tokens_per_s']:.0f} "
                f"| {_num(r['alloc_requests_per_step'])} | {r.get('first_call_s', float('nan')):.2f} | "
                f"{_num(r['peak_bytes'] / 2**20 if r['peak_bytes'] >= 0 else None)} | "
                f"{r.get('first_divergence_vs_eager_dynamic', '-')} | "
                f"{agree} |"
            )
    return "\n".join(lines)


def _num(x: Any) -> str:
    return "-" if x is None or x == -1 else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())
