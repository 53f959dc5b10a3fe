"""The ONNX Runtime backend: models from the onnxruntime-genai builder, devices and sessions (CPU EP, WebGPU EP), the
caches (the static one also with its decode step captured as a WebGPU graph), the step and the generation loop. Four
rooms, each importing only the ones before it: ``models`` <- ``runtime`` <- ``decode`` <- ``checks``. This facade
names the public API; no room imports it."""

from .checks import inspect  # noqa: F401 - it sets the judge of Model.describe (which caches run a model)
from .decode.caches.captured import CapturedStaticCache
from .decode.caches.dynamic import DynamicCache
from .decode.caches.kinds import make_cache
from .decode.caches.ring import RingStaticCache
from .decode.caches.static import StaticCache
from .decode.conversation import Conversation
from .decode.generate import generate
from .decode.stepper import Stepper
from .models.info import ModelInfo
from .models.model import Model, load
from .runtime.device import Device, close_device, open_device, opened

__all__ = [
    "CapturedStaticCache",
    "Conversation",
    "Device",
    "DynamicCache",
    "Model",
    "ModelInfo",
    "RingStaticCache",
    "StaticCache",
    "Stepper",
    "close_device",
    "generate",
    "load",
    "make_cache",
    "open_device",
    "opened",
]
