"""The options a device opens with, checked, as the EP option strings ``Device.ep_options`` holds: the WebGPU EP's
(buffer cache mode, validation mode) and the CPU EP's (threads, spinning, and kvlab's own huge pages). Only what is
asked for is set; ONNX Runtime's defaults hold otherwise."""

from __future__ import annotations

from typing import Any

from ...core.errors import ConfigError, check_choice, check_flag

BUFFER_CACHE_MODES = ("disabled", "lazyRelease", "simple", "bucket")
VALIDATION_MODES = ("disabled", "wgpuOnly", "basic", "full")


def _flag(name: str, value: Any) -> str:
    return "1" if check_flag(name, value) else "0"


def webgpu_options(buffer_cache_mode: str | None = None, validation_mode: str | None = None) -> dict[str, str]:
    """Validated WebGPU EP options (only what was asked for; ORT's defaults otherwise)."""
    options = {}
    if buffer_cache_mode is not None:
        options["storageBufferCacheMode"] = check_choice(buffer_cache_mode, BUFFER_CACHE_MODES, "buffer cache mode ")
    if validation_mode is not None:
        options["validationMode"] = check_choice(validation_mode, VALIDATION_MODES, "validation mode ")
    return options


def cpu_options(
    threads: int | None = None, spinning: bool | None = None, huge_pages: bool | None = None
) -> dict[str, str]:
    """CPU EP options (ORT's defaults otherwise: one thread per physical core, spinning on; kvlab's: huge pages
    on)."""
    options = {}
    if huge_pages is not None:
        options["huge_pages"] = _flag("huge_pages", huge_pages)
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads={threads!r} must be a positive int")
        options["threads"] = str(threads)
    if spinning is not None:
        options["spinning"] = _flag("spinning", spinning)
    return options
