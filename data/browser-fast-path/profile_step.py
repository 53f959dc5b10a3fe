"""Where the page's uncaptured static step goes, against kvlab's native one on the same GPU: the page's static cache
(token on the GPU, bursts of 8) in Node with Dawn under onnxruntime-web's WebGPU builds (``webgpu``: the EP
built from C++, asyncify wasm, kvlab's runner's; ``jspi``: the same EP on WebAssembly's promise integration;
``jsep``: the JavaScript EP), each run timed alone, once with every
WebGPU call counted and once under V8's sampling profiler over a window of decode steps (``profile_host.mjs``),
beside kvlab's native static step (onnxruntime-webgpu from Python) before and after. Writes ``profile.json`` (and the
``.cpuprofile`` files) to OUT and prints a summary: per-step times, WebGPU calls per step, the profiler's self time
by kind (wasm, WebGPU calls, JavaScript, idle: waiting on the GPU, garbage collection).

    python data/browser-fast-path/profile_step.py OUT [--context 1024] [--new-tokens 64] [--bundles webgpu,jsep]

Needs KVLAB_NODE and KVLAB_WEB_ASSETS (record.sh's Node and npm files, with jsep.tar.xz unpacked into them for the
jsep build), the model built (``kvlab.load("phi4-kv", precision="fp32", graph_capture=True)``).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from record import native_static  # this folder's recording: the same native step, sized the same way

import kvlab
from kvlab.bench.plan import prompt_ids
from kvlab.web.assets import npm_dir
from kvlab.web.job import dawn_toggles, make_job
from kvlab.web.node import find_node, node_env

HERE = Path(__file__).resolve().parent


def decode_ms(result: dict[str, Any]) -> tuple[float, list[int]]:
    """The median decode step (wall ms) of the result's measured static run, and its tokens."""
    run = next(r for r in result["runs"] if not r.get("warmup"))
    return statistics.median(s["wall_ms"] for s in run["steps"] if s["phase"] == "decode"), run["tokens"]


def kind_of(frame: dict[str, Any]) -> str:
    """What a profile frame is: wasm, a WebGPU call (a native function of dawn.node), onnxruntime-web's or kvlab's
    JavaScript, or V8's own (idle, gc, program)."""
    name, url = frame["functionName"], frame.get("url", "")
    if name in ("(idle)", "(garbage collector)", "(program)", "(root)"):
        return name.strip("()")
    if url.startswith("wasm://") or name.startswith("$") or "wasm-function" in name:
        return "wasm"
    if not url:
        return "native (WebGPU binding, builtins)"
    if "onnxruntime-web" in url:
        return "onnxruntime-web JavaScript"
    return "kvlab / host JavaScript"


def summarize_profile(path: Path, steps: int) -> dict[str, Any]:
    """Self time per kind and the top functions of a .cpuprofile, in ms per step."""
    profile = json.loads(path.read_text())
    nodes = {n["id"]: n for n in profile["nodes"]}
    self_us: collections.Counter[int] = collections.Counter()
    for node_id, delta in zip(profile["samples"], profile["timeDeltas"], strict=True):
        self_us[node_id] += delta
    kinds: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for node_id, us in self_us.items():
        frame = nodes[node_id]["callFrame"]
        kind = kind_of(frame)
        kinds[kind] += us
        functions[f"{kind}: {frame['functionName'] or '(anonymous)'} {Path(frame.get('url', '')).name}"] += us
    total = sum(kinds.values())
    return {
        "total_ms_per_step": total / 1000 / steps,
        "by_kind_ms_per_step": {k: round(v / 1000 / steps, 3) for k, v in kinds.most_common()},
        "top_ms_per_step": {k: round(v / 1000 / steps, 3) for k, v in functions.most_common(30)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--bundles", default="webgpu")
    parser.add_argument("--window", type=int, default=40, help="decode steps profiled or counted")
    parser.add_argument("--modes", default="time,count,profile")
    parser.add_argument("--caches", default="static,captured")
    parser.add_argument("--model", default="phi4-kv")
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = kvlab.load(args.model, precision=args.precision, graph_capture=True, progress=False)
    ids = list(prompt_ids(model, args.context))
    size = -(-(args.context + args.new_tokens) // 256) * 256
    start = args.new_tokens + 6  # the measured round's prefill is call new_tokens + 1 of the hook
    toggles = ",".join(dawn_toggles("disabled"))
    report: dict[str, Any] = {"context": args.context, "new_tokens": args.new_tokens, "runs": []}
    native = native_static(model, args.context, args.new_tokens)
    report["runs"].append({"what": "native static", "decode_ms": native["decode_ms"], "tokens": native["tokens"]})
    print(f"native static: {native['decode_ms']:.2f} ms", flush=True)
    jobs = {}
    for cache in args.caches.split(","):
        job = make_job(model, ids, max_new_tokens=args.new_tokens, caches=(f"{cache}@{size}",), reps=1, warmup=True)
        jobs[cache] = args.out / f"job-{cache}.json"
        jobs[cache].write_text(json.dumps(job.to_json()))
    modes = args.modes.split(",")
    plan = [(c, b, m) for c in jobs for m in modes for b in args.bundles.split(",")]
    plan += [(c, b, "time") for c in jobs for b in args.bundles.split(",")]
    for cache, bundle, mode in plan:
        out_file = args.out / f"{cache}-{bundle}-{mode}-{len(report['runs'])}.json"
        cmd = [find_node(), str(HERE / "profile_host.mjs"), str(jobs[cache]), str(model.info.path), str(npm_dir())]
        cmd += [str(out_file), toggles, bundle, mode, str(start), str(args.window)]
        t0 = time.monotonic()
        done = subprocess.run(cmd, env=node_env("auto"), capture_output=True, text=True, timeout=300, check=False)
        result = json.loads(out_file.read_text()) if out_file.is_file() else {"error": done.stdout[-800:]}
        row: dict[str, Any] = {"what": f"page {cache}, {bundle}, {mode}", "seconds": round(time.monotonic() - t0, 1)}
        if "error" in result:
            row["error"] = result["error"][:600]
            print(f"{row['what']}: ERROR {row['error'][:300]}", flush=True)
        else:
            row["runtime"] = f"onnxruntime-web {result['ort_version']} ({bundle}), {result['host']['name']}"
            row["adapter"] = result["adapter"]["description"] or result["adapter"]["architecture"]
            row["decode_ms"], row["tokens"] = decode_ms(result)
            row["window_ms_per_step"] = result["window"]["ms"] / args.window
            row["calls_per_step"] = {k: v / args.window for k, v in sorted(result["calls"].items())}
            row["tokens_equal_native"] = row["tokens"] == native["tokens"]
            profile = out_file.with_suffix(".cpuprofile")
            if profile.is_file():
                row["profile"] = summarize_profile(profile, args.window)
            print(json.dumps({k: v for k, v in row.items() if k != "tokens"}, indent=1)[:4000], flush=True)
        report["runs"].append(row)
        (args.out / "profile.json").write_text(json.dumps(report, indent=1))
    again = native_static(model, args.context, args.new_tokens)
    report["runs"].append({"what": "native static, again", "decode_ms": again["decode_ms"], "tokens": again["tokens"]})
    print(f"native static again: {again['decode_ms']:.2f} ms", flush=True)
    (args.out / "profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
