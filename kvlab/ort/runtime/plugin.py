"""The plugin route: ``onnxruntime`` (>= 1.31, which brings the CPU EP) with the WebGPU EP as a library that ONNX
Runtime loads at run time, the package ``onnxruntime-ep-webgpu`` (0.4.0). It lives in an environment of its own
(``bash scripts/setup.sh --plugin`` makes ``.venv-plugin/``): both routes install the module ``onnxruntime``.

The CPU EP and ONNX Runtime's Python API are the built-in wheel's (``BuiltinWebGpu`` is reused for them). What this
package does differently, as kvlab meets it: the one list in the code; docs/known-limits.md has the error
messages and measurements behind each line.

- The library is registered once per process (``register_execution_provider_library``): registering it a second
  time raises, and the next session created in that process then crashes. kvlab registers it exactly once, under a
  lock; onnxruntime-genai loads EP libraries itself and needs it registered there too, after ONNX Runtime.
- A session reaches the EP through its ``OrtEpDevice``: ``SessionOptions.add_provider_for_devices([device],
  options)``, with the EP options as a dict of short keys. ``providers=["WebGpuExecutionProvider"]`` gives a
  CPU-only session without a word, and so does an option value the EP rejects (ONNX Runtime falls back to the CPU
  EP and goes on): every WebGPU session is checked to have the EP in force.
- A software adapter is listed only with ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1``; kvlab sets it when the adapter
  it found is a software one.
- Device tensors are allocated directly (``OrtValue.ortvalue_from_shape_and_type(shape, dtype, "webgpu", 0)``,
  zero-filled); no helper model. Host data goes in with ``ort.copy_tensors`` (or ``update_inplace``).
- The WebGPU context is created by the first thing that touches the device, with that session's options (or the
  defaults, for a tensor allocated before any session), and once any tensor has crossed between host and device
  it stays for the life of the process, even after every session is released. So kvlab opens a one-node session
  with the device's options before its first allocation, and refuses a WebGPU device with other context options
  later in the same process (it would silently run with the first ones): use a new process.
- A fixed-size state bound as both input and output of one run is accepted (``webgpu_states_in_place``).
- A captured graph can be released on its own (``InferenceSession.release_captured_graph``); a host value bound
  under capture is refused by its Python layer.
- Prefill logits equal the CPU EP's on a software adapter too.
- After onnxruntime-genai ran on WebGPU in the process, a kvlab WebGPU session left to the interpreter's
  finalization aborts the process at exit: kvlab lets go of its sessions first
  (``kvlab.ort.runtime.session.drop_every_session``).
"""

from __future__ import annotations

import os
import threading
from importlib import metadata
from typing import Any

import numpy as np

from ...core.errors import DeviceError
from .builtin import BuiltinWebGpu
from .context import WEBGPU
from .session import DeviceTensor, Session

EP_NAME = "WebGpuExecutionProvider"
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
    """The ``onnxruntime-ep-webgpu`` backend (see the module docstring). Raises DeviceError where onnxruntime is
    older than ``MIN_ORT``, the EP library cannot be registered or lists no device, or a session does not run on
    it."""

    package = "onnxruntime-ep-webgpu"
    description = "WebGPU plugin EP on onnxruntime"
    webgpu_states_in_place = True  # a state read and written in place by one run (tests/test_beyond_full.py)
    kv_quantization = True  # the EP option kvCacheQuantizationBits, 8 or 4 (docs/kv-memory.md)

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
                # kvlab's sessions log errors only (as on the built-in package); the EP's factory logs through the
                # default logger, e.g. a warning about the software adapter at every start
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
        so, ep = self.session_options(device, options)
        providers = None
        if device.name == "webgpu":
            self._check_context(device)
            so.add_provider_for_devices([self.ep_device(device)], ep)
        else:
            providers = ["CPUExecutionProvider"]
        try:
            sess = self.ort.InferenceSession(path, so, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types; keep the message
            raise DeviceError(f"could not create a {device.name} session: {exc}") from exc
        if device.name == "webgpu" and EP_NAME not in sess.get_providers():
            raise DeviceError(
                f"the WebGPU plugin EP did not take the session (ONNX Runtime fell back to the CPU EP, which it does "
                f"when the EP rejects an option value: {ep or 'no options'}); providers in force: "
                f"{sess.get_providers()}. {device.adapter_hint()}"
            )
        if device.name == "webgpu" and self._context is None:
            self._context = self._context_of(device)
        return sess

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
            self._anchors[id(device)] = Session(device, _identity_model(), ANCHOR_LABEL)

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


def _identity_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "kvlab_anchor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()
