"""The ``onnxruntime-webgpu`` wheel: the CPU EP and the built-in WebGPU EP, in one module ``onnxruntime``. What it
cannot do, and what kvlab does about it, is on docs/known-limits.md (other modules name the capability, not the
version)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...core.devices import DEVICES
from ...core.errors import DeviceError
from .backend import Backend
from .session import WEBGPU, DeviceTensor, Session

EP_NAME = "WebGpuExecutionProvider"
HELPER_LABEL = "kvlab's allocation helper"  # the one-node session that makes device zeros


class BuiltinWebGpu(Backend):
    """The ``onnxruntime-webgpu`` backend (see the module docstring). Raises DeviceError where a session cannot
    be created or ONNX Runtime fell back to the CPU EP."""

    package = "onnxruntime-webgpu"
    description = "built-in WebGPU EP"
    copy_paths = frozenset((a, b) for a in DEVICES for b in DEVICES)  # ort.copy_tensors, verified in tests

    def __init__(self) -> None:
        import onnxruntime as ort
        from onnxruntime.capi import _pybind_state as c

        self.ort, self._c = ort, c
        self._host = c.OrtDevice(c.OrtDevice.cpu(), c.OrtDevice.default_memory(), 0)
        self.host_input = (c.OrtValue.ortvalue_from_numpy, self._host)  # C-level: no Python wrappers
        self.ortvalue = ort.OrtValue
        self.version = ort.__version__
        self._helpers: dict[tuple[int, np.dtype], Session] = {}

    # -- sessions
    def session_options(self, device: Any, options: dict[str, str] | None = None) -> tuple[Any, dict[str, str]]:
        """SessionOptions with kvlab's and the CPU EP's settings applied, and the WebGPU EP options left over (the
        device's, then ``options``). ``KVLAB_ORT_LOG_SEVERITY`` overrides ONNX Runtime's log level."""
        so = self.ort.SessionOptions()
        # 0 verbose ... 4 fatal; a capturing session logs fatal ones only: kvlab raises its refusal, naming the nodes
        quiet = "4" if (options or {}).get("enableGraphCapture") == "1" else "3"
        so.log_severity_level = int(os.environ.get("KVLAB_ORT_LOG_SEVERITY", quiet))
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        ep: dict[str, str] = {}
        for key, value in {**device.ep_options, **(options or {})}.items():
            if key == "threads":
                so.intra_op_num_threads = int(value)
            elif key == "huge_pages":
                continue  # kvlab's own (Session), not an ORT setting
            elif key == "spinning":
                so.add_session_config_entry("session.intra_op.allow_spinning", value)
            elif key == "profile":  # ONNX Runtime's own profiler: one JSON trace per session, written at close
                so.enable_profiling = True
                so.profile_file_prefix = value
            else:
                ep[key] = value
        if ep.get("enableGraphCapture") == "1":
            so.enable_mem_pattern = False  # what capture needs (ORT turns it off for WebGPU anyway)
        return so, ep

    def create_session(self, path: str | bytes, device: Any, options: dict[str, str] | None = None) -> Any:
        so, ep = self.session_options(device, options)
        providers = self._reach(so, ep, device)
        try:
            sess = self.ort.InferenceSession(path, so, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types; keep the message
            raise DeviceError(f"could not create a {device.name} session: {exc}") from exc
        if device.name == "webgpu" and EP_NAME not in sess.get_providers():
            raise DeviceError(
                f"the {self.description} did not take the session (ONNX Runtime fell back to the CPU EP, which "
                f"kvlab never does silently; EP options {ep or 'none'}); providers in force: "
                f"{sess.get_providers()}. {device.adapter_hint()}"
            )
        return sess

    def _reach(self, so: Any, ep: dict[str, str], device: Any) -> list[str] | None:
        """Point ``so`` at the device's EP with the EP options ``ep``; the ``providers`` argument that goes with it.
        This package reads EP options only as session config entries."""
        for key, value in ep.items():
            so.add_session_config_entry(f"ep.webgpuexecutionprovider.{key}", value)
        return [EP_NAME] if device.name == "webgpu" else ["CPUExecutionProvider"]

    def placement(self, sess: Any) -> list[str]:
        return [
            f"{n.op_type}:{n.name}"
            for sg in sess.get_provider_graph_assignment_info()
            if sg.ep_name == "CPUExecutionProvider"
            for n in sg.get_nodes()
        ]

    # -- values
    def multi_token_exact(self, device_name: str, adapter_kind: str) -> bool:
        return not (device_name == "webgpu" and adapter_kind == "software")  # see the module docstring

    def bind_target(self, device: Any) -> str:
        return "gpu" if device.name == "webgpu" else "cpu"

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, device: Any) -> DeviceTensor:
        if device.name == "cpu":
            host = np.zeros(shape, dtype)
            return DeviceTensor(self.host_value(host), device, keep=host)
        with WEBGPU:  # the helper session is made once, on the one context
            binding = self._helper(device, dtype).binding()
            if dtype == np.float16:
                binding.input("x", np.zeros(shape, dtype))
            else:
                binding.input("value", np.zeros((), dtype))
                binding.input("shape", np.asarray(shape, np.int64))
            binding.output_new("y")
            return binding.run().new["y"]

    def _helper(self, device: Any, dtype: np.dtype) -> Session:
        """The one-node session that allocates ``dtype`` tensors on ``device`` (Expand, or Identity for float16)."""
        key = (id(device), dtype)
        if key not in self._helpers:
            from onnx import TensorProto, helper

            elem = helper.np_dtype_to_tensor_dtype(dtype)
            if dtype == np.float16:
                model = one_node_model("Identity", {"x": (elem, None)}, elem)
            else:
                model = one_node_model("Expand", {"value": (elem, []), "shape": (TensorProto.INT64, [None])}, elem)
            self._helpers[key] = Session(device, model, HELPER_LABEL)
        return self._helpers[key]

    def copy(self, src: Any, dst: Any) -> None:
        if src.device_name() == dst.device_name() == "cpu":  # copy_tensors has no transfer from the CPU to itself
            np.copyto(dst.numpy(), src.numpy())  # a CPU value's numpy() is a view of its memory
            return
        with WEBGPU:  # one of them is on WebGPU's one context (kvlab.ort.runtime.session)
            self.ort.copy_tensors([src], [dst], None)

    def forget(self, device: Any) -> None:
        for key in [k for k in self._helpers if k[0] == id(device)]:
            del self._helpers[key]


def one_node_model(op: str, inputs: dict[str, tuple[int, Any]], out_type: int, out_shape: Any = None) -> bytes:
    """A serialized ONNX model of one ``op`` node: ``inputs`` name -> (element type, shape), its output "y"."""
    from onnx import helper

    node = helper.make_node(op, list(inputs), ["y"])
    values = [helper.make_tensor_value_info(name, elem, shape) for name, (elem, shape) in inputs.items()]
    graph = helper.make_graph([node], "kvlab_" + op, values, [helper.make_tensor_value_info("y", out_type, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()
