"""What one run of ONNX Runtime is made of, as kvlab holds it: a ``Session`` (an InferenceSession on one device, checked
to really run there), a ``Binding`` (one run's inputs and outputs; it runs, handing back what the runtime allocated) and
a ``DeviceTensor`` (a tensor kvlab owns on a device, released exactly once).

An OrtValue an IOBinding returns does not own its buffer (the binding's next run reuses or frees it), so every value
kvlab keeps is a ``DeviceTensor`` holding the IOBinding that owns it; nothing here hands out a raw OrtValue.

The WebGPU EP's one context per process is not thread-safe: every use of it (a run, a copy, an allocation, a read-back,
a release) holds ``WEBGPU``, a re-entrant lock. The CPU EP takes none."""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import operator
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.errors import ConfigError, DeviceError
from ...core.guards import atomic
from . import memory
from .preflight import refuse_cpu_fallback

WEBGPU = threading.RLock()
_NO_LOCK = contextlib.nullcontext()
_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()  # let go of at exit


def gate(device_name: str) -> Any:
    """The lock to hold while using a tensor or session on ``device_name``: ``WEBGPU``, or none for the CPU."""
    return _NO_LOCK if device_name == "cpu" else WEBGPU


class Session:
    """An InferenceSession of ``path`` (a file or a serialized model) on ``device``, ``label`` naming it in errors,
    ``options`` its own WebGPU EP options. DeviceError when it cannot be created or a heavy node fell back to the CPU
    EP."""

    def __init__(self, device: Any, path: str | bytes, label: str, options: dict[str, str] | None = None):
        self.device, self.label = device, label
        self.options = dict(options or {})  # EP options of this session alone (e.g. enableGraphCapture)
        self.rewrites: list[str] = []  # what kvlab changed in the graph before opening it here, and why
        self.files: tuple = ()  # the files it was opened from, as ``kvlab.ort.models.graph.files_stamp`` saw them
        # the weights ORT allocates, in 2 MiB pages: fewer TLB misses while a decode step streams them
        with memory.collapsing(device.huge_pages) as self.huge_pages:
            self.ort = device.backend.create_session(path, device, options)  # the onnxruntime.InferenceSession
        self.new_outputs_on = device.backend.bind_target(device)  # where the runtime allocates unbound outputs
        self.cpu_nodes = device.backend.placement(self.ort)  # "op_type:name" of the nodes on the CPU EP
        refuse_cpu_fallback(device.name, self.cpu_nodes, label)
        _SESSIONS.add(self)

    def binding(self) -> Binding:
        """A new IOBinding of this session (nothing bound yet)."""
        return Binding(self)


@dataclass
class RunResult:
    """What one run produced."""

    seconds: float  # wall time of session.run alone
    bind_seconds: float = 0.0  # wall time in the runtime's binding calls for this run's inputs (host copies)
    new: dict[str, DeviceTensor] = field(default_factory=dict)  # outputs the runtime allocated on the device
    returned_ptrs: dict[str, int] | None = field(default_factory=dict)  # pre-bound output -> its buffer (None: unread)

    @property
    def run_ms(self) -> float:
        """The runtime's share of the step (its run and its binding calls), in ms: a record's ``run_ms``."""
        return (self.seconds + self.bind_seconds) * 1e3

    def release(self) -> None:
        """Release every runtime-allocated output (a step that fails after the run owns nothing)."""
        for t in self.new.values():
            t.release()


_BINDINGS: weakref.WeakSet[Binding] = weakref.WeakSet()  # let go of at exit
_DATA_PTR = operator.methodcaller("data_ptr")


class Binding:
    """One IOBinding: inputs, outputs bound in place (to a ``DeviceTensor`` or a host array) and outputs the runtime
    allocates. One with runtime-allocated outputs runs once; one with every output pre-bound runs again and again."""

    def __init__(self, session: Session):
        self.session = session
        self._backend = session.device.backend
        self._io = session.ort.io_binding()
        self._lock = session.device.lock  # held for every use of WebGPU's one context (the module docstring)
        self._from_host, self._host = self._backend.host_input
        self._ortvalue = self._backend.ortvalue  # the package's OrtValue class, resolved once
        self._prebound: dict[str, int] = {}  # output name -> data_ptr bound
        self._keep: dict[str, Any] = {}  # host arrays/OrtValues bound, kept alive while bound
        self._bound_arrays: dict[str, int] = {}  # output name -> id() of the host array bound to it
        self._new: list[str] = []
        self._order: list[str] = []  # outputs in first-binding order: get_outputs() follows it
        self._ran = False
        self._last: RunResult | None = None  # the last run's result, until release_unowned()
        self._bind_seconds = 0.0  # time inside the runtime's bind calls since the last run (RunResult.bind_seconds)
        self.read_back = True  # read every pre-bound output's buffer identity after a run (RunResult.returned_ptrs)
        self.spot_check = ""  # otherwise the one pre-bound output whose identity a run reads back ("": none)
        self._position: dict[str, int] = {}  # output name -> its place in ORT's output list
        self.run_options: Any = None  # onnxruntime.RunOptions for every run (e.g. a graph capture's gpu_graph_id)
        _BINDINGS.add(self)

    @property
    def ran(self) -> bool:
        """Whether this binding has run (a pre-bound binding runs again on the same buffers)."""
        return self._ran

    @property
    def bound_outputs(self) -> dict[str, int]:
        """Outputs bound to memory kvlab owns: name -> the buffer identity (data_ptr) the runtime must write into."""
        return dict(self._prebound)

    def input(self, name: str, value: np.ndarray | DeviceTensor) -> None:
        """Bind an input: a DeviceTensor in place, or a host array (kept alive while bound)."""
        if isinstance(value, DeviceTensor):
            value = value.ortvalue()
            start = time.perf_counter()
            self._io.bind_ortvalue_input(name, value)
        else:  # the runtime copies it to the device at binding time (or reads it in place on the CPU)
            start = time.perf_counter()
            with self._lock:  # a copy onto WebGPU's one context
                ov = self._from_host(value, self._host)  # a C-level OrtValue over the array
                self._io._iobinding.bind_ortvalue_input(name, ov)
                self._keep["in:" + name] = (value, ov)
        self._bind_seconds += time.perf_counter() - start

    def output(self, name: str, target: DeviceTensor | np.ndarray) -> None:
        """Bind an output to memory kvlab owns: the runtime must write into it, in place. Raises ConfigError for a
        host array that is not writeable and C-contiguous."""
        if isinstance(target, DeviceTensor):
            ov, ptr = target.ortvalue(), target.data_ptr
        else:
            if self._bound_arrays.get(name) == id(target) and "out:" + name in self._keep:
                return  # already bound to this very array (a step's logits): the runtime writes it every run
            if not target.flags.c_contiguous or not target.flags.writeable:
                raise ConfigError(f"output {name!r} must be bound to a writeable C-contiguous array")
            ov = self._ortvalue.ortvalue_from_numpy(target)  # the runtime writes (or copies) into it
            ptr = int(ov.data_ptr())
            self._bound_arrays[name] = id(target)
        self._keep["out:" + name] = (target, ov)
        self._io.bind_ortvalue_output(name, ov)
        self._prebound[name] = ptr
        self._remember(name)
        if isinstance(target, DeviceTensor):
            self._bound_arrays.pop(name, None)

    def bound_to_host(self, name: str) -> bool:
        """Whether output ``name`` is bound to a host array (``output``) on this binding now."""
        return name in self._bound_arrays

    def output_new(self, name: str) -> None:
        """Let the runtime allocate this output on the session's device (it comes back as a DeviceTensor)."""
        self._io.bind_output(name, self.session.new_outputs_on)
        self._prebound.pop(name, None)
        self._bound_arrays.pop(name, None)
        if name not in self._new:
            self._new.append(name)
        self._remember(name)

    def _remember(self, name: str) -> None:
        # Rebinding a name keeps its place in ORT's output list.
        if name not in self._position:
            self._position[name] = len(self._order)
            self._order.append(name)

    def run(self) -> RunResult:
        """Run the session on this binding. The outputs the runtime allocated come back owned (``RunResult.new``),
        released if an exception lands right after the run. DeviceError for a second run with runtime-allocated
        outputs."""
        if self._new and self._ran:
            raise DeviceError("this binding has runtime-allocated outputs and already ran; make a new one")
        with self._lock:  # one thread at a time on WebGPU's one context (the module docstring)
            return self._run()

    def _run(self) -> RunResult:
        start = time.perf_counter()
        self.session.ort.run_with_iobinding(self._io, self.run_options)
        result = RunResult(time.perf_counter() - start, self._bind_seconds)
        self._ran, self._last, self._bind_seconds = True, result, 0.0
        if not (self._new or self.read_back):  # one output's identity at most: one Python wrapper, not one per output
            name = self.spot_check
            outputs = self._io._iobinding.get_outputs() if name else None
            result.returned_ptrs = {name: outputs[self._position[name]].data_ptr()} if name else None
            return result
        try:
            values = self._io._iobinding.get_outputs()  # the C-level values: no Python wrapper per output
            if not self._new:  # every output pre-bound (a static cache's binding): one pass in C
                result.returned_ptrs = dict(zip(self._order, map(_DATA_PTR, values)))
            else:
                prebound = self._prebound
                result.returned_ptrs = {
                    name: value.data_ptr() for name, value in zip(self._order, values) if name in prebound
                }
                owner, device = _Owner(self._io, len(self._new)), self.session.device
                with atomic():  # every output wrapped and in the result before a Ctrl-C lands (then released)
                    for name, value in zip(self._order, values):
                        if name in self._new:
                            result.new[name] = DeviceTensor(self._ortvalue(value), device, owner)
                self._io.clear_binding_inputs()  # drop references to inputs (e.g. the previous step's presents)
                self._keep.clear()
        except BaseException:
            result.release()
            if self._new:
                self._io.clear_binding_outputs()  # the outputs not wrapped yet go back to the runtime too
            raise
        return result

    def release_unowned(self) -> None:
        """Release what the last run allocated and nobody took out of its ``RunResult.new``: a caller's ``finally`` can,
        even when a Ctrl-C landed between the run returning and the caller holding its result."""
        last, self._last = self._last, None
        if last is not None:
            last.release()


ONNX_TYPES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int64): "tensor(int64)",
    np.dtype(np.int32): "tensor(int32)",
}


def numpy_dtype(onnx_type: str) -> np.dtype:
    """The numpy dtype of an ONNX Runtime type name ("tensor(float)"); ConfigError for another."""
    for dtype, name in ONNX_TYPES.items():
        if name == onnx_type:
            return dtype
    raise ConfigError(f"unsupported tensor type {onnx_type!r}; kvlab handles {sorted(ONNX_TYPES.values())}")


_UNRELEASED: weakref.WeakSet[DeviceTensor] = weakref.WeakSet()  # released at exit


_TOKENS = itertools.count()  # one per tensor ever made: the device's accounting key (an id() can be reused)


class DeviceTensor:
    """A tensor kvlab owns on a device. ``release()`` frees it exactly once; any use after that is a DeviceError. One
    dropped without ``release()`` stops counting as live when Python collects it."""

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
        # the count's undoing exists before the count: a Ctrl-C between them leaves nothing counted without an owner
        self._untrack = weakref.finalize(self, device.live.pop, token, None)  # runs once: at release() or collection
        device.live[token] = self.nbytes  # counted live on its device until released or collected
        _UNRELEASED.add(self)

    @property
    def released(self) -> bool:
        """Whether ``release()`` has run (any use now is a DeviceError)."""
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
        """Give the buffer back to the runtime and stop counting it live on its device; again: nothing."""
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
        """One output tensor fewer; at the last, the IOBinding's outputs are cleared."""
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


@atexit.register
def _release_while_the_runtime_lives() -> None:
    """At exit, before the interpreter frees the rest in any order: collect the garbage, release every kvlab tensor,
    let go of every IOBinding while its session exists (one freed after its session touches freed memory), then of
    every InferenceSession while the runtime is whole (a WebGPU session left to the interpreter can abort it)."""
    gc.collect()
    for tensor in list(_UNRELEASED):
        tensor.release()
    for b in list(_BINDINGS):
        b._last, b._io = None, None
        b._keep.clear()
    for s in list(_SESSIONS):
        s.ort = None
