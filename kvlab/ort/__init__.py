"""The ONNX Runtime backend: devices and sessions (CPU EP, WebGPU EP), models from the onnxruntime-genai builder,
the two caches (and the static one with its decode step captured as a WebGPU graph), the step and the generation
loop."""

from .decode.cache_kinds import make_cache
from .decode.caches import DynamicCache, StaticCache
from .decode.capture import CapturedStaticCache
from .decode.conversation import Conversation
from .decode.generate import generate
from .decode.stepper import Stepper
from .decode.window import RingStaticCache
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
