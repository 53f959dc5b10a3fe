"""kvlab: see and measure what a static KV cache changes in LLM decoding.

The package, layer by layer (each imports only from those above it in this list):

- ``kvlab.core``: the backend-neutral contract: step records, labels, a generation's settings and result, the cache
  contract and lifecycle, errors.
- ``kvlab.presets``: the built-in models as recipes and Hugging Face checkpoints.
- ``kvlab.ort`` and ``kvlab.pytorch``: the backends (ONNX Runtime CPU/WebGPU; transformers on PyTorch).
- ``kvlab.lab``: plots and the notebook dashboard.
- ``kvlab.bench`` and ``kvlab.cli``: benchmarks and the ``kvlab`` command.
"""

from .core import (
    COLUMNS,
    CacheSpec,
    CacheStateError,
    CapacityError,
    ConfigError,
    DeviceError,
    DeviceLabel,
    Generation,
    InPlaceError,
    KvlabError,
    ModelError,
    PromptLookup,
    Recorder,
    Sampling,
    StepRecord,
    Turn,
)
from .core.cache import Cache
from .ort import (
    CapturedStaticCache,
    Conversation,
    DynamicCache,
    Model,
    ModelInfo,
    StaticCache,
    Stepper,
    close_device,
    generate,
    load,
    make_cache,
    open_device,
)

__version__ = "0.1.0"
__all__ = [
    "Cache",
    "DynamicCache",
    "StaticCache",
    "CapturedStaticCache",
    "make_cache",
    "generate",
    "Conversation",
    "Turn",
    "PromptLookup",
    "Generation",
    "Sampling",
    "Stepper",
    "Recorder",
    "StepRecord",
    "COLUMNS",
    "load",
    "Model",
    "ModelInfo",
    "open_device",
    "close_device",
    "CacheSpec",
    "DeviceLabel",
    "KvlabError",
    "ConfigError",
    "ModelError",
    "DeviceError",
    "CapacityError",
    "CacheStateError",
    "InPlaceError",
]
