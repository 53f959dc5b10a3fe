"""The backend-neutral contract: a cache (``cache``: its slots, one step transaction, its life; ``slots``: the slot
protocol; ``cache_layout``: what a model's layers keep and what a static cache reserves), per-step records and their
column docs (``records``, ``frames``), labels as data, a generation's settings and result, a conversation's history,
prompt lookup, the guards that keep a step whole, errors.

Imports: the standard library, numpy (pandas and psutil where a function needs them) and itself; no other kvlab
package, and no backend.
"""

from .cache import Cache
from .cache_layout import CacheLayout, LayerSpec, MemoryReport
from .conversation import Turn
from .errors import CacheStateError, CapacityError, ConfigError, DeviceError, InPlaceError, KvlabError, ModelError
from .frames import Recorder
from .generation import Generation, Sampling
from .labels import Adapter, CacheSpec, DeviceLabel
from .lookup import PromptLookup
from .records import COLUMNS, CacheStep, StepRecord

__all__ = [
    "Adapter",
    "COLUMNS",
    "Cache",
    "CacheLayout",
    "CacheSpec",
    "CacheStateError",
    "CacheStep",
    "CapacityError",
    "ConfigError",
    "DeviceError",
    "DeviceLabel",
    "Generation",
    "InPlaceError",
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
