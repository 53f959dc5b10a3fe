"""kvlab's exceptions. Every message names the offending value and what would be valid."""

from collections.abc import Iterable


class KvlabError(Exception):
    """Base class of every error kvlab raises on purpose."""


class ConfigError(KvlabError, ValueError):
    """A bad argument: wrong type, out of range, unknown name."""


class ModelError(KvlabError):
    """A model directory that is missing, malformed, or unsuitable for what was asked."""


class DeviceError(KvlabError):
    """A device that cannot be used as asked (no adapter, EP did not take the graph, ...)."""


class CapacityError(KvlabError, ValueError):
    """The tokens asked for do not fit in the cache."""


class CacheStateError(KvlabError):
    """A cache used in a state that does not allow it (disposed, in use, bound to another model)."""


class InPlaceError(KvlabError):
    """The runtime did not write a present output into the buffer bound for it."""


def check_choice(value: object, choices: "Iterable[object]", what: str, error: type[Exception] = ConfigError) -> object:
    """``value`` when it is one of ``choices``; else ``error`` naming it: "<what><value> is not valid; choose one
    of (...)" (``what`` is e.g. "device " or "cache_type=")."""
    choices = tuple(choices)
    if isinstance(value, bool) or value not in choices:
        raise error(f"{what}{value!r} is not valid; choose one of {choices}")
    return value


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is a bool; else a ConfigError naming it (a truthy string such as "no" is not a flag)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be True or False")
    return value
