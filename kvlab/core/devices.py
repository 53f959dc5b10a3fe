"""The choices a device is opened with, as data: the device names and the WebGPU EP's storage buffer cache modes.

Pure data in the core, so that the backends validate against it and the lab offers it in its controls without
importing a backend."""

from __future__ import annotations

DEVICES = ("cpu", "webgpu")  # the devices kvlab opens on ONNX Runtime
BUFFER_CACHE_MODES = ("disabled", "lazyRelease", "simple", "bucket")  # the WebGPU EP's storageBufferCacheMode values
DEFAULT_VALIDATION = "disabled"  # kvlab's WebGPU EP validation mode (kvlab.ort.runtime.options.with_webgpu_defaults)
