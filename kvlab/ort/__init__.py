"""The ONNX Runtime backend: devices and sessions (CPU EP, WebGPU EP), models from the onnxruntime-genai builder,
the two caches, the step and the generation loop."""

from .caches import DynamicCache, StaticCache, make_cache
from .device import Device, close_device, open_device, opened
from .generate import generate
from .models import Model, ModelInfo, load
from .stepper import Stepper

__all__ = ["Device", "DynamicCache", "Model", "ModelInfo", "StaticCache", "Stepper", "close_device", "generate",
           "load", "make_cache", "open_device", "opened"]
