"""Translate the desired state into the Envoy resources of one PoP (pure: no I/O, no clocks)."""

from __future__ import annotations

from collections.abc import Mapping

from control_plane.desired.model import Desired, GroupWeights, TierActions
from control_plane.translate.clusters import cluster_name, tier_cluster
from control_plane.translate.endpoints import load_assignment
from control_plane.translate.listeners import listener
from control_plane.translate.queue_policy import choose_queue_policy
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
    PopResources,
    Resource,
)
from control_plane.translate.routes import route_configuration
from control_plane.translate.weights import resolve_weights


class UnknownPop(LookupError):
    """A PoP the desired state does not define."""


def translate_pop(
    desired: Desired,
    pop: str,
    weights: Mapping[str, GroupWeights],
    caps: Capabilities,
    tier_actions: Mapping[str, TierActions] | None = None,
) -> PopResources:
    """Clusters and endpoints per (origin group, tier), listeners and routes, for one PoP.

    `weights`: origin group -> origin -> weight (sum 100); a group missing from it starts from
    its home weights. `caps` decides adaptive LIFO vs FIFO; every fallback is in `notes`.
    `tier_actions`: origin group -> the tier actions active in this PoP (demotion, shedding;
    see `routes.py`); only the routes change.
    The Cluster message carries field 62 (queue policy) among its unknown fields, so its
    payload, version and re-serializations include it. Raises `UnknownPop` for a PoP not in
    `desired` and `WeightsError` for weights that do not fit it.
    """
    if pop not in desired.pop_names:
        raise UnknownPop(f"unknown PoP {pop!r}; known: {', '.join(desired.pop_names)}")
    the_pop = desired.pop(pop)
    pop_weights = resolve_weights(desired, pop, weights)
    clusters: dict[str, Resource] = {}
    endpoints: dict[str, Resource] = {}
    notes: list[str] = []
    for group in desired.origin_groups:
        for tier in group.tiers:
            name = cluster_name(group.name, tier.name)
            choice = choose_queue_policy(name, tier, caps)
            if choice.fallback_note is not None:
                notes.append(choice.fallback_note)
            clusters[name] = Resource.of(CLUSTER_TYPE, name, tier_cluster(group, tier, choice))
            endpoints[name] = Resource.of(
                ENDPOINT_TYPE, name, load_assignment(name, group, pop_weights[group.name])
            )
    trusted = desired.trusted_priority_sources
    listeners = {
        item.name: Resource.of(LISTENER_TYPE, item.name, listener(item, the_pop, trusted))
        for item in desired.listeners
    }
    routes = {
        item.name: Resource.of(
            ROUTE_TYPE, item.name, route_configuration(desired, item, pop, tier_actions)
        )
        for item in desired.listeners
    }
    if trusted:
        for item in desired.listeners:
            config = route_configuration(desired, item, pop, tier_actions, trusted=True)
            routes[config.name] = Resource.of(ROUTE_TYPE, config.name, config)
    return PopResources(
        pop=pop,
        capabilities=caps,
        by_type={
            CLUSTER_TYPE: clusters,
            ENDPOINT_TYPE: endpoints,
            LISTENER_TYPE: listeners,
            ROUTE_TYPE: routes,
        },
        notes=tuple(notes),
    )

