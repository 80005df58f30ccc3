"""A real Envoy 1.40 for the observe tests: one PoP, one tier cluster with two zoned localities.

Built from Ballast's own ADS bootstrap (node locality, stats tags, metrics_service sink to the
`ballast_xds` cluster), with the dynamic resources replaced by a static listener and a static
`shop.critical` cluster whose localities are zoned `primary` and `secondary` (the origin names).
`translated_edge_bootstrap` inlines a PoP's real translation instead (retrying routes, per-endpoint
stats on the tier clusters).
"""

from __future__ import annotations

from typing import Any

from control_plane.desired.model import Desired, PopWeights
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities

CLUSTER = "shop.critical"


def _endpoint(port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                        "port_value": port}}}}


def _sink_only_bootstrap(pop: str, node_id: str, admin_port: int, sink_port: int) -> dict[str, Any]:
    """Ballast's ADS bootstrap streaming stats to `sink_port` every second, without the dynamic
    resources: the caller puts in static ones."""
    bootstrap = ads_bootstrap(
        node_id=node_id,
        pop=pop,
        xds_port=sink_port,
        admin_port=admin_port,
        stats_flush_interval_ms=1000,
        metrics_sink=True,
    )
    del bootstrap["dynamic_resources"]
    del bootstrap["layered_runtime"]  # its RTDS layer needs the ADS config
    return bootstrap


def edge_bootstrap(
    *,
    pop: str,
    node_id: str,
    admin_port: int,
    listen_port: int,
    sink_port: int,
    origins: dict[str, int],
    max_connections: int = 1024,
    max_pending_requests: int = 1024,
) -> dict[str, Any]:
    bootstrap = _sink_only_bootstrap(pop, node_id, admin_port, sink_port)
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "edge",
        "http_filters": [router],
        "route_config": {"virtual_hosts": [{
            "name": "shop", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER, "timeout": "10s"}}],
        }]},
    }
    bootstrap["static_resources"]["listeners"] = [{
        "name": "edge",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm,
        }]}],
    }]
    bootstrap["static_resources"]["clusters"].append({
        "name": CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "common_lb_config": {"locality_weighted_lb_config": {}},
        "circuit_breakers": {"thresholds": [{
            "max_connections": max_connections, "max_pending_requests": max_pending_requests,
        }]},
        "load_assignment": {"cluster_name": CLUSTER, "endpoints": [
            {"locality": {"zone": name}, "load_balancing_weight": 50,
             "lb_endpoints": [_endpoint(port)]}
            for name, port in origins.items()
        ]},
    })
    return bootstrap


def translated_edge_bootstrap(
    desired: Desired,
    weights: PopWeights,
    *,
    pop: str,
    node_id: str,
    admin_port: int,
    listen_port: int,
    sink_port: int,
    hedges: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Ballast's ADS bootstrap (stats tags, both sinks) with the PoP's translated resources
    inlined statically (`static_bootstrap`): real routes (retries), real tier clusters;
    `hedges`: the hedge share per group (`PopIntent.hedges`)."""
    bootstrap = _sink_only_bootstrap(pop, node_id, admin_port, sink_port)
    static = static_bootstrap(translate_pop(desired, pop, Capabilities(),
                                            PopIntent(weights=weights, hedges=hedges or {})))
    bootstrap["static_resources"]["clusters"].extend(static["static_resources"]["clusters"])
    (listener,) = static["static_resources"]["listeners"]
    listener["address"]["socket_address"]["port_value"] = listen_port
    bootstrap["static_resources"]["listeners"] = [listener]
    return bootstrap
