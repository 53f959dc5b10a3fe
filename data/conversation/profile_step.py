"""Where a multi-token step's time goes at a given position: ONNX Runtime's profiler over steps of each width at each
position, per node (CPU side: the kernel's submission) and, on WebGPU with timestamp queries, per GPU program.

    python3 data/conversation/profile_step.py [--model phi4-kv --precision fp32 --device webgpu --positions 1984,3936
        --widths 1,33 --reps 3 --out OUT.json]

After a prefill of real text to each position (a StaticCache, one Stepper), steps of every width in turn, ``--reps``
rounds after a warm-up round; each step is rolled back (the cache cropped) so every step starts at the same position.
The trace is read after the device closes: runs in order, matched to the steps; a GPU event (cat "Api", named
"node&op&program") to the run whose span holds its start. Rows: ms per step by node, op type and GPU program, the
median over rounds, per (position, width); then the slope per position between the first and last position.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import kvlab
from kvlab import StaticCache, Stepper, close_device, open_device

TEXT = (Path(__file__).resolve().parents[2] / "data" / "prompts" / "long.txt").read_text()


def run_steps(model: kvlab.Model, device: str, positions: list[int], widths: list[int], reps: int, tmp: str):
    """Profiled steps: the label of every run in order (None: not kept), each step's wall time, the trace's events
    and the adapter's name."""
    close_device(device)
    dev = open_device(device, profile=str(Path(tmp) / "ort"))
    ids = model.encode(TEXT).tolist()
    labels, walls = [], []
    try:
        for p in positions:
            feed = (ids * (p // len(ids) + 2))[: p + max(widths)]
            with StaticCache(p + max(widths)) as cache, Stepper(model, cache, dev, p + max(widths)) as s:
                s.step(feed[:p])
                labels.append(None)
                for rep in range(reps + 1):  # round 0 warms each width's shaders
                    for w in widths:
                        _, rec = s.step(feed[p : p + w], logits_out="none")
                        cache.crop(p)
                        labels.append((p, w) if rep else None)
                        walls.append({"position": p, "width": w, "round": rep, "wall_ms": rec.wall_ms})
    finally:
        close_device(device)
    events = json.loads(Path(dev.profiles[str(Path(model.onnx_path).resolve())]).read_text())
    return labels, walls, events, dev.adapter.name


def summarize(labels, events) -> dict:
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    assert len(runs) == len(labels), (len(runs), len(labels))
    starts = [r["ts"] for r in runs]
    # per kept run: {key: us}
    per_run: list[dict[str, float]] = [{} for _ in runs]
    gpu = sorted((e for e in events if e.get("cat") == "Api" and "&" in e.get("name", "")), key=lambda e: e["ts"])
    # a GPU event's run: by order where every run begins with the graph's first kernel (GPU and CPU clocks need not
    # agree), else by the CPU span its start falls in
    firsts = [k for k, e in enumerate(gpu) if gpu and e["name"] == gpu[0]["name"]]
    by_order = len(firsts) == len(runs)
    run_of = {id(e): sum(f <= k for f in firsts) - 1 for k, e in enumerate(gpu)}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            keys = ["cpu node " + e["name"][: -len("_kernel_time")], "cpu op " + e["args"]["op_name"]]
        elif id(e) in run_of:
            node, op, program = (e["name"].split("&") + ["", ""])[:3]
            keys = [f"gpu node {node}", f"gpu op {op}", f"gpu program {op}/{program}", "gpu (all kernels)"]
        else:
            continue
        if by_order and id(e) in run_of:
            i = run_of[id(e)]
        else:
            i = max((k for k, s in enumerate(starts) if s <= e["ts"]), default=None)
            if i is not None and e["ts"] > runs[i]["ts"] + runs[i]["dur"] + 5_000:
                continue  # after every run's end (5 ms of slack for the GPU's clock)
        if i is None or labels[i] is None:
            continue
        for key in keys:
            per_run[i][key] = per_run[i].get(key, 0.0) + e["dur"]
    for i, r in enumerate(runs):
        per_run[i]["(run)"] = r["dur"]
    table: dict[tuple[int, int], dict[str, float]] = {}
    for label in sorted({x for x in labels if x}):
        rows = [per_run[i] for i, x in enumerate(labels) if x == label]
        keys = set().union(*rows)
        table[label] = {k: statistics.median(r.get(k, 0.0) for r in rows) / 1e3 for k in keys}
    return {"gpu_events": len(gpu), "gpu_runs_by_order": by_order, "table": table}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="phi4-kv")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--device", default="webgpu")
    p.add_argument("--positions", default="1984,3936")
    p.add_argument("--widths", default="1,33")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--top", type=int, default=12, help="rows printed per (position, width)")
    p.add_argument("--out", default="profile_step.json")
    args = p.parse_args()
    model = kvlab.load(args.model, precision=args.precision)
    positions = [int(x) for x in args.positions.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        labels, walls, events, adapter = run_steps(model, args.device, positions, widths, args.reps, tmp)
    s = summarize(labels, events)
    table = s["table"]
    lo, hi = positions[0], positions[-1]
    slopes = {}
    for w in widths:
        a, b = table[(lo, w)], table[(hi, w)]
        slopes[w] = {k: (b.get(k, 0.0) - a.get(k, 0.0)) / (hi - lo) * 1e3 for k in set(a) | set(b)}  # us/position
    for (pos, w), row in table.items():
        print(f"\n== position {pos}, width {w}: run {row['(run)']:.2f} ms (profiled)")
        for k, v in sorted(row.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {v:9.3f} ms  {k}  (slope {slopes[w].get(k, 0.0):.4f} us/position)")
    for w in widths:
        print(f"\n== width {w}: largest slopes, us per position ({lo} -> {hi})")
        for k, v in sorted(slopes[w].items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {v:9.4f}  {k}")
    from kvlab.bench.results import write_recording

    out = {
        "model": model.name,
        "precision": model.info.precision,
        "device": args.device,
        "adapter": adapter,
        "positions": positions,
        "widths": widths,
        "reps": args.reps,
        "gpu_events": s["gpu_events"],
        "gpu_runs_by_order": s["gpu_runs_by_order"],
        "ms_per_step": [{"position": k[0], "width": k[1], "ms": v} for k, v in table.items()],
        "slope_us_per_position": {str(w): v for w, v in slopes.items()},
        "steps": walls,
        "args": vars(args),
    }
    note = "ORT's profiler on: every node traced (adds to each step)"
    print(f"wrote {write_recording(args.out, out, note)}")


if __name__ == "__main__":
    main()
