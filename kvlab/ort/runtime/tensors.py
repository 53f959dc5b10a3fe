"""Device tensors kvlab owns, released exactly once.

No function here hands out a raw ``OrtValue`` for keeping: an OrtValue returned by an IOBinding does not own its
buffer. Once that IOBinding's outputs are cleared and it runs again, the earlier value reads the new run's data or
freed memory. So every value kvlab keeps is wrapped together with the IOBinding that owns it, and released exactly
once.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

from ...core.errors import ConfigError, DeviceError
from ...core.guards import atomic

ONNX_TYPES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int64): "tensor(int64)",
    np.dtype(np.int32): "tensor(int32)",
}


def numpy_dtype(onnx_type: str) -> np.dtype:
    """The numpy dtype of an ONNX Runtime type name ("tensor(float)", ...); ConfigError for one kvlab does not
    handle."""
    for dtype, name in ONNX_TYPES.items():
        if name == onnx_type:
            return dtype
    raise ConfigError(f"unsupported tensor type {onnx_type!r}; kvlab handles {sorted(ONNX_TYPES.values())}")


_UNRELEASED: weakref.WeakSet[DeviceTensor] = weakref.WeakSet()  # for release_everything(), at exit


_TOKENS = itertools.count()  # one per tensor ever made: the device's accounting key (an id() can be reused)


class DeviceTensor:
    """A tensor kvlab owns on a device. ``release()`` frees it exactly once; any use after that is a DeviceError.
    One dropped without ``release()`` stops counting as live on its device when Python collects it (its buffer
    goes back to the runtime then)."""

    def __init__(self, value: Any, device: Any, owner: _Owner | None = None, keep: Any = None):
        self._value = value  # the OrtValue (never handed out for keeping)
        self._owner = owner  # the IOBinding that really owns the buffer, shared by its outputs
        self._keep = keep  # host memory an OrtValue points into
        self.device = device
        self.shape = tuple(value.shape())
        self.dtype = numpy_dtype(value.data_type())
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.data_ptr = int(value.data_ptr())  # the buffer's identity (a WGPUBuffer handle on WebGPU)
        token = next(_TOKENS)
        device.live[token] = self.nbytes  # counted live on its device until released or collected
        self._untrack = weakref.finalize(self, device.live.pop, token, None)  # runs once: at release() or collection
        _UNRELEASED.add(self)

    @property
    def released(self) -> bool:
        return self._value is None

    def ortvalue(self) -> Any:
        """The underlying OrtValue, for binding and copying; valid until ``release()``."""
        if self._value is None:
            raise DeviceError(f"this {self.device.name} tensor {self.shape} was released; it cannot be used")
        return self._value

    def numpy(self) -> np.ndarray:
        """A host copy of the contents."""
        with self.device.lock:
            return np.array(self.ortvalue().numpy(), copy=True)

    def release(self) -> None:
        if self._value is None:
            return
        with self.device.lock:  # the buffer goes back to the (one) WebGPU buffer manager now
            self._value = self._keep = None
            self._untrack()
            _UNRELEASED.discard(self)
            if self._owner is not None:
                self._owner.drop()
                self._owner = None

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.nbytes} bytes"
        return f"DeviceTensor({self.device.name}, {self.shape}, {self.dtype}, {state})"


class _Owner:
    """Keeps an IOBinding (and with it the buffers of its runtime-allocated outputs) alive until its last
    output tensor is released, then clears it: the buffers go back to the runtime at that moment."""

    def __init__(self, io_binding: Any, count: int):
        self.io_binding, self.count = io_binding, count

    def drop(self) -> None:
        self.count -= 1
        if self.count == 0 and self.io_binding is not None:
            self.io_binding.clear_binding_outputs()
            self.io_binding = None


def zeros_all(device: Any, specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[DeviceTensor]:
    """One zero-filled tensor per (shape, dtype) on ``device``, all or nothing: on any failure (re-raised) every
    tensor made so far is released (also on Ctrl-C: each tensor is owned by the list from the moment it exists)."""
    made: list[DeviceTensor] = []
    try:
        for shape, dtype in specs:
            with atomic():
                made.append(device.zeros(shape, dtype))
    except BaseException:
        release_all(made)
        raise
    return made


def release_all(tensors: list[DeviceTensor]) -> None:
    """Release every tensor of the list (each at most once)."""
    for t in tensors:
        t.release()


def release_everything() -> None:
    """Release every kvlab tensor not released yet (at interpreter exit: see ``kvlab.ort.runtime.device``)."""
    for tensor in list(_UNRELEASED):
        tensor.release()
