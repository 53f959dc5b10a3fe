"""``kvlab trace``: one long generation per cache on one device, every step recorded, with the GPU memory the
process holds after each step (NVML, where the driver has it; exact driver accounting) beside kvlab's exact tensor
counts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.frames import decode_median
from ..core.paths import write_atomic
from ..ort import DynamicCache, Model, StaticCache, generate, open_device
from ..ort.runtime.device import describe
from ..ort.runtime.gpu_memory import GpuMemory
from .plan import prompt_ids


def trace(
    model: Model,
    device: str,
    context: int,
    steps: int,
    prefill_device: str | None = None,
) -> dict[str, Any]:
    """``steps`` decode steps after ``context`` tokens of real text, once with a dynamic and once with a static cache
    (each disposed of after its run): per kind its step medians, tensor and buffer counts, the GPU memory the process
    held after every step (NVML; empty elsewhere), every record and the tokens; whether the kinds' tokens are equal,
    and what ran. ``prefill_device``: prefill there and hand off (``generate``'s). ConfigError for a bad count."""
    ids = prompt_ids(model, context)
    runs = {}
    for kind in ("dynamic", "static"):
        memory = GpuMemory()
        memory.sample(-1)  # before the cache exists
        with StaticCache(context + steps) if kind == "static" else DynamicCache() as cache:
            g = generate(
                model,
                ids,
                cache=cache,
                device=device,
                max_new_tokens=steps + 1,
                stop_on_eos=False,
                prefill_device=prefill_device,
                on_step=[memory],
            )
        f = g.frame()
        dec = f[f.phase == "decode"]
        runs[kind] = {
            "cache": str(g.label.cache),
            "decode_ms": decode_median(g.records),
            "decode_ms_first_100": float(np.median(dec.wall_ms[:100])),
            "decode_ms_last_100": float(np.median(dec.wall_ms[-100:])),
            "tensors_allocated_per_step": float(dec.cache_tensors_allocated.mean()),
            "new_buffers_in_decode": int(dec.new_buffers.sum()),
            "gpu_memory": {"steps": memory.steps, "bytes": memory.bytes, **memory.describe()},
            "records": f.drop(columns=["device", "copied_from"]).to_dict(orient="list"),
            "token_ids": g.token_ids,
        }
    tokens = [r["token_ids"] for r in runs.values()]
    return {
        "model": model.name,
        "precision": model.info.precision,
        "device": str(open_device(device).label),
        "context": context,
        "steps": steps,
        "tokens_equal": all(t == tokens[0] for t in tokens),
        "environment": {**describe(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
        "runs": runs,
    }


def write_json(data: Any, path: Path) -> Path:
    """Write ``data`` as JSON to ``path`` (its folder made first; whole or not at all: ``write_atomic``)."""
    return write_atomic(path, json.dumps(data, indent=1, default=float))
