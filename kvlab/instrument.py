"""Per-step records, the hooks that receive them, and their column docs (exact counter or proxy)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterable

# column -> (meaning, "exact" | "proxy" | "label")
COLUMNS: dict[str, tuple[str, str]] = {
    "step": ("0 for the prefill (and the handoff that moves it), then 1, 2, ... per decode step", "exact"),
    "phase": ("'prefill', 'handoff' (the prefill's KV copied to the decode device) or 'decode'", "label"),
    "device": ("device that ran the step ('cpu' or 'webgpu'; 'cpu->webgpu' for a handoff)", "label"),
    "position": ("cache length before the step: the position of the first token fed", "exact"),
    "n_tokens": ("tokens fed in this step", "exact"),
    "token": ("the token chosen from this step's logits (-1 for a handoff)", "exact"),
    "wall_ms": ("wall time of the whole step (binding, run, cache commit, sampling)", "exact"),
    "run_ms": ("wall time inside ONNX Runtime's run alone", "exact"),
    "overhead_ms": ("wall_ms - run_ms: Python time outside the run", "exact"),
    "cache_tensors_allocated": ("KV tensors created this step: by the runtime (dynamic presents) or by kvlab's "
                                "one-time lazy allocation (static); 0 means every present was written in place",
                                "exact"),
    "cache_bytes_allocated": ("bytes of those tensors as requested (the WebGPU pool rounds up to its buckets)",
                              "exact"),
    "new_buffers": ("of those, buffers whose identity (data_ptr) this cache had never seen: identity-based; a "
                    "destroyed buffer's handle can be reused, so this is a lower bound on fresh buffers", "proxy"),
    "live_cache_bytes": ("bytes of KV tensors alive after the step (as requested)", "exact"),
    "used_cache_bytes": ("bytes the tokens held need: cache length x bytes per token", "exact"),
    "copy_bytes": ("bytes copied between devices in this step (handoff only)", "exact"),
    "rss_bytes": ("process resident memory after the step (on SwiftShader, GPU memory is host memory too); "
                  "includes everything else the process holds", "proxy"),
}


@dataclass
class StepRecord:
    step: int
    phase: str
    device: str
    position: int
    n_tokens: int
    token: int
    wall_ms: float
    run_ms: float
    overhead_ms: float
    cache_tensors_allocated: int
    cache_bytes_allocated: int
    new_buffers: int
    live_cache_bytes: int
    used_cache_bytes: int
    copy_bytes: int
    rss_bytes: int


assert [f.name for f in fields(StepRecord)] == list(COLUMNS), "COLUMNS must document every StepRecord field"

StepHook = Callable[[StepRecord], None]


_STATM: int | None = None


def rss_bytes() -> int:
    """Resident set size of this process (Linux: /proc/self/statm through a kept-open fd, ~5 us)."""
    global _STATM
    if _STATM is None and os.path.exists("/proc/self/statm"):
        _STATM = os.open("/proc/self/statm", os.O_RDONLY)
    if _STATM is not None:
        return int(os.pread(_STATM, 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


def frame(records: Iterable[StepRecord]):
    """Records as a pandas DataFrame (one row per step; columns documented in COLUMNS)."""
    import pandas as pd

    rows = [asdict(r) for r in records]
    return pd.DataFrame(rows, columns=list(COLUMNS))


class Recorder:
    """A step hook that keeps every record: ``generate(..., on_step=rec)``, then ``rec.frame()``."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def __call__(self, record: StepRecord) -> None:
        self.records.append(record)

    def frame(self):
        return frame(self.records)

    def clear(self) -> None:
        self.records.clear()
