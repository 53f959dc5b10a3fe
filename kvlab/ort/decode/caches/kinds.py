"""A cache from its name or its label: ``make_cache("static", 1024)``, or ``make_cache(spec)`` for the ``CacheSpec``
a recorded run carries (its precision, states and ring-buffer variants included)."""

from __future__ import annotations

from ....core.cache import Cache
from ....core.errors import ConfigError, check_choice
from ....core.labels import CacheSpec
from .dynamic import DynamicCache
from .kv_precision import KV_PRECISIONS
from .ring import RingStaticCache
from .static import STATE_MODES, StaticCache

CACHE_KINDS = {"dynamic": DynamicCache, "static": StaticCache}  # the kinds by name
VARIANT_PRECISIONS = {f"kv-{p}": p for p in KV_PRECISIONS}  # a spec's variant part -> its KV precision


def make_cache(spec: str | CacheSpec, max_cache_len: int | None = None, kv_precision: str | None = None) -> Cache:
    """A new cache by kind ("dynamic" or "static"; static needs ``max_cache_len``, which dynamic ignores) or by a
    recorded run's ``CacheSpec``, at ``kv_precision``. Each "+"-joined part of the spec's variant is made or refused,
    never dropped: ``kv-int8`` / ``kv-int4``, ``states-in-place`` / ``states-swap``, ``checked/N``, ``ring``.
    ConfigError for another kind or variant part, a combination the caches refuse, a ``kv_precision`` that differs
    from the spec's, or a static cache without a size."""
    states, ring, check_every = "swap", False, None
    if isinstance(spec, CacheSpec):
        for part in filter(None, spec.variant.split("+")):
            if part in VARIANT_PRECISIONS:
                if kv_precision not in (None, VARIANT_PRECISIONS[part]):
                    raise ConfigError(f"kv_precision={kv_precision!r} differs from the spec's variant {part!r}")
                kv_precision = VARIANT_PRECISIONS[part]
            elif spec.kind != "static":
                raise ConfigError(f"cache spec {spec.name!r}: a {spec.kind} cache has no variant {part!r}")
            elif part.startswith("states-") and part.removeprefix("states-") in STATE_MODES:
                if sum(p.startswith("states-") for p in spec.variant.split("+")) > 1:
                    raise ConfigError(f"cache spec {spec.name!r} names more than one state mode; give one")
                states = part.removeprefix("states-")
            elif part == "ring":
                ring = True
            elif part.startswith("checked/") and part.removeprefix("checked/").isdigit():
                check_every = int(part.removeprefix("checked/"))
            else:
                raise ConfigError(
                    f"cache spec {spec.name!r}: make_cache cannot make the variant {part!r}; it makes "
                    "kv-int8, kv-int4, states-in-place, states-swap, checked/N and ring (a captured graph: "
                    "CapturedStaticCache)"
                )
        spec, max_cache_len = spec.kind, spec.max_cache_len
    check_choice(spec, CACHE_KINDS, "cache type ")
    if spec == "static":
        if max_cache_len is None:
            raise ConfigError("a static cache needs max_cache_len (a positive int)")
        made = RingStaticCache if ring else StaticCache  # a KV precision a ring cannot keep is refused by name
        return made(max_cache_len, check_every, states=states, kv_precision=kv_precision)
    return DynamicCache(kv_precision)
