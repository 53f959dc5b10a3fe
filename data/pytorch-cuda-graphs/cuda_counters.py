"""What the PyTorch benchmark measures on a CUDA device besides time: the environment, the caching allocator's
counters, device copy bandwidth (the HBM roofline), kernels per step (torch.profiler), inductor settings."""

from __future__ import annotations

import contextlib
import platform
import subprocess
from collections.abc import Callable
from typing import Any


def environment() -> dict[str, Any]:
    """Python, torch, transformers and CUDA versions, the platform, and the GPU and its driver where there is one."""
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm_count=p.multi_processor_count)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
    return env


def _stat(dev, key: str) -> int:
    """A CUDA caching-allocator counter (torch.cuda.memory_stats), -1 elsewhere."""
    import torch

    return int(torch.cuda.memory_stats(dev).get(key, 0)) if dev.type == "cuda" else -1


def allocator_requests(dev) -> int:
    return _stat(dev, "allocation.all.allocated")


def allocator_segments(dev) -> int:
    return _stat(dev, "segment.all.allocated")


def peak_reset(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak(dev) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else -1


def copy_bandwidth(dev, gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), median of 10."""
    import torch

    if dev.type != "cuda":
        return float("nan")
    n = int(gib * 2**30)
    a, b = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_(0, 255)
    times = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    times.sort()
    return 2 * n / times[len(times) // 2]


def kernel_profile(fn: Callable[[], None], steps: int, dev) -> dict[str, Any]:
    """Kernels per step and summed kernel time per step (ms) from torch.profiler over ``steps`` calls of fn."""
    if dev.type != "cuda":
        return {}
    try:
        return _kernel_profile(fn, steps, dev)
    except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the timing
        return {"error": f"{type(exc).__name__}: {exc}"}


def _kernel_profile(fn: Callable[[], None], steps: int, dev) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(dev)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names: dict[str, list[float]] = {}
    for e in kernels:
        names.setdefault(e.name, []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
    top = sorted(((sum(v), len(v), k) for k, v in names.items()), reverse=True)[:8]
    return {
        "kernels_per_step": len(kernels) / steps,
        "kernel_ms_per_step": sum(sum(v) for v in names.values()) / steps / 1e3,
        "top_kernels": [
            {"name": k[:90], "calls_per_step": c / steps, "ms_per_step": t / steps / 1e3} for t, c, k in top
        ],
    }


def set_inductor(options: dict[str, Any]) -> None:
    """Set torch._inductor.config entries by (dotted) name, e.g. {"coordinate_descent_tuning": True}; ValueError
    for a name inductor does not have."""
    import torch._inductor.config as config

    for key, value in options.items():
        *path, leaf = key.split(".")
        owner = config
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, leaf):
            raise ValueError(f"torch._inductor.config has no entry {key!r}")
        setattr(owner, leaf, value)
