"""Which origin an Envoy host stat is about: (tier cluster, "address:port") -> (group, origin).

Per-endpoint stats (`track_cluster_stats.per_endpoint_stats`, set on every tier cluster) name a
host by its cluster and socket address only, e.g. `envoy.cluster_name="shop.critical"`,
`envoy.endpoint_address="10.0.0.5:443"`; the desired state is what says that address is origin
`primary` of group `shop`. Pure: the sources rebuild the map whenever the desired state changes.
"""

from __future__ import annotations

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
