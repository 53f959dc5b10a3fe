"""The ONNX Runtime backend: devices and sessions (CPU EP, WebGPU EP), models from the onnxruntime-genai builder,
the two caches (and the static one with its decode step captured as a WebGPU graph), the step and the generation
loop."""

from .caches import DynamicCache, StaticCache, make_cache
from .capture import CapturedStaticCache
from .device import Device, close_device, open_device, opened
from .generate import generate
from .models import Model, ModelInfo, load
from .stepper import Stepper

__all__ = [
    "CapturedStaticCache",
    "Device",
    "DynamicCache",
    "Model",
    "ModelInfo",
    "StaticCache",
    "Stepper",
    "close_device",
    "generate",
    "load",
    "make_cache",
    "open_device",
    "opened",
]
