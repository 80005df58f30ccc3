"""Which origin an Envoy host stat is about: (tier cluster, "address:port") -> (group, origin).

Per-endpoint stats (`track_cluster_stats.per_endpoint_stats`, set on every tier cluster) name a
host by its cluster and socket address only, e.g. `envoy.cluster_name="shop.critical"`,
`envoy.endpoint_address="10.0.0.5:443"`; the desired state is what says that address is origin
`primary` of group `shop`. During a rollout PoPs serve different desired states (an origin only
the previous version has, an address that moved), so a PoP's stats map through the desired state
that PoP serves (`ServedEndpoints`). Pure: the sources rebuild the maps whenever what is served
changes (a reload, a rollout's wave, rollback or supersede).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from control_plane.desired.model import Desired
from control_plane.translate.clusters import cluster_name

EndpointKey = tuple[str, str]  # (tier cluster, "address:port" as Envoy prints it)
OriginKey = tuple[str, str]  # (origin group, origin)
EndpointOrigins = dict[EndpointKey, OriginKey]


def endpoint_address(address: str, port: int) -> str:
    """How Envoy prints a socket address: `10.0.0.5:443`, `[::1]:443`."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{port}"


def endpoint_origins(desired: Desired | None) -> EndpointOrigins:
    """Every tier cluster's endpoints -> (group, origin); {} without a desired state.

    Two origins of one group at the same address:port cannot be told apart by host stats: the
    first keeps the address (the validator should not let that happen anyway).
    """
    if desired is None:
        return {}
    mapping: EndpointOrigins = {}
    for group in desired.origin_groups:
        for tier in group.tiers:
            cluster = cluster_name(group.name, tier.name)
            for origin in group.origins:
                key = (cluster, endpoint_address(origin.address, origin.port))
                mapping.setdefault(key, (group.name, origin.name))
    return mapping


def tier_clusters(desired: Desired) -> tuple[str, ...]:
    """Every tier cluster (`<group>.<tier>`) of the desired state."""
    return tuple(cluster_name(g.name, t.name) for g in desired.origin_groups for t in g.tiers)


@dataclass(frozen=True)
class ServedEndpoints:
    """Per PoP, the endpoint map and tier clusters of the desired state it serves: the target's
    for every PoP but those a rollout has not reached (or rolled back), which have their own."""

    endpoints: EndpointOrigins = field(default_factory=dict)
    clusters: tuple[str, ...] = ()
    by_pop: Mapping[str, tuple[EndpointOrigins, tuple[str, ...]]] = field(default_factory=dict)

    def of(self, pop: str) -> EndpointOrigins:
        """(tier cluster, address) -> (group, origin) for `pop`'s host stats."""
        held = self.by_pop.get(pop)
        return self.endpoints if held is None else held[0]

    def tier_clusters(self, pop: str) -> tuple[str, ...]:
        """`pop`'s tier clusters."""
        held = self.by_pop.get(pop)
        return self.clusters if held is None else held[1]


def served_endpoints(desired: Desired | None,
                     serving: Mapping[str, Desired] | None = None) -> ServedEndpoints:
    """The maps of `desired` (the target) and of each PoP in `serving` (PoP -> the desired state
    it serves instead, as the running intent holds it), each version's built once."""
    if desired is None:
        return ServedEndpoints()
    built: dict[str, tuple[EndpointOrigins, tuple[str, ...]]] = {}

    def maps(version: Desired) -> tuple[EndpointOrigins, tuple[str, ...]]:
        if version.digest not in built:
            built[version.digest] = (endpoint_origins(version), tier_clusters(version))
        return built[version.digest]

    endpoints, clusters = maps(desired)
    return ServedEndpoints(endpoints, clusters,
                           {pop: maps(version) for pop, version in (serving or {}).items()})
