"""Transparent huge pages for the weights a decode step streams.

ONNX Runtime allocates its weight buffers with plain malloc, in 4 KiB pages; ``collapsing`` collapses the memory
a session allocated in new mappings into 2 MiB pages (Linux ``madvise(MADV_COLLAPSE)``); memory reusing ranges
mapped before is left as it is (``Device.huge_page_bytes`` shows how much was collapsed). Elsewhere than Linux it
does nothing and says so."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <linux/mman.h>
HUGE_PAGE = 2 << 20  # x86-64 / arm64 (4 KiB base pages) PMD size
MIN_RANGE = 4 << 20  # smaller ranges are not worth a synchronous collapse

Range = tuple[int, int]  # [start, end) virtual addresses


def anonymous_ranges() -> set[Range]:
    """The process's private anonymous writable mappings (malloc's heap and mmap'd chunks); empty off Linux."""
    out = set()
    for line in _read("/proc/self/maps").splitlines():
        fields = line.split()
        if "rw" in fields[1] and "p" in fields[1] and (len(fields) < 6 or fields[5] == "[heap]"):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.add((lo, hi))
    return out


@contextmanager
def collapsing(enabled: bool = True) -> Iterator[dict[str, Any]]:
    """``with collapsing() as report: <create a session>``: every anonymous mapping that appeared (or changed) in the
    block is backed with huge pages on the way out, synchronously, best effort (the kernel may refuse a range; the
    contents never change). ``report``: ``bytes``, how much the process's AnonHugePages grew meanwhile (exact,
    process-wide), and ``refused``, {errno name: ranges} ({"bytes": 0, "refused": {}} when not enabled)."""
    report: dict[str, Any] = {"bytes": 0, "refused": {}}
    before = anonymous_ranges() if enabled else set()
    yield report
    if not enabled:
        return
    if not sys.platform.startswith("linux"):
        report["refused"] = {"unsupported platform": 1}
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    huge_before, refused = state()["anon_huge_mib"], report["refused"]
    for lo, hi in sorted(anonymous_ranges() - before):
        start, end = -(-lo // HUGE_PAGE) * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE  # whole huge pages inside
        if end - start < MIN_RANGE:
            continue
        libc.madvise(start, end - start, MADV_HUGEPAGE)  # keep them huge if the kernel ever splits and re-faults
        if libc.madvise(start, end - start, MADV_COLLAPSE) != 0:
            code = ctypes.get_errno()
            name = errno.errorcode.get(code, str(code))
            refused[name] = refused.get(name, 0) + 1
    huge_after = state()["anon_huge_mib"]
    grown = round((huge_after - huge_before) * 2**20) if huge_before is not None and huge_after is not None else 0
    report["bytes"] = max(grown, 0)


def state() -> dict[str, Any]:
    """The kernel's THP mode and the anonymous huge-page MiB this process has mapped now (None where unknown)."""
    mode = _read("/sys/kernel/mm/transparent_hugepage/enabled").strip()
    rollup = [
        line.split()[1] for line in _read("/proc/self/smaps_rollup").splitlines() if line.startswith("AnonHugePages:")
    ]
    return {"thp_mode": mode or None, "anon_huge_mib": int(rollup[0]) / 1024 if rollup else None}


def _read(path: str) -> str:
    """The text of a kernel file; "" where there is none (not Linux)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""
