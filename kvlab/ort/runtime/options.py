"""The options a device opens with, checked, as the EP option strings ``Device.ep_options`` holds: the WebGPU EP's
(buffer cache mode, validation mode) and the CPU EP's (threads, spinning, and kvlab's own huge pages). A device opens
with kvlab's defaults for what is not asked (``with_webgpu_defaults``, ``with_cpu_defaults``); ONNX Runtime's for the
rest."""

from __future__ import annotations

import os
from typing import Any

import psutil

from ...core.devices import BUFFER_CACHE_MODES, DEFAULT_VALIDATION
from ...core.errors import check_choice, check_flag, check_int

VALIDATION_MODES = ("disabled", "wgpuOnly", "basic", "full")


def _allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on: its affinity where the OS says, else all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_count() -> int:
    """How many logical CPUs this process may run on: the most CPU EP threads kvlab accepts."""
    return max(1, len(_allowed_cpus()))


def physical_cores() -> int:
    """The physical cores this process may run on: psutil's count, capped by ``cpu_count()`` (a container or an
    affinity mask may allow fewer); ``cpu_count()`` where psutil cannot tell."""
    return max(1, min(psutil.cpu_count(logical=False) or cpu_count(), cpu_count()))


# The share of this process's cores that must be idle, when a CPU device opens, for its pool threads to spin.
QUIET_SHARE = 0.75


def idle_cores(seconds: float = 0.1) -> float:
    """How many of this process's logical CPUs were idle over the next ``seconds`` (sampled by psutil, whatever
    process kept them busy, this one included); takes ``seconds``. 0 < seconds <= 1."""
    allowed = _allowed_cpus()
    busy = psutil.cpu_percent(interval=seconds, percpu=True)
    mine = [busy[i] for i in allowed if i < len(busy)] or busy
    return sum(100.0 - b for b in mine) / 100.0


def cpu_choice(idle: float | None = None) -> tuple[dict[str, str], str]:
    """kvlab's CPU EP default and why, as (options, reason), from the idle logical CPUs (``idle``; measured by
    ``idle_cores`` when None): where at least ``QUIET_SHARE`` of the cores are idle, spinning threads, one per physical
    core less the busy ones; elsewhere one per physical core, not spinning (a spinning thread that takes turns with
    another process spends its share waiting)."""
    physical, logical = physical_cores(), cpu_count()
    idle = min(float(logical), idle_cores() if idle is None else idle)
    quiet = idle >= QUIET_SHARE * logical
    busy = round((logical - idle) * physical / logical)
    threads = max(1, physical - busy) if quiet else physical
    why = (
        f"{threads} threads, {_spin_words('1' if quiet else '0')}: {idle:.1f} of {logical} cores idle when the "
        f"device opened ({'quiet' if quiet else 'busy'})"
    )
    return {"threads": str(threads), "spinning": "1" if quiet else "0"}, why


def with_webgpu_defaults(options: dict[str, str]) -> dict[str, str]:
    """``options`` (``webgpu_options``'s) completed with kvlab's WebGPU EP default: validation mode "disabled", as
    onnxruntime-genai configures a model built for graph capture. It skips the checks of every command: ask for "basic"
    or "full" to debug a misuse."""
    return {"validationMode": DEFAULT_VALIDATION, **options}


def with_cpu_defaults(options: dict[str, str]) -> tuple[dict[str, str], str]:
    """``options`` (``cpu_options``'s) completed with kvlab's CPU EP default for what they leave out
    (``cpu_choice``; the machine is measured only then), and the reason, in words."""
    if "threads" in options and "spinning" in options:
        return dict(options), f"{options['threads']} threads, {_spin_words(options['spinning'])}: as asked"
    chosen, why = cpu_choice()
    merged = {**chosen, **options}
    if merged != chosen:
        why = f"{merged['threads']} threads, {_spin_words(merged['spinning'])}: as asked, the rest kvlab's default"
    return merged, why


def _spin_words(flag: str) -> str:
    return "spinning" if flag == "1" else "not spinning"


def check_threads(threads: Any) -> int:
    """``threads`` when it is an int in [1, the logical CPU count]; else a ConfigError naming it and the range."""
    return check_int(threads, "threads", 1, cpu_count(), note=" (the logical CPUs this process may run on)")


def _flag(name: str, value: Any) -> str:
    return "1" if check_flag(name, value) else "0"


def webgpu_options(buffer_cache_mode: str | None = None, validation_mode: str | None = None) -> dict[str, str]:
    """WebGPU EP options, only those asked for; ConfigError for a mode not in the valid ones."""
    options = {}
    if buffer_cache_mode is not None:
        options["storageBufferCacheMode"] = check_choice(buffer_cache_mode, BUFFER_CACHE_MODES, "buffer cache mode ")
    if validation_mode is not None:
        options["validationMode"] = check_choice(validation_mode, VALIDATION_MODES, "validation mode ")
    return options


def cpu_options(
    threads: int | None = None, spinning: bool | None = None, huge_pages: bool | None = None
) -> dict[str, str]:
    """CPU EP options, only those asked for (``with_cpu_defaults`` completes them). ``threads``: 1 to ``cpu_count()``.
    ConfigError for a value out of range or a flag that is not a bool."""
    options = {}
    if huge_pages is not None:
        options["huge_pages"] = _flag("huge_pages", huge_pages)
    if threads is not None:
        options["threads"] = str(check_threads(threads))
    if spinning is not None:
        options["spinning"] = _flag("spinning", spinning)
    return options
