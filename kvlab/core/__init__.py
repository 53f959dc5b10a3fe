"""The backend-neutral contract: step records and their column docs, labels as data, a generation's settings and
result, the cache contract and lifecycle, errors."""

from .cache import Cache
from .errors import (CacheStateError, CapacityError, ConfigError, DeviceError, InPlaceError, KvlabError,
                     ModelError)
from .generation import Generation, Sampling
from .labels import Adapter, CacheSpec, DeviceLabel
from .frames import Recorder
from .layout import KVLayout, MemoryReport
from .records import COLUMNS, CacheStep, StepRecord

__all__ = ["Adapter", "COLUMNS", "Cache", "CacheSpec", "CacheStateError", "CacheStep", "CapacityError", "ConfigError",
           "DeviceError", "DeviceLabel", "Generation", "InPlaceError", "KVLayout", "KvlabError", "MemoryReport",
           "ModelError", "Recorder", "Sampling", "StepRecord"]
