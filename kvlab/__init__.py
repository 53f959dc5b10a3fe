"""kvlab: see and measure what a static KV cache changes in LLM decoding.

The package, layer by layer (each imports only from those above it in this list):

- ``kvlab.core``: the backend-neutral contract: step records, labels, a generation's settings and result, the cache
  contract and lifecycle, errors.
- ``kvlab.presets``: the built-in models as recipes and Hugging Face checkpoints.
- ``kvlab.ort`` and ``kvlab.pytorch``: the backends (ONNX Runtime CPU/WebGPU; transformers on PyTorch).
- ``kvlab.lab``: plots and the notebook dashboard.
- ``kvlab.bench`` and ``kvlab.cli``: benchmarks and the ``kvlab`` command.

The names below (``__all__``) load on first use: ``import kvlab`` itself imports nothing heavy, so that
``python -m kvlab`` handles Ctrl-C (``kvlab.cli``) before ONNX Runtime and numpy load. ``from kvlab import X`` and
``kvlab.X`` work as for eager names; an unknown name is an AttributeError, as for any module.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _interrupted_at_startup(signum: int, frame: object) -> None:
    """Ctrl-C in ``python -m kvlab`` before ``kvlab.cli.main`` handles it (in Python's own import machinery,
    between this package and ``kvlab.__main__``): ``main``'s line and status (130), no traceback. ``main`` puts
    Python's handler back first, so that a Ctrl-C in the command is a KeyboardInterrupt as everywhere else."""
    try:
        sys.stderr.write("kvlab: interrupted\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr gone
        pass
    raise SystemExit(130)


# python -m kvlab ...: sys.argv is ["-m", *the command's arguments] while runpy finds kvlab.__main__
_RUN_AS_COMMAND = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) + 1][-2:] == ["-m", "kvlab"]
if _RUN_AS_COMMAND and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
    signal.signal(signal.SIGINT, _interrupted_at_startup)

# each public name -> the module it is defined in (imported on first use)
_HOMES = {
    "kvlab.core": (
        "COLUMNS CacheSpec CacheStateError CapacityError ConfigError DeviceError DeviceLabel Generation InPlaceError "
        "KvlabError ModelError PromptLookup Recorder Sampling StepRecord Turn"
    ),
    "kvlab.core.cache": "Cache",
    "kvlab.ort.decode.caches.static": "StaticCache",  # the static cache, top to bottom: read this file first
    "kvlab.ort.decode.caches.dynamic": "DynamicCache",
    "kvlab.ort.decode.caches.captured": "CapturedStaticCache",
    "kvlab.ort.decode.caches.ring": "RingStaticCache",
    "kvlab.ort.decode.caches.kinds": "make_cache",
    "kvlab.ort": "Conversation Model ModelInfo Stepper close_device generate load open_device",
}
_LOADED_BEFORE = ("core", "presets", "ort")
_WHERE = {name: module for module, names in _HOMES.items() for name in names.split()}

__all__ = [
    "Cache",
    "DynamicCache",
    "StaticCache",
    "CapturedStaticCache",
    "RingStaticCache",
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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept here (later uses skip this); or one of the
    subpackages that an eager ``import kvlab`` loaded."""
    if name in _LOADED_BEFORE:  # the subpackages ``import kvlab`` used to load: ``kvlab.ort.open_device`` still works
        return importlib.import_module(f"kvlab.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kvlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the not-yet-loaded public ones included."""
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static tools see: the eager imports
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
    from .ort import Conversation, Model, ModelInfo, Stepper, close_device, generate, load, open_device
    from .ort.decode.caches.captured import CapturedStaticCache
    from .ort.decode.caches.dynamic import DynamicCache
    from .ort.decode.caches.kinds import make_cache
    from .ort.decode.caches.ring import RingStaticCache
    from .ort.decode.caches.static import StaticCache
