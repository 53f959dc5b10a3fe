"""``kvlab doctor``: what kvlab found on this machine (the WebGPU adapter, its backend and why it is hardware or
software, the packages), a tiny model run on each device, one fix per problem, and which notebook settings show the
dynamic-vs-static difference live here (``advice``). The platform logic is ``kvlab.cli.platform_facts``: pure
functions of the facts it gathers."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ..core.errors import KvlabError
from ..core.labels import cpu_adapter
from ..ort import StaticCache, generate, load
from ..ort.checks.inspect import report as inspect_report
from ..ort.runtime.adapters import find_webgpu_adapter, vulkan_adapters
from ..ort.runtime.device import backend
from . import flags
from .platform_facts import GIB, PlatformFacts, assess, collect
from .platform_facts import advice as advice_for


def add(sub: argparse._SubParsersAction) -> None:
    """The ``doctor`` subcommand."""
    p = sub.add_parser("doctor", help="what kvlab found: versions, backend, adapters, a tiny run per device")
    flags.json_flag(p, "the report as JSON")
    p.set_defaults(run=lambda args: doctor(as_json=args.json))


def add_inspect(sub: argparse._SubParsersAction) -> None:
    """The ``inspect`` subcommand: what kvlab sees in a model directory (``kvlab.ort.checks.inspect.report``)."""
    p = sub.add_parser("inspect", help="what kvlab sees in a model: layers, inputs, which caches run it and why not")
    p.add_argument("dir", metavar="DIR", help="a model directory, or a built-in model's name")
    p.add_argument("dtype", nargs="?", metavar="DTYPE", help="a transformers.js directory's variant (fp16, q4f16, ...)")
    p.set_defaults(run=lambda args: print(inspect_report(args.dir, dtype=args.dtype)) or 0)


def _tiny_run(device: str) -> dict[str, Any]:
    """Four tokens of the toy model on a StaticCache on ``device``: what they were and how long they took."""
    model = load("toy")
    start = time.perf_counter()
    with StaticCache(64) as cache:
        g = generate(model, [1, 2, 3, 4], cache=cache, device=device, max_new_tokens=4, stop_on_eos=False)
    return {
        "ok": True,
        "device": str(g.label.device),
        "tokens": g.token_ids,
        "seconds": round(time.perf_counter() - start, 2),
        "decode_ms": round(g.decode_ms(), 2),
        "settings": g.label.device.settings,  # the CPU EP's threads and spinning, and why (kvlab.ort.runtime.options)
    }


def advice(facts: PlatformFacts | None = None) -> dict[str, Any]:
    """Which notebook settings show the dynamic-vs-static difference live on this machine: ``device``, ``model``,
    ``precision``, ``contexts``, ``max_new_tokens``, ``webgpu_models``, the ``recorded`` row to expect and ``why``
    (``kvlab.cli.platform_facts.advice`` of this machine's facts, or of ``facts``). Starts no device."""
    return advice_for(facts if facts is not None else collect())


def report(facts: PlatformFacts | None = None) -> dict[str, Any]:
    """Everything ``kvlab doctor --json`` prints: versions, backend, the platform facts, the adapter in words,
    the advice, a tiny run per device, and the problems with their fixes."""
    facts = facts if facts is not None else collect()
    verdict = assess(facts)
    problems = list(verdict["problems"])
    webgpu = find_webgpu_adapter()
    out: dict[str, Any] = {
        "versions": facts.versions,
        "backend": backend().name,
        "vulkan": facts.vulkan_note or "not Linux: the platform's own WebGPU backend is used",
        "vulkan_adapters": [asdict(d) for d in vulkan_adapters()] if facts.system == "Linux" else [],
        "adapters": {"cpu": asdict(cpu_adapter()), "webgpu": asdict(webgpu) if webgpu else None},
        "platform": {k: v for k, v in asdict(facts).items() if k != "versions"},
        "adapter": verdict["adapter"],
        "advice": verdict["advice"],
        "driver_problems": list(facts.drivers),
        "runs": {},
    }
    if verdict["adapter"] is not None and verdict["adapter"]["kind"] == "software":
        exact = backend().multi_token_exact("webgpu", "software")
        out["note"] = (
            f"WebGPU runs on a software adapter ({verdict['adapter']['description']}): slow"
            + (
                ""
                if exact
                else f", and {backend().name}'s steps of several tokens are wrong there (a prefill from position "
                "4 on: prefill on the CPU EP, --prefill-on cpu; a conversation feeds one token a step)"
            )
            + "; use the toy and kv-heavy models there, SmolLM2 on the CPU EP"
        )
    for device in ("cpu", "webgpu") if verdict["adapter"] is not None else ("cpu",):
        try:
            out["runs"][device] = _tiny_run(device)
        except (KvlabError, ImportError) as exc:
            out["runs"][device] = {"ok": False, "error": str(exc)}
            problems.append(
                {
                    "problem": f"a tiny model run on {device} failed: {exc}",
                    "fix": "fix the problems above, or run `python scripts/setup.py`, then `kvlab doctor` again",
                }
            )
    out["problems"] = problems
    return out


def _size(n: int | None) -> str:
    return f"{n / GIB:.1f} GiB" if n else "?"


def doctor(as_json: bool = False) -> int:
    """Print the report (``report``), as text or as JSON; returns 0 where it found no problem, else 1."""
    r = report()
    if as_json:
        print(json.dumps(r, indent=1))
        return 0 if not r["problems"] else 1
    v = r["versions"]
    print("kvlab doctor")
    print("  versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"  backend:  {r['backend']}")
    print(f"  vulkan:   {r['vulkan']}")
    for a in r["vulkan_adapters"]:
        print(f"            adapter {a['name']!r} (Vulkan type {a['type']})")
    print(f"  cpu:      {r['adapters']['cpu']['name']}")
    a = r["adapter"]
    if a:
        f16 = {
            True: ", shader-f16",
            False: ", no shader-f16 (float16 models run on the CPU EP only)",
            None: ", shader-f16 not known before a float16 run",
        }
        print(f"  webgpu:   {a['description']} ({a['kind']}) on {a['backend']}{f16[a['shader_f16']]}")
        print(f"            {a['kind']}: {a['reason']}")
        print(
            f"            vendor {a['vendor'] or '?'}, memory {_size(a['memory_bytes'])}, storage bindings up to "
            f"{_size(a['max_binding_bytes'])} ({a['source']})"
        )
    else:
        print("  webgpu:   NO ADAPTER")
    if r.get("note"):
        print(f"  note:     {r['note']}")
    adv, rec = r["advice"], r["advice"]["recorded"]
    print(
        f"  advice:   the caches' difference shows live here with {adv['model']} {adv['precision']} on "
        f"{adv['device']} at {'-'.join(map(str, adv['contexts']))} tokens of context"
    )
    if rec:  # none outside a checkout: the recorded experiments live in its data/
        print(
            f"            (recorded on {rec['machine']}: {rec['model']} at {rec['context']:,} tokens, dynamic "
            f"{rec['dynamic_ms']} ms vs static {rec['static_ms']} ms a step; data/{rec['question']}/{rec['file']})"
        )
    print(f"            why: {adv['why']}")
    for device, run in r["runs"].items():
        if run["ok"]:
            print(
                f"  run {device:6s} OK: toy model, 4 tokens {run['tokens']}, {run['decode_ms']} ms/decode step "
                f"({run['device']})"
            )
            if run["settings"]:
                print(f"             its setting: {run['settings']}")
        else:
            print(f"  run {device:6s} FAILED: {run['error']}")
    for p in r["problems"]:
        print(f"  PROBLEM: {p['problem']}\n     fix: {p['fix']}")
    print("  all good" if not r["problems"] else f"  {len(r['problems'])} problem(s)")
    return 0 if not r["problems"] else 1
