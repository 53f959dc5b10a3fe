"""The plugin route: ``onnxruntime`` (which brings the CPU EP) with the WebGPU EP as a library ONNX Runtime loads at
run time, the package ``onnxruntime-ep-webgpu`` (``bash scripts/setup.sh --plugin`` makes ``.venv-plugin/``). The
CPU EP and the Python API are the built-in wheel's (``BuiltinWebGpu``); what this package does differently is on
docs/known-limits.md."""

from __future__ import annotations

import os
import threading
from importlib import metadata
from typing import Any

import numpy as np

from ...core.errors import DeviceError
from .builtin import EP_NAME, BuiltinWebGpu, one_node_model
from .session import WEBGPU, DeviceTensor, Session

MIN_ORT = (1, 31)
SOFTWARE_ADAPTER_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"
# options of the WebGPU context (ParseWebGpuContextConfig in the EP library): only the context's creator sets them
CONTEXT_OPTIONS = (
    "deviceId",
    "validationMode",
    "enableRobustness",
    "preserveDevice",
    "maxStorageBufferBindingSize",
    "maxNumPendingDispatches",
    "storageBufferCacheMode",
    "uniformBufferCacheMode",
    "queryResolveBufferCacheMode",
    "defaultBufferCacheMode",
    "powerPreference",
    "dawnBackendType",
)
ANCHOR_LABEL = "kvlab's WebGPU context anchor"  # the one-node session that creates the context with its options

_REGISTER_LOCK = threading.Lock()
_REGISTERED: set[str] = set()  # where the library is registered in this process: "onnxruntime", "genai"


def installed() -> bool:
    """Whether the plugin route is what this environment holds (onnxruntime-ep-webgpu installed)."""
    try:
        metadata.version("onnxruntime-ep-webgpu")
    except metadata.PackageNotFoundError:
        return False
    return True


class PluginWebGpu(BuiltinWebGpu):
    """The ``onnxruntime-ep-webgpu`` backend. Raises DeviceError where onnxruntime is older than ``MIN_ORT``, the EP
    library cannot be registered or lists no device, or a session does not run on it."""

    package = "onnxruntime-ep-webgpu"
    description = "WebGPU plugin EP on onnxruntime"
    webgpu_states_in_place = True
    kv_quantization = True  # the EP option kvCacheQuantizationBits, 8 or 4

    def __init__(self) -> None:
        super().__init__()
        self.ort_version = self.ort.__version__
        if tuple(int(p) for p in self.ort_version.split(".")[:2]) < MIN_ORT:
            raise DeviceError(
                f"onnxruntime-ep-webgpu needs onnxruntime >= {'.'.join(map(str, MIN_ORT))}, but "
                f"onnxruntime {self.ort_version} is installed; run `bash scripts/setup.sh --plugin`"
            )
        self.ep_version = metadata.version("onnxruntime-ep-webgpu")
        self.version = f"{self.ep_version} on onnxruntime {self.ort_version}"
        self._ep_device: Any = None
        self._context: dict[str, str] | None = None  # the context options in force, once a WebGPU device opened
        self._anchors: dict[int, Session] = {}

    def label_for(self, device_name: str) -> tuple[str, str]:
        if device_name == "cpu":  # the CPU EP is onnxruntime's own
            return "onnxruntime", self.ort_version
        return self.package, self.version

    # -- the EP library and its device
    def ep_device(self, device: Any) -> Any:
        """The ``OrtEpDevice`` of the WebGPU EP (the library registered first, once per process). Raises
        DeviceError when the library cannot be registered or lists no WebGPU device."""
        if self._ep_device is not None:
            return self._ep_device
        if device.adapter.kind == "software":  # the EP refuses a software adapter unless told it may use one
            os.environ.setdefault(SOFTWARE_ADAPTER_ENV, "1")
        import onnxruntime_ep_webgpu as ep

        with _REGISTER_LOCK:
            if "onnxruntime" not in _REGISTERED:
                # errors only, as on the built-in package (the EP's factory logs through the default logger)
                self.ort.set_default_logger_severity(int(os.environ.get("KVLAB_ORT_LOG_SEVERITY", "3")))
                try:
                    self.ort.register_execution_provider_library("webgpu", ep.get_library_path())
                except Exception as exc:  # noqa: BLE001 - ORT raises its own types; keep the message
                    raise DeviceError(
                        f"could not register the WebGPU plugin EP {ep.get_library_path()}: {exc}"
                    ) from exc
                _REGISTERED.add("onnxruntime")
        found = [d for d in self.ort.get_ep_devices() if d.ep_name == EP_NAME]
        if not found:
            hint = (
                ""
                if os.environ.get(SOFTWARE_ADAPTER_ENV) == "1"
                else (f" (a software adapter such as SwiftShader is listed only with {SOFTWARE_ADAPTER_ENV}=1)")
            )
            raise DeviceError(
                f"the WebGPU plugin EP lists no device{hint}; devices: "
                f"{[d.ep_name for d in self.ort.get_ep_devices()]}. {device.adapter_hint()}"
            )
        self._ep_device = found[0]
        return self._ep_device

    # -- sessions
    def create_session(self, path: str | bytes, device: Any, options: dict[str, str] | None = None) -> Any:
        sess = super().create_session(path, device, options)
        if device.name == "webgpu" and self._context is None:
            self._context = self._context_of(device)
        return sess

    def _reach(self, so: Any, ep: dict[str, str], device: Any) -> list[str] | None:
        """The EP options through the EP's ``OrtEpDevice`` (``providers`` would give a CPU-only session)."""
        if device.name != "webgpu":
            return ["CPUExecutionProvider"]
        self._check_context(device)
        so.add_provider_for_devices([self.ep_device(device)], ep)
        return None

    @staticmethod
    def _context_of(device: Any) -> dict[str, str]:
        return {k: v for k, v in device.ep_options.items() if k in CONTEXT_OPTIONS}

    def _check_context(self, device: Any) -> None:
        wanted = self._context_of(device)
        if self._context is not None and wanted != self._context:
            raise DeviceError(
                f"this process's WebGPU context was created with {self._context or 'default options'}; on the "
                f"plugin EP it outlives its sessions once a tensor has crossed between host and device, so "
                f"{wanted or 'default options'} would not take effect. Use a new process for other WebGPU context "
                "options (buffer cache mode, validation mode)"
            )

    def release_graph(self, sess: Any, graph_id: int) -> bool:
        sess.release_captured_graph(graph_id)
        return True

    # -- values
    def bind_target(self, device: Any) -> str:
        return "webgpu" if device.name == "webgpu" else "cpu"

    def multi_token_exact(self, device_name: str, adapter_kind: str) -> bool:
        return True  # its prefill logits equal the CPU EP's on a software adapter too (the module docstring)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, device: Any) -> DeviceTensor:
        if device.name == "cpu":
            return super().zeros(shape, dtype, device)
        with WEBGPU:
            self._anchor(device)
            return DeviceTensor(self.ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "webgpu", 0), device)

    def _anchor(self, device: Any) -> None:
        """Create the WebGPU context with the device's options (not the defaults), by a one-node session."""
        if id(device) not in self._anchors:
            self._anchors[id(device)] = Session(
                device, one_node_model("Identity", {"x": (1, [1])}, 1, [1]), ANCHOR_LABEL
            )

    def forget(self, device: Any) -> None:
        super().forget(device)
        self._anchors.pop(id(device), None)

    # -- onnxruntime-genai
    def prepare_genai(self, og: Any, device: Any) -> None:
        """genai loads EP libraries itself: register the WebGPU one there too, once per process, after ONNX Runtime
        has it (registered with genai alone, first in a process, genai does not find the EP)."""
        import onnxruntime_ep_webgpu as ep

        self._anchor(device)

        with _REGISTER_LOCK:
            if "genai" not in _REGISTERED:
                og.register_execution_provider_library(EP_NAME, ep.get_library_path())
                _REGISTERED.add("genai")
