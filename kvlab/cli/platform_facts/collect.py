"""The boundary: this machine's facts, gathered once (``collect``) from its OS's adapter query, its packages and its
memory. Everything after it is a pure function of the ``PlatformFacts`` it returns."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from .facts import AdapterFacts, PlatformFacts
from .queries import WINDOWS_QUERY, from_vulkan, parse_macos, parse_windows


def collect() -> PlatformFacts:
    """This machine's facts (starts no WebGPU context; on Linux it points the Vulkan loader first, as kvlab does
    before any WebGPU session)."""
    import shutil

    import psutil

    from ...ort.runtime.adapters import (
        SWIFTSHADER_ICD,
        configure_vulkan,
        driver_problems,
        hardware_icd_manifests,
        vulkan_adapters,
        vulkan_loader,
    )
    from ...ort.runtime.backend import versions
    from ...ort.runtime.plugin import installed

    system = platform.system()
    common = dict(
        system=system,
        machine=platform.machine(),
        python=sys.executable,
        versions=versions(),
        plugin=installed(),
        ram_bytes=psutil.virtual_memory().total,
        apt=shutil.which("apt-get") is not None,
    )
    if system == "Linux":
        note = configure_vulkan()
        loader = vulkan_loader()
        adapters = tuple(from_vulkan(d) for d in vulkan_adapters()) if loader else ()
        icds = tuple(hardware_icd_manifests())
        hardware = any(not a.is_fallback for a in adapters)
        drivers = tuple(asdict(d) for d in driver_problems()) if icds and not hardware else ()
        return PlatformFacts(
            **common,
            adapters=adapters,
            vulkan_loader=loader,
            vulkan_note=note,
            hardware_icds=icds,
            swiftshader=os.path.exists(SWIFTSHADER_ICD),
            drivers=drivers,
        )
    if system == "Windows":
        text, error = _run(["powershell.exe", "-NoProfile", "-NonInteractive", "-Command", WINDOWS_QUERY])
        adapters, error = _parsed(parse_windows, text, error)
        return PlatformFacts(**common, adapters=adapters, query_error=error)
    if system == "Darwin":
        text, error = _run(["system_profiler", "-json", "SPDisplaysDataType"])
        adapters, error = _parsed(lambda t: parse_macos(t, common["ram_bytes"]), text, error)
        return PlatformFacts(**common, adapters=adapters, query_error=error)
    return PlatformFacts(**common, query_error=f"no adapter query for {system}")


def _parsed(parse: Any, text: str, error: str) -> tuple[tuple[AdapterFacts, ...], str]:
    if not text:
        return (), error
    try:
        return tuple(parse(text)), ""
    except (ValueError, TypeError, AttributeError) as exc:  # not the JSON the query prints
        return (), f"unreadable adapter query output ({exc}): {text[:200]!r}"


def _run(cmd: list[str]) -> tuple[str, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"{cmd[0]}: {exc}"
    return (
        (proc.stdout, "") if proc.returncode == 0 else ("", f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-300:]}")
    )
