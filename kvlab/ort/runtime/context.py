"""The one WebGPU context's lock. ONNX Runtime's WebGPU EP keeps one context per process (one device queue, one
command encoder, one buffer manager), and it is not safe to use from two threads at once: two threads generating on
WebGPU, each with its own cache, failed with "WebGPU validation failed. [CommandEncoder] is already finished" or
crashed the process (issue 33). So every use of it by kvlab (a session run, a tensor copy, an allocation, a host
read-back, a release) holds ``WEBGPU``; the CPU EP runs sessions from several threads at once and takes no lock.
An ``RLock``: a release inside a run's cleanup, on the same thread, takes it again. tests/test_concurrency.py."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

WEBGPU = threading.RLock()
_NONE = contextlib.nullcontext()


def gate(device_name: str) -> Any:
    """The lock to hold while using a tensor or session on ``device_name``: ``WEBGPU``, or none for the CPU."""
    return _NONE if device_name == "cpu" else WEBGPU
