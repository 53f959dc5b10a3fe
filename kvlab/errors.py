"""kvlab's exceptions. Every message names the offending value and what would be valid."""


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
