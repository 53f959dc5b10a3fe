"""``kvlab profile``: where a static-cache decode step's time goes, by ONNX operator type, from ONNX Runtime's
own profiler."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..core.errors import check_int
from ..ort import Model, StaticCache, close_device, generate, load, open_device
from .plan import prompt_ids


def op_profile(
    model: Model | str, device: str = "cpu", context: int = 256, new_tokens: int = 16, **device_options: Any
) -> list[dict[str, Any]]:
    """Where a static-cache decode step's time goes, by ONNX operator type, from ONNX Runtime's own profiler.

    Opens a profiled device of its own (the process's open device of that name is closed first: its caches must
    be disposed), prefills ``context`` tokens, decodes ``new_tokens`` and averages the decode runs after the
    first. Rows: each op type's kernel time per step, "(between nodes)" (the run's time outside every node:
    scheduling, thread hand-offs) and "(run)" (the whole run). Profiling itself adds a little to each node. On
    WebGPU a node's time is its CPU-side submission, not GPU execution. ConfigError for fewer than 3
    ``new_tokens``."""
    check_int(new_tokens, "new_tokens", 3, note=" (the prefill and the first decode run are not profiled)")
    model = load(model)
    close_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        dev = open_device(device, profile=os.path.join(tmp, "ort"), **device_options)
        try:
            with StaticCache(context + new_tokens) as cache:
                generate(
                    model,
                    prompt_ids(model, context),
                    cache=cache,
                    device=dev,
                    max_new_tokens=new_tokens,
                    stop_on_eos=False,
                )
        finally:
            close_device(device)
        # the one session the steps ran on: the model's graph, or its greedy graph (the token on the device)
        ran = [p for key, p in dev.profiles.items() if Path(key.split(" ")[0]).name.startswith(model.onnx_path.stem)]
        events = json.loads(Path(max(ran, key=lambda p: Path(p).stat().st_size)).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][2:]  # skip the prefill and the first decode
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and any(a <= e["ts"] <= b for a, b in spans):
            per_op.setdefault(e["args"]["op_name"], []).append(e["dur"])
    n, run_us = len(runs), sum(r["dur"] for r in runs) / len(runs)
    rows = [{"op": op, "ms_per_step": sum(d) / n / 1e3, "nodes_per_step": len(d) / n} for op, d in per_op.items()]
    rows.sort(key=lambda r: -r["ms_per_step"])
    inside = sum(r["ms_per_step"] for r in rows)
    rows += [
        {"op": "(between nodes)", "ms_per_step": run_us / 1e3 - inside, "nodes_per_step": 0.0},
        {"op": "(run)", "ms_per_step": run_us / 1e3, "nodes_per_step": sum(r["nodes_per_step"] for r in rows)},
    ]
    for r in rows:
        r["share"] = r["ms_per_step"] / (run_us / 1e3)
    return rows
