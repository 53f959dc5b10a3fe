"""What will run a device's kernels: the WebGPU adapter Dawn will pick (through the Vulkan loader on Linux), and
the CPU. On Linux without a GPU Vulkan driver, kvlab points the loader at SwiftShader (Google's CPU Vulkan driver,
shipped by Debian's chromium-common) and labels that adapter "software"."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import check_choice
from ...core.labels import Adapter

ADAPTER_CHOICES = ("auto", "hardware", "software")
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
# where the Vulkan loader itself looks for driver manifests, and where GPU containers mount them besides
LOADER_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
EXTRA_ICD_DIRS = ("/usr/local/nvidia/share/vulkan/icd.d",)
_SOFTWARE_ICDS = ("lvp_", "swiftshader")  # Mesa lavapipe, Google SwiftShader
# the libraries a GPU's Vulkan driver may load before it can start, by the Debian/Ubuntu package that ships each
LIBRARY_PACKAGES = {
    "libGLX.so.0": "libglx0",
    "libGLdispatch.so.0": "libglvnd0",
    "libEGL.so.1": "libegl1",
    "libOpenGL.so.0": "libopengl0",
    "libGL.so.1": "libgl1",
    "libGLESv2.so.2": "libgles2",
    "libvulkan.so.1": "libvulkan1",
}


def icd_manifests(dirs: tuple[str, ...] = LOADER_ICD_DIRS + EXTRA_ICD_DIRS) -> list[str]:
    """The Vulkan driver manifests (ICD JSON files) in ``dirs``, sorted."""
    return sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.json")))


def is_software_icd(path: str) -> bool:
    """Whether a driver manifest is a CPU driver's (SwiftShader, lavapipe)."""
    return any(tag in os.path.basename(path) for tag in _SOFTWARE_ICDS)


def hardware_icd_manifests() -> list[str]:
    """The GPU Vulkan driver manifests installed (SwiftShader's and lavapipe's left out), where the loader looks and
    where GPU containers mount them."""
    return [f for f in icd_manifests() if not is_software_icd(f)]


def vulkan_loader() -> bool:
    """Whether the Vulkan loader (libvulkan.so.1) can be loaded."""
    return _loads("libvulkan.so.1")


def configure_vulkan(choice: str | None = None) -> str:
    """Point the Vulkan loader at a driver before the first WebGPU session (Linux only). ``choice`` (or env
    ``KVLAB_WEBGPU_ADAPTER``): "auto" a hardware driver when one is installed, else SwiftShader; "software" forces
    SwiftShader; "hardware" leaves the loader alone. A user's ``VK_ICD_FILENAMES``/``VK_DRIVER_FILES`` always wins.
    Returns the first call's note (the loader reads the environment once). ConfigError for another choice."""
    global _VULKAN_NOTE
    choice = choice or os.environ.get("KVLAB_WEBGPU_ADAPTER", "auto")
    check_choice(choice, ADAPTER_CHOICES, "KVLAB_WEBGPU_ADAPTER=")
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
    hardware = hardware_icd_manifests()
    if choice == "hardware" or (choice == "auto" and hardware):
        if hardware and not any(os.path.dirname(f) in LOADER_ICD_DIRS for f in hardware):
            os.environ["VK_DRIVER_FILES"] = os.pathsep.join(hardware)  # where the loader would not look
            return (
                f"hardware Vulkan drivers outside the loader's search path: VK_DRIVER_FILES={os.pathsep.join(hardware)}"
            )
        return "hardware Vulkan drivers: " + (", ".join(hardware) or "none found")
    if not os.path.exists(SWIFTSHADER_ICD):
        return f"no hardware Vulkan driver and no SwiftShader ({SWIFTSHADER_ICD} missing)"
    os.environ["VK_ICD_FILENAMES"] = SWIFTSHADER_ICD
    return f"no hardware Vulkan driver: using SwiftShader ({SWIFTSHADER_ICD})"


_U32 = ctypes.c_uint32  # also VkBool32


def _vk_struct(*fields: tuple[str, Any]) -> type[ctypes.Structure]:
    """A Vulkan structure: its ``sType`` and ``pNext`` chain link, then ``fields`` (name, ctypes type)."""
    return type("VkStruct", (ctypes.Structure,), {"_fields_": [("sType", _U32), ("pNext", ctypes.c_void_p), *fields]})


_VkApplicationInfo = _vk_struct(
    ("pApplicationName", ctypes.c_char_p),
    ("applicationVersion", _U32),
    ("pEngineName", ctypes.c_char_p),
    ("engineVersion", _U32),
    ("apiVersion", _U32),
)
_VkInstanceCreateInfo = _vk_struct(
    ("flags", _U32),
    ("pApplicationInfo", ctypes.POINTER(_VkApplicationInfo)),
    ("enabledLayerCount", _U32),
    ("ppEnabledLayerNames", ctypes.c_void_p),
    ("enabledExtensionCount", _U32),
    ("ppEnabledExtensionNames", ctypes.c_void_p),
)
_VkFeatureChain = _vk_struct(("features", _U32 * 55))  # VkPhysicalDeviceFeatures2 (its 55 VkBool32 core features)
_VkFloat16Int8 = _vk_struct(("shaderFloat16", _U32), ("shaderInt8", _U32))  # VkPhysicalDeviceShaderFloat16Int8Features
_Vk16BitStorage = _vk_struct(  # VkPhysicalDevice16BitStorageFeatures
    ("storageBuffer16BitAccess", _U32),
    ("uniformAndStorageBuffer16BitAccess", _U32),
    ("storagePushConstant16", _U32),
    ("storageInputOutput16", _U32),
)
_VK_DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_VK_API_1_1 = (1 << 22) | (1 << 12)


@dataclass(frozen=True)
class VulkanDevice:
    """One physical device as the Vulkan loader reports it."""

    name: str
    type: str  # "discrete", "integrated", "virtual", "cpu" or "other"
    shader_f16: bool | None  # the Vulkan features WebGPU's shader-f16 rests on (float16 arithmetic, 16-bit storage)
    vendor_id: int | None = None  # the PCI vendor id, or a Khronos id for a software driver
    memory_bytes: int | None = None  # its largest device-local memory heap
    max_storage_buffer_range: int | None = None  # the largest storage buffer binding (WebGPU's limit is at most this)


def vulkan_adapters() -> list[VulkanDevice]:
    """Every physical device the Vulkan loader reports, as Dawn will see them (empty without a Vulkan loader)."""
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return []
    app = _VkApplicationInfo(sType=0, apiVersion=_VK_API_1_1)  # VK_STRUCTURE_TYPE_APPLICATION_INFO
    info = _VkInstanceCreateInfo(sType=1, pApplicationInfo=ctypes.pointer(app))
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        vk.vkGetInstanceProcAddr.restype = ctypes.c_void_p
        address = vk.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceFeatures2")
        features2 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(address) if address else None
        found = []
        for handle in handles[: count.value]:
            props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties (~830 bytes)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), props)
            memory = ctypes.create_string_buffer(1024)  # VkPhysicalDeviceMemoryProperties (520 bytes)
            vk.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(handle), memory)
            raw = props.raw
            found.append(
                VulkanDevice(
                    raw[20:276].split(b"\0", 1)[0].decode(errors="replace"),  # deviceName
                    _VK_DEVICE_TYPES.get(_u32(raw, 16), "other"),  # deviceType
                    _shader_f16(features2, handle) if features2 else None,
                    vendor_id=_u32(raw, 8),  # vendorID
                    memory_bytes=_device_local_bytes(memory.raw),
                    max_storage_buffer_range=_u32(raw, 324),  # limits (at 296) .maxStorageBufferRange
                )
            )
        return found
    finally:
        vk.vkDestroyInstance(instance, None)


def _u32(raw: bytes, offset: int) -> int:
    return int.from_bytes(raw[offset : offset + 4], "little")


def _device_local_bytes(raw: bytes) -> int | None:
    """The largest VK_MEMORY_HEAP_DEVICE_LOCAL heap of a VkPhysicalDeviceMemoryProperties (heap count at 260, then
    16 heaps of {VkDeviceSize size; flags} from 264, 16 bytes each)."""
    heaps = [(int.from_bytes(raw[264 + 16 * i : 272 + 16 * i], "little"), _u32(raw, 272 + 16 * i)) for i in range(16)]
    local = [size for size, flags in heaps[: min(_u32(raw, 260), 16)] if flags & 1]
    return max(local) if local else None


def _shader_f16(features2: Any, handle: int) -> bool:
    storage = _Vk16BitStorage(sType=1000083000)
    f16 = _VkFloat16Int8(sType=1000082000, pNext=ctypes.cast(ctypes.pointer(storage), ctypes.c_void_p))
    chain = _VkFeatureChain(sType=1000059000, pNext=ctypes.cast(ctypes.pointer(f16), ctypes.c_void_p))
    features2(ctypes.c_void_p(handle), ctypes.byref(chain))
    return bool(f16.shaderFloat16 and storage.storageBuffer16BitAccess and storage.uniformAndStorageBuffer16BitAccess)


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
    best = min(adapters, key=lambda a: rank[a.type])
    return Adapter(best.name, "software" if best.type == "cpu" else "hardware", "vulkan", note, best.shader_f16)


@dataclass(frozen=True)
class DriverProblem:
    """A hardware Vulkan driver that cannot start, and what would fix it."""

    manifest: str
    library: str
    error: str  # what failed, in words
    missing: tuple[str, ...]  # the shared libraries missing
    packages: tuple[str, ...]  # Debian/Ubuntu packages that provide them


def driver_problems(
    manifests: list[str] | None = None, needs: dict[str, str] = LIBRARY_PACKAGES
) -> list[DriverProblem]:
    """Why a machine with a GPU Vulkan driver gets no WebGPU adapter, per hardware driver manifest: its library, or one
    GPU drivers load at start (``needs``), cannot be loaded (loading only maps a library; nothing starts)."""
    out = []
    for manifest in manifests if manifests is not None else hardware_icd_manifests():
        try:
            library = json.loads(Path(manifest).read_text())["ICD"]["library_path"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            out.append(DriverProblem(manifest, "?", f"unreadable manifest ({exc})", (), ()))
            continue
        path = library if "/" not in library else str((Path(manifest).parent / library).resolve())
        missing = [lib for lib in (path, *needs) if not _loads(lib)]
        if missing:
            packages = tuple(dict.fromkeys(needs[m] for m in missing if m in needs))
            what = ", ".join(missing)
            out.append(DriverProblem(manifest, library, f"{what} cannot be loaded", tuple(missing), packages))
    return out


def _loads(library: str) -> bool:
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True
