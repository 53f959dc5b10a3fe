"""Devices and their sessions: ``open_device("cpu" | "webgpu", ...)`` gives the process's one device of that name, which
opens sessions on it (checked to really run there) and makes the ``DeviceTensor`` s kvlab owns.

WebGPU has one context per process, whose options come from whoever created it and whose tensors die with it; so kvlab
keeps one ``Device`` per name, refuses options that would not take effect, and refuses to close a device while kvlab
tensors live on it. Options are checked in ``options``; what a graph needs, in ``preflight``."""

from __future__ import annotations

import json
import os
import platform
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ...core.devices import DEVICES
from ...core.errors import ConfigError, DeviceError, check_choice
from ...core.guards import atomic
from ...core.labels import Adapter, DeviceLabel, cpu_adapter
from ..models.graph import files_stamp
from . import plugin
from .adapters import find_webgpu_adapter, vulkan_adapters
from .backend import Backend, versions
from .builtin import BuiltinWebGpu
from .options import cpu_options, webgpu_options, with_cpu_defaults, with_webgpu_defaults
from .preflight import explain_refusal, refuse_f16, refuse_on_cpu, workarounds
from .session import DeviceTensor, Session, gate


class Device:
    """An execution device and its options (one per name per process: see the module docstring)."""

    def __init__(self, name: str, backend: Backend, adapter: Adapter, ep_options: dict[str, str], settings: str = ""):
        self.name, self.backend, self.adapter, self.ep_options = name, backend, adapter, ep_options
        self.settings = settings  # the CPU EP's threads and spinning, and why (kvlab.ort.runtime.options)
        self._sessions: dict[str, Session] = {}
        self.profiles: dict[str, str] = {}  # model path -> ORT profile file, filled at close when profiling
        # tensor token -> nbytes of the live kvlab-owned tensors (one atomic dict operation each; readers copy it)
        self.live: dict[int, int] = {}
        self.lock = gate(name)  # held while using a tensor or session here (kvlab.ort.runtime.session)
        self._sessions_lock = threading.RLock()  # the session cache is checked and filled by one thread at a time
        self.closed = False

    @property
    def label(self) -> DeviceLabel:
        """What runs here, for records and plots: the device, its adapter, the package and its settings."""
        webgpu = self.name == "webgpu"
        mode = self.ep_options.get("storageBufferCacheMode", "bucket") if webgpu else ""
        validation = self.ep_options.get("validationMode", "basic") if webgpu else ""  # "basic": ORT's default
        return DeviceLabel(self.name, self.adapter, *self.backend.label_for(self.name), mode, validation, self.settings)

    # -- sessions and tensors
    def session(self, model_path: str | os.PathLike, label: str = "", options: dict[str, str] | None = None) -> Session:
        """The (cached) session of an .onnx file on this device; ``options``: EP options of this session alone
        (e.g. ``{"enableGraphCapture": "1"}``), cached apart from the plain session. Raises DeviceError (a closed
        device, a graph this device cannot run, a session that does not run here) or ModelError (an unreadable
        graph)."""
        self._check_open()
        path = str(Path(model_path).resolve())
        key = _session_key(path, options)
        files = files_stamp(Path(path))  # a session of files changed since it opened is not served again
        with self._sessions_lock, self.lock:
            if key in self._sessions and self._sessions[key].files != files:
                del self._sessions[key]
            if key not in self._sessions:
                refuse_f16(self.name, self.adapter, Path(path), label or path)
                refuse_on_cpu(self.name, Path(path), label or path)
                model, rewrites = workarounds(self.name, Path(path))
                try:
                    self._sessions[key] = Session(self, model, label or path, options)
                except DeviceError as exc:  # where the package's op schemas say why, say that instead
                    why = explain_refusal(Path(path), " ".join(self.backend.label_for(self.name)))
                    if not why:
                        raise
                    raise DeviceError(f"could not create a {self.name} session: {why}") from exc
                self._sessions[key].rewrites, self._sessions[key].files = rewrites, files
            return self._sessions[key]

    @property
    def sessions(self) -> tuple[str, ...]:
        """The model files this device holds a session of."""
        return tuple(self._sessions)

    def forget(self, model_path: str | os.PathLike, options: dict[str, str] | None = None) -> None:
        """Drop the cached session of an .onnx file (ONNX Runtime frees it once nothing else holds it)."""
        self._sessions.pop(_session_key(str(Path(model_path).resolve()), options), None)

    def drop(self, session: Session) -> None:
        """Drop a cached session by identity (whatever options it was opened with)."""
        for key in [k for k, s in self._sessions.items() if s is session]:
            del self._sessions[key]

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> DeviceTensor:
        """A zero-filled kvlab tensor here; ConfigError for a negative dimension, DeviceError when closed."""
        self._check_open()
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ConfigError(f"tensor shape {shape} has a negative dimension")
        return self.backend.zeros(shape, np.dtype(dtype), self)

    def check_copy_from(self, src: Device) -> None:
        """Raise DeviceError when this backend cannot copy tensors from ``src`` to this device."""
        if (src.name, self.name) not in self.backend.copy_paths:
            raise DeviceError(
                f"{self.backend.name} cannot copy tensors from {src.name} to {self.name}; supported: "
                f"{sorted(self.backend.copy_paths)}"
            )

    @property
    def live_tensors(self) -> int:
        """Number of kvlab-owned tensors alive on this device (exact)."""
        return len(self.live)

    @property
    def live_bytes(self) -> int:
        """Bytes of kvlab-owned tensors alive on this device (exact, as requested; pools may round up)."""
        return sum(self.live.copy().values())

    @property
    def huge_pages(self) -> bool:
        """Whether sessions' new memory is collapsed into transparent huge pages (CPU device, on by default)."""
        return self.name == "cpu" and self.ep_options.get("huge_pages", "1") == "1"

    @property
    def huge_page_bytes(self) -> int:
        """Bytes the process's AnonHugePages grew by while collapsing this device's sessions (exact)."""
        return sum(s.huge_pages["bytes"] for s in self._sessions.values())

    @staticmethod
    def adapter_hint() -> str:
        """What to do when WebGPU finds no adapter, in words (for errors)."""
        return (
            "No WebGPU adapter: on Debian/Ubuntu run `bash scripts/setup.sh` (installs libvulkan1 and "
            "chromium-common, whose SwiftShader driver kvlab uses when there is no GPU), or install your GPU's "
            "Vulkan driver. `kvlab doctor` shows what was found."
        )

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceError(f"the {self.name} device was closed; open a new one with kvlab.open_device()")

    def close(self) -> None:
        """Release every session on this device (for WebGPU: the context) and mark it closed; nothing when closed.
        DeviceError, leaving it open, while kvlab-owned tensors are alive on it."""
        if self.closed:
            return
        if self.live:
            raise DeviceError(
                f"{len(self.live)} kvlab tensors ({self.live_bytes} bytes) are still alive on "
                f"{self.name}; dispose the caches that hold them before closing the device"
            )
        if "profile" in self.ep_options:
            self.profiles = {key: s.ort.end_profiling() for key, s in self._sessions.items()}
        self._sessions.clear()
        self.backend.forget(self)
        self.closed = True
        if _OPEN.get(self.name) is self:  # a private device is not the open one
            del _OPEN[self.name]


def _session_key(path: str, options: dict[str, str] | None) -> str:
    return path if not options else path + " " + " ".join(f"{k}={v}" for k, v in sorted(options.items()))


_OPEN: dict[str, Device] = {}
_OPEN_LOCK = threading.RLock()  # open_device checks and sets _OPEN under it: threads opening at once get one device
_BACKEND: Backend | None = None


def backend() -> Backend:
    """The process's ONNX Runtime backend (the installed package decides which: onnxruntime-ep-webgpu, the plugin
    EP on onnxruntime, where it is installed; else the onnxruntime-webgpu wheel's built-in EP)."""
    global _BACKEND
    if _BACKEND is None:
        with atomic():  # ONNX Runtime's import whole: a Ctrl-C inside it would leave a module no retry can import
            _BACKEND = plugin.PluginWebGpu() if plugin.installed() else BuiltinWebGpu()
    return _BACKEND


def open_device(
    name: str | Device = "cpu",
    *,
    buffer_cache_mode: str | None = None,
    validation_mode: str | None = None,
    threads: int | None = None,
    spinning: bool | None = None,
    huge_pages: bool | None = None,
    profile: str | os.PathLike | None = None,
) -> Device:
    """The process's device of that name ("cpu" or "webgpu"; a ``Device`` is returned as it is), opened on first use.
    Options that differ from the open device's are a DeviceError (close the device first). WebGPU:
    ``buffer_cache_mode``, ``validation_mode``. CPU: ``threads``, ``spinning`` (whether idle pool threads spin),
    ``huge_pages`` (the weights in 2 MiB pages, default on: ``Device.huge_page_bytes``). ``profile``: a file prefix for
    ONNX Runtime's profiler (``Device.profiles`` after close). Raises ConfigError for a bad name or option, DeviceError
    when WebGPU has no adapter or its context cannot be created."""
    if isinstance(name, Device):
        return name
    check_choice(name, DEVICES, "device ")
    if name != "webgpu" and (buffer_cache_mode or validation_mode):
        raise ConfigError("buffer_cache_mode and validation_mode apply to device 'webgpu' only, not 'cpu'")
    if name != "cpu" and (threads is not None or spinning is not None or huge_pages is not None):
        raise ConfigError("threads, spinning and huge_pages apply to device 'cpu' only, not 'webgpu'")
    options = (
        webgpu_options(buffer_cache_mode, validation_mode)
        if name == "webgpu"
        else cpu_options(threads, spinning, huge_pages)
    )
    if profile is not None:
        options["profile"] = str(profile)
    with _OPEN_LOCK:
        return _open(name, options)


def _open(name: str, options: dict[str, str]) -> Device:
    """The open device of that name (its options checked against ``options``), or a new one registered."""
    dev = _OPEN.get(name)
    if dev is not None:
        differing = {k: v for k, v in options.items() if dev.ep_options.get(k, v) != v or k not in dev.ep_options}
        if differing:
            raise DeviceError(
                f"the {name} device is already open with {dev.ep_options or 'default options'}; "
                f"{differing} would not take effect on its sessions. Dispose your caches and call "
                f"kvlab.close_device({name!r}) first (or use a new process)."
            )
        return dev
    if name == "webgpu":
        adapter = find_webgpu_adapter()
        if adapter is None:
            raise DeviceError(
                "device 'webgpu' has no adapter: the Vulkan loader found no GPU driver and no "
                "SwiftShader. " + Device.adapter_hint()
            )
        options, settings = with_webgpu_defaults(options), ""
    else:
        adapter, (options, settings) = cpu_adapter(), with_cpu_defaults(options)
    dev = Device(name, backend(), adapter, options, settings)
    if name == "webgpu":
        dev.zeros((1,), np.float32).release()  # creates the context now, so a missing adapter fails here
    _OPEN[name] = dev
    return dev


def private_device(name: str, **options: Any) -> Device:
    """A device beside the process's open one (never registered: e.g. the CPU with other options, for a paired
    comparison in one process). WebGPU has one context per process, so only "cpu" can have one."""
    if name != "cpu":
        raise ConfigError(f"a private device can only be 'cpu' (WebGPU has one context per process), not {name!r}")
    return Device("cpu", backend(), cpu_adapter(), *with_cpu_defaults(cpu_options(**options)))


def opened(name: str) -> Device | None:
    """The open device of that name, or None (never opens one: a WebGPU context fixes its options)."""
    return _OPEN.get(name)


def close_device(name: str) -> None:
    """Close the open device of that name, if any (see ``Device.close``); ConfigError for a name not a device."""
    check_choice(name, DEVICES, "device ")
    with _OPEN_LOCK:
        if name in _OPEN:
            _OPEN[name].close()


def copy_tensor(src: DeviceTensor, dst: DeviceTensor) -> None:
    """Copy a whole tensor into another of the same shape and dtype (host<->device or device<->device); ConfigError
    where they differ, DeviceError where the backend has no such copy."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ConfigError(
            f"cannot copy {src.shape} {src.dtype} into {dst.shape} {dst.dtype}: shapes and dtypes must match"
        )
    dst.device.check_copy_from(src.device)
    dst.device.backend.copy(src.ortvalue(), dst.ortvalue())


def describe() -> dict[str, Any]:
    """The environment, machine-readable: the backend, package versions, platform, CPU and Vulkan adapters."""
    return {
        "backend": backend().name,
        "versions": versions(),
        "platform": platform.platform(),
        "cpu": cpu_adapter().name,
        "vulkan": json.dumps([asdict(d) for d in vulkan_adapters()]),
    }
