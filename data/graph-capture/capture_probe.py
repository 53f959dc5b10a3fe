"""Where a decode step's time goes, captured and not, phase by phase: a diagnosis run for a WebGPU package whose
captured step is slower than its uncaptured one (onnxruntime-webgpu 1.27 on an NVIDIA H200 machine).

One configuration per process (a fresh WebGPU context each):
- ``--cache static|captured``, ``--token host|device``;
- ``--readback copy|session``: how a captured step's logits (or token) come back to the host: the env-level tensor
  copy kvlab uses, or a one-node Identity session whose output is bound to the host array (the copy an uncaptured
  run makes at its end);
- ``--no-sync``: the captured runs carry the run option ``disable_synchronize_execution_providers=1``;
- ``--prefill-on cpu``: the prefill on the CPU EP, its KV handed over (no multi-token run on the capturing session);
- ``--no-warmup``: one generation only (it captures at its first two steps);
- ``--validation-mode``, ``--buffer-cache-mode``: the WebGPU EP's options for every session of the process;
- ``--graph own``: capture the graph without kvlab's next-mask output (the host writes the mask every step; with
  ``--token host`` also the ids: the model's own graph, the one onnxruntime-genai captures); ``--one-graph`` (with
  both): every step on the first pair of step buffers, under one graph id, as genai's loop runs (kvlab alternates
  two);
- ``--profile PREFIX``: ONNX Runtime's profiler (with the WebGPU kernels' GPU times), summarized per kernel.

It generates ``--new-tokens`` greedy tokens after ``--context`` prompt tokens and prints one JSON line: the median
decode step (wall), and per step the median time inside the session run (the replay, for a captured step) and
inside the host copy after it, with the loop thread's CPU time (``time.thread_time``) over the same spans. The
timers wrap kvlab's own two calls (``Binding._run`` and the backend's ``copy``); nothing else changes.

    python data/graph-capture/capture_probe.py --model phi4-kv --precision int4 --context 1024 --cache captured
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import kvlab
from kvlab.bench.plan import prompt_ids
from kvlab.core.devices import BUFFER_CACHE_MODES
from kvlab.ort.decode.caches import capture_binding
from kvlab.ort.decode.caches import captured as capture
from kvlab.ort.runtime import builtin, session
from kvlab.ort.runtime.options import VALIDATION_MODES

SPANS: dict[str, list[tuple[float, float]]] = defaultdict(list)  # name -> (wall s, thread CPU s) per call


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS[name].append((time.perf_counter() - w, time.thread_time() - c))

    return wrapper


_READERS: dict[str, object] = {}  # ONNX type -> the Identity session that copies a device value to the host


def session_copy(original):
    """A backend ``copy`` whose device-to-host copies run through a one-node Identity session."""

    def copy(self, src, dst) -> None:
        if src.device_name() == "cpu" or dst.device_name() != "cpu":
            return original(self, src, dst)
        kind = src.data_type()
        if kind not in _READERS:
            from onnx import helper

            elem = helper.np_dtype_to_tensor_dtype(session.numpy_dtype(kind))
            node = helper.make_node("Identity", ["x"], ["y"])
            value = [helper.make_tensor_value_info(n, elem, None) for n in ("x", "y")]
            graph = helper.make_graph([node], "readback", value[:1], value[1:])
            m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 9
            _READERS[kind] = self.create_session(m.SerializeToString(), kvlab.open_device("webgpu"), None)
        sess = _READERS[kind]
        io = sess.io_binding()
        io.bind_ortvalue_input("x", src)
        io.bind_ortvalue_output("y", dst)
        sess.run_with_iobinding(io)

    return copy


def no_sync(original):
    def run_options(ort, graph_id):
        ro = original(ort, graph_id)
        ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return ro

    return run_options


def own_graph(original):
    """``captured_graph`` without kvlab's next-mask output (the model's own graph when no token is added)."""

    def captured_graph(model, reduction="", shift_mask=True):
        return original(model, reduction, shift_mask=False)

    return captured_graph


def one_pair(original):
    """``CaptureBinding.run`` that leaves the cache on the first pair of step buffers: every step replays graph 0.
    Only sound when the host writes ids and mask (``--graph own --token host``): they land in the pair read."""

    def run(self):
        result = original(self)
        self._buffers.parity = 0
        return result

    return run


def summarize(path: str) -> None:
    """One trace's events by category and name: how many, and their total and median duration (µs)."""
    events = [e for e in json.loads(Path(path).read_text()) if isinstance(e, dict) and "dur" in e]
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in events:
        groups[(e.get("cat", ""), e.get("name", "")[:60])].append(int(e["dur"]))
    print(f"== {path}: {len(events)} events")
    for (cat, name), durs in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:30]:
        print(f"{cat:10s} {name:60s} n={len(durs):6d} total={sum(durs):9d} median={int(np.median(durs)):7d}")


def timeline(path: str, last: int = 600) -> dict:
    """The GPU side of a trace's last ``last`` kernels (the last decode steps): their busy time, the span from the
    first start to the last end, and the idle gaps over 100 µs between kernels (how many, their median and total, and
    how many kernels ran between two such gaps)."""
    events = json.loads(Path(path).read_text())
    kernels = sorted((e for e in events if isinstance(e, dict) and e.get("cat") == "Api"), key=lambda e: e["ts"])
    kernels = kernels[-last:]
    gaps, runs, since = [], [], 0
    for a, b in zip(kernels, kernels[1:]):
        since += 1
        gap = b["ts"] - (a["ts"] + a["dur"])
        if gap > 100:
            gaps.append(gap)
            runs.append(since)
            since = 0
    return {
        "trace": Path(path).name,
        "kernels": len(kernels),
        "busy_us": int(sum(e["dur"] for e in kernels)),
        "span_us": int(kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]),
        "gaps_over_100us": len(gaps),
        "gap_median_us": int(np.median(gaps)) if gaps else 0,
        "gaps_total_us": int(sum(gaps)),
        "kernels_between_gaps_median": int(np.median(runs)) if runs else 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="phi4-kv")
    p.add_argument("--precision", default="int4")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--cache", choices=("static", "captured"), default="captured")
    p.add_argument("--token", choices=("host", "device"), default="device")
    p.add_argument("--readback", choices=("copy", "session"), default="copy")
    p.add_argument("--no-sync", action="store_true")
    p.add_argument("--prefill-on", choices=("webgpu", "cpu"), default=None)
    p.add_argument("--no-warmup", action="store_true", help="one generation: its first two steps capture")
    p.add_argument("--validation-mode", choices=VALIDATION_MODES, default=None)
    p.add_argument("--buffer-cache-mode", choices=BUFFER_CACHE_MODES, default=None)
    p.add_argument("--graph", choices=("kvlab", "own"), default="kvlab")
    p.add_argument("--one-graph", action="store_true")
    p.add_argument("--timeline", nargs="+", metavar="TRACE", help="only summarize these traces' GPU timelines")
    p.add_argument("--profile", help="ONNX Runtime's profiler on: its traces go to this file prefix, summarized")
    a = p.parse_args()
    if a.timeline:
        for path in a.timeline:
            print(json.dumps(timeline(path)))
        return
    if a.readback == "session":
        builtin.BuiltinWebGpu.copy = session_copy(builtin.BuiltinWebGpu.copy)
    if a.no_sync:
        capture_binding.run_options = no_sync(capture_binding.run_options)
    if a.one_graph and (a.token != "host" or a.graph != "own"):
        p.error("--one-graph needs --graph own --token host (the host writes ids and mask into the pair read)")
    if a.graph == "own":
        capture.captured_graph = own_graph(capture.captured_graph)
    if a.one_graph:
        capture_binding.CaptureBinding.run = one_pair(capture_binding.CaptureBinding.run)
    builtin.BuiltinWebGpu.copy = timed("copy", builtin.BuiltinWebGpu.copy)
    session.Binding._run = timed("run", session.Binding._run)
    ep = {"validation_mode": a.validation_mode, "buffer_cache_mode": a.buffer_cache_mode, "profile": a.profile}
    dev = kvlab.open_device("webgpu", **ep) if any(ep.values()) else None
    captured = a.cache == "captured"
    model = kvlab.load(a.model, precision=a.precision, graph_capture=captured)
    ids = prompt_ids(model, a.context)
    size = a.context + a.new_tokens + 8
    cache = kvlab.CapturedStaticCache(size) if captured else kvlab.StaticCache(size)
    token = "single" if a.token == "device" else False
    # prefill_device "cpu": the prefill on the CPU EP, handed over (no multi-token run on the capturing session)
    run = {
        "cache": cache,
        "device": "webgpu",
        "stop_on_eos": False,
        "token_on_device": token,
        "prefill_device": a.prefill_on,
    }
    with cache:
        if not a.no_warmup:  # the capture and the first replays in a generation of their own
            kvlab.generate(model, ids, max_new_tokens=8, **run)
        SPANS.clear()
        c0 = time.thread_time()
        g = kvlab.generate(model, ids, max_new_tokens=a.new_tokens, **run)
        loop_cpu = time.thread_time() - c0
        traces = [cache.bindings._session.ort.end_profiling()] if a.profile and captured else []  # before dispose
    steps = [r for r in g.records if r.phase == "decode"][4:]
    n = len(steps)
    spans = {k: v[-n:] for k, v in SPANS.items()}  # the decode steps' calls (one run, one copy or none each)
    out = {
        "config": vars(a),
        "step_ms": float(np.median([r.wall_ms for r in steps])),
        "run_ms": float(np.median([r.run_ms for r in steps])),
        "loop_cpu_ms_per_token": 1000 * loop_cpu / len(g.records),
        **{f"{k}_wall_ms": 1000 * float(np.median([s[0] for s in v])) for k, v in spans.items()},
        **{f"{k}_cpu_ms": 1000 * float(np.median([s[1] for s in v])) for k, v in spans.items()},
        **{f"{k}_calls": len(v) for k, v in spans.items()},
        "tokens": g.token_ids[:16],
        "label": str(g.label),
    }
    print(json.dumps(out))
    if a.profile:
        dev.close()
        for path in [*traces, *dev.profiles.values()]:
            summarize(path)


if __name__ == "__main__":
    main()
