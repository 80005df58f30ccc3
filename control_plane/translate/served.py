"""What the output cache translates from: the running intent as the change transaction hands it
over (`Served`), plain values per PoP — the desired state it serves and what it takes from the
running intent (`PopIntent`) — so the cache (`ads/`) builds what it serves by calling this room
alone, never what sits above it.

The change transaction makes a new `Served` for each change from the last one, anew only for
the PoPs the change touches (`intent/served.py`), and hands it to the cache with the output it
prepared; the cache builds from it the (PoP, capability key) entries no node asked for yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from control_plane.desired.model import Desired
from control_plane.translate.pop import PopIntent, UnknownPop, translate_pop
from control_plane.translate.resources import Capabilities, PopResources

EMPTY = PopIntent()


@dataclass(frozen=True)
class Served:
    """Every PoP served: in order, each with the desired state it serves (during a rollout, maybe
    not the target) and what its translation takes from the running intent; and the HTTP filter
    types any of those desired states adds (what a node's capabilities are narrowed to)."""

    pop_names: tuple[str, ...]
    desired: Mapping[str, Desired]
    intents: Mapping[str, PopIntent] = field(default_factory=dict)
    added_filters: frozenset[str] = frozenset()

    def intent_of(self, pop: str) -> PopIntent:
        return self.intents.get(pop, EMPTY)


def translate_served(served: Served, pop: str, caps: Capabilities,
                     previous: PopResources | None = None) -> PopResources:
    """What nodes of `pop` with `caps` get (incrementally from `previous`, when given:
    byte-identical to the full translation). Raises `UnknownPop` for a PoP not served."""
    if pop not in served.desired:
        raise UnknownPop(f"unknown PoP {pop!r}; known: {', '.join(served.pop_names)}")
    return translate_pop(served.desired[pop], pop, caps, served.intent_of(pop),
                         previous=previous)


def served_pops(served: Served) -> tuple[str, ...]:
    return served.pop_names


def used_capabilities(served: Served, caps: Capabilities) -> Capabilities:
    """A node's capabilities as far as what is served uses them: of the HTTP filter types its
    Envoy lacks, only those the desired states add (nodes that lack only filters nobody added
    share one translation with those that have them)."""
    if not caps.missing_filters:
        return caps
    used = caps.missing_filters & served.added_filters
    return caps if used == caps.missing_filters else replace(caps, missing_filters=used)
