"""Serving every node of a PoP as if it had other capabilities: how a test makes a real Envoy
NACK what it lacks (adaptive LIFO, which no Envoy release has), or shows what such nodes get.

The product has no such switch: the output cache serves what nodes advertise. This wraps one
cache's `effective_capabilities` (the one place the ADS streams and the admin API ask), and
wakes the PoP's streams through the push hub so that they are served again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from control_plane.ads.snapshots import EffectiveCapabilities
from control_plane.translate.resources import Capabilities

_FORCED: WeakKeyDictionary[Any, dict[str, Capabilities]] = WeakKeyDictionary()


def force_capabilities(
    cache: Any, pop: str, caps: Capabilities | None,
    wake: Callable[[frozenset[str]], None] | None = None,
) -> None:
    """Serve `pop`'s nodes with `caps` (None: with what they advertise again); `wake`: the
    push hub's `changed`, so that connected streams are served at once."""
    forced = _FORCED.get(cache)
    if forced is None:
        forced = _FORCED[cache] = {}
        advertised = cache.effective_capabilities

        def effective(pop: str, caps: Capabilities, why: str = "node.extensions"
                      ) -> EffectiveCapabilities:
            if pop in forced:
                return EffectiveCapabilities(forced[pop], f"override for PoP {pop}")
            return advertised(pop, caps, why)  # type: ignore[no-any-return]

        cache.effective_capabilities = effective
    if caps is None:
        forced.pop(pop, None)
    else:
        forced[pop] = caps
    if wake is not None:
        wake(frozenset({pop}))
