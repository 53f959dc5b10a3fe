"""kvlab's exceptions. Every message names the offending value and what would be valid."""

import numbers
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


def check_int(
    value: object, name: str, least: int | None = None, most: int | None = None, *, subject: str = "", note: str = ""
) -> int:
    """``value`` as a Python int when it is an integer (Python's or numpy's; not a bool, not a float) from ``least``
    to ``most`` (either bound may be None); else a ConfigError: "<subject> must be <the rule><note>", the subject
    being "<name>=<value>" unless given (e.g. "crop(7): n")."""
    if least is not None and most is not None:
        rule = f"an int from {least} to {most}"
    elif least is not None:
        rule = "a positive int" if least == 1 else f"an int >= {least}"
    else:
        rule = "an int" if most is None else f"an int <= {most}"
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or (least is not None and value < least)
        or (most is not None and value > most)
    ):
        raise ConfigError(f"{subject or f'{name}={value!r}'} must be {rule}{note}")
    return int(value)
