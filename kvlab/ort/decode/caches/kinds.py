"""A cache from its name or its label: ``make_cache("static", 1024)``, or ``make_cache(spec)`` for the ``CacheSpec``
a recorded run carries (its precision, states and ring-buffer variants included)."""

from __future__ import annotations

from ....core.cache import Cache
from ....core.errors import ConfigError, check_choice
from ....core.labels import CacheSpec
from .dynamic import DynamicCache
from .kv_precision import KV_PRECISIONS
from .ring import RingStaticCache
from .static import StaticCache

CACHE_KINDS = {"dynamic": DynamicCache, "static": StaticCache}  # the kinds by name


def make_cache(spec: str | CacheSpec, max_cache_len: int | None = None, kv_precision: str | None = None) -> Cache:
    """A new cache by kind ("dynamic" or "static"; static needs ``max_cache_len``, which a dynamic cache, having no
    size, ignores: a lab can pass one size for either kind) or by the ``CacheSpec`` a recorded run carries (its
    ``kv-int8`` / ``kv-int4``, ``states-in-place`` and ``ring`` variants included), at ``kv_precision``. ConfigError
    for another kind, or a static cache without a size."""
    states, ring = "swap", False
    if isinstance(spec, CacheSpec):
        states = "in-place" if spec.kind == "static" and "states-in-place" in spec.variant else states
        ring = spec.kind == "static" and "ring" in spec.variant.split("+")
        kv_precision = next((p for p in KV_PRECISIONS if f"kv-{p}" in spec.variant), kv_precision)
        spec, max_cache_len = spec.kind, spec.max_cache_len
    check_choice(spec, CACHE_KINDS, "cache type ")
    if spec == "static":
        if max_cache_len is None:
            raise ConfigError("a static cache needs max_cache_len (a positive int)")
        if ring:  # a KV precision it cannot keep is refused by name, never dropped
            return RingStaticCache(max_cache_len, states=states, kv_precision=kv_precision)
        return StaticCache(max_cache_len, states=states, kv_precision=kv_precision)
    return DynamicCache(kv_precision)
