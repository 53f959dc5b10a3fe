"""kvlab: see and measure what a static KV cache changes in LLM decoding."""

from .caches import Cache, DynamicCache, StaticCache, make_cache
from .errors import (CacheStateError, CapacityError, ConfigError, DeviceError, InPlaceError, KvlabError,
                     ModelError)
from .generate import Generation, Sampling, Stepper, generate
from .instrument import COLUMNS, Recorder, StepRecord
from .models import Model, ModelInfo, load
from .runtime import close_device, open_device

__version__ = "0.1.0"
__all__ = [
    "Cache", "DynamicCache", "StaticCache", "make_cache", "generate", "Generation", "Sampling", "Stepper",
    "Recorder", "StepRecord", "COLUMNS", "load", "Model", "ModelInfo", "open_device", "close_device",
    "KvlabError", "ConfigError", "ModelError", "DeviceError", "CapacityError", "CacheStateError", "InPlaceError",
]
