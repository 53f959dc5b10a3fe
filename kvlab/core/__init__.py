"""The backend-neutral contract: step records and their column docs, labels as data, a generation's settings and
result, the cache contract and lifecycle, errors."""

from .cache import Cache
from .conversation import Turn
from .errors import CacheStateError, CapacityError, ConfigError, DeviceError, InPlaceError, KvlabError, ModelError
from .frames import Recorder
from .generation import Generation, Sampling
from .labels import Adapter, CacheSpec, DeviceLabel
from .layout import CacheLayout, KVLayout, LayerSpec, MemoryReport
from .lookup import PromptLookup
from .records import COLUMNS, CacheStep, StepRecord

__all__ = [
    "Adapter",
    "COLUMNS",
    "Cache",
    "CacheSpec",
    "CacheStateError",
    "CacheStep",
    "CapacityError",
    "ConfigError",
    "DeviceError",
    "DeviceLabel",
    "Generation",
    "InPlaceError",
    "CacheLayout",
    "KVLayout",
    "KvlabError",
    "LayerSpec",
    "MemoryReport",
    "ModelError",
    "PromptLookup",
    "Recorder",
    "Sampling",
    "StepRecord",
    "Turn",
]
