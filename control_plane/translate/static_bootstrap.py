"""A PoP's resources as one static Envoy bootstrap, for `envoy --mode validate`.

EDS clusters become STATIC with their ClusterLoadAssignment inlined as `load_assignment`; each
HTTP connection manager's RDS is replaced by its RouteConfiguration inlined as `route_config`.
Built from `render_json`, so Cluster field 62 (queue policy) reaches Envoy's validation too. The
node's locality zone is the PoP; admin listens on 127.0.0.1, port 0.
"""

from __future__ import annotations

import copy
from typing import Any

from control_plane.translate.listeners import HTTP_CONNECTION_MANAGER
from control_plane.translate.render import render_json
from control_plane.translate.resources import PopResources

VALIDATION_NODE_CLUSTER = "ballast-validate"


def static_bootstrap(pop_resources: PopResources) -> dict[str, Any]:
    rendered = render_json(pop_resources)
    clusters = [
        _static_cluster(cluster, rendered["endpoints"][name])
        for name, cluster in rendered["clusters"].items()
    ]
    listeners = [
        _inline_routes(item, rendered["routes"]) for item in rendered["listeners"].values()
    ]
    return {
        "node": {
            "id": f"{VALIDATION_NODE_CLUSTER}-{pop_resources.pop}",
            "cluster": VALIDATION_NODE_CLUSTER,
            "locality": {"zone": pop_resources.pop},
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def _static_cluster(cluster: dict[str, Any], load_assignment: dict[str, Any]) -> dict[str, Any]:
    static = copy.deepcopy(cluster)
    static.pop("eds_cluster_config", None)
    static["type"] = "STATIC"
    static["load_assignment"] = copy.deepcopy(load_assignment)
    return static


def _inline_routes(listener: dict[str, Any], routes: dict[str, Any]) -> dict[str, Any]:
    static = copy.deepcopy(listener)
    for chain in static.get("filter_chains", []):
        for network_filter in chain.get("filters", []):
            if network_filter.get("name") != HTTP_CONNECTION_MANAGER:
                continue
            hcm = network_filter["typed_config"]
            rds = hcm.pop("rds")
            hcm["route_config"] = copy.deepcopy(routes[rds["route_config_name"]])
    return static
