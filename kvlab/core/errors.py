"""kvlab's exceptions. Every message names the offending value and what would be valid, and stays readable: a user's
value echoed in it (a prompt, a path, a ``--set`` value) is clipped to ``VALUE_CHARS`` characters, once, here."""

import numbers
import re
from collections.abc import Iterable

VALUE_CHARS = 200  # the most characters of one echoed value a message keeps
MESSAGE_CHARS = 2000  # the most characters of a whole message
_QUOTED = re.compile(rf"'[^'\n]{{{VALUE_CHARS},}}'|\"[^\"\n]{{{VALUE_CHARS},}}\"")


def clip(text: str, most: int = VALUE_CHARS) -> str:
    """``text`` when it has at most ``most`` characters; else its head and tail around a note of how many
    characters were left out (so a 1 MB prompt or path reads as one line)."""
    if len(text) <= most:
        return text
    tail = most // 5
    return f"{text[: most - tail]}...[{len(text) - most} characters left out]...{text[len(text) - tail :]}"


def clip_message(message: str) -> str:
    """``message`` as it is up to half of ``MESSAGE_CHARS``; longer, every quoted value longer than ``VALUE_CHARS``
    clipped, then the whole clipped to ``MESSAGE_CHARS``."""
    if len(message) <= MESSAGE_CHARS // 2:  # a message of kvlab's own length: its quotes may span words
        return message
    message = _QUOTED.sub(lambda m: m.group(0)[0] + clip(m.group(0)[1:-1]) + m.group(0)[-1], message)
    return clip(message, MESSAGE_CHARS)


class KvlabError(Exception):
    """Base class of every error kvlab raises on purpose. Its message (the first argument, when a string) is
    clipped as the module says; the other arguments are kept as given."""

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (clip_message(args[0]), *args[1:])
        super().__init__(*args)


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
