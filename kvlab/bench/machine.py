"""This machine's memory system and CPU, measured in the same run as the decode steps: STREAM-like bandwidth
(the roofline), the hypervisor's CPU steal, and the shortest time a step reading so many bytes can take."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def memory_bandwidth(size_mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """STREAM-like measurements on this machine (GB/s), each the best of ``repeats``: copy (read + write bytes
    counted) and read (a dot product of an array with itself), on 1 and 2 threads. numpy puts arrays this large in
    transparent huge pages. ``best`` is the most the memory system was seen to deliver: the roofline uses it."""
    n = size_mib * 2**20 // 4
    a, b = np.ones(n, np.float32), np.empty(n, np.float32)
    halves = (slice(0, n // 2), slice(n // 2, n))

    def best(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    def on_two_threads(fn: Callable[[slice], Any]) -> None:
        ts = [threading.Thread(target=fn, args=(half,)) for half in halves]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    out = {
        "copy_1t": 2 * a.nbytes / best(lambda: np.copyto(b, a)) / 1e9,
        "copy_2t": 2 * a.nbytes / best(lambda: on_two_threads(lambda h: np.copyto(b[h], a[h]))) / 1e9,
        "read_1t": a.nbytes / best(lambda: np.dot(a, a)) / 1e9,
        "read_2t": a.nbytes / best(lambda: on_two_threads(lambda h: np.dot(a[h], a[h]))) / 1e9,
    }
    out["best"] = max(out.values())
    return out


def cpu_times() -> tuple[int, int]:
    """(steal, total) CPU time of the whole machine since boot, in clock ticks (/proc/stat; (0, 0) elsewhere):
    steal is time the hypervisor gave this VM's vCPUs to someone else."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def roofline_ms(bytes_read: float, gbps: float) -> float:
    """The shortest a step reading ``bytes_read`` can take at ``gbps`` of memory bandwidth (ms)."""
    return bytes_read / (gbps * 1e9) * 1e3
