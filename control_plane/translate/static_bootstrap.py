"""A PoP's resources as one static Envoy bootstrap, for `envoy --mode validate`.

EDS clusters become STATIC with their ClusterLoadAssignment inlined as `load_assignment`; each
HTTP connection manager's RDS is replaced by its RouteConfiguration inlined as `route_config`;
the RTDS layer (`runtime.py`: the tiers' limits in force) becomes a static runtime layer of the
same name.
Built from `render_json`, so Cluster field 62 (queue policy) reaches Envoy's validation too. The
node's locality zone is the PoP; admin listens on 127.0.0.1, port 0. TLS listeners name their
certificates as static secrets, which hold a stand-in pair the caller gives (renderings never
hold private keys; Envoy checks the listener, not whose certificate it serves).
"""

from __future__ import annotations

import copy
from typing import Any

from control_plane.translate.listeners import HTTP_CONNECTION_MANAGER
from control_plane.translate.render import render_json
from control_plane.translate.resources import PopResources

VALIDATION_NODE_CLUSTER = "ballast-validate"


def static_bootstrap(
    pop_resources: PopResources, stand_in: tuple[bytes, bytes] | None = None
) -> dict[str, Any]:
    """`stand_in`: a (certificate, key) PEM pair every SDS secret is replaced with (renderings
    never hold private keys); without it the bootstrap has no secrets."""
    rendered = render_json(pop_resources)
    clusters = [
        _static_cluster(cluster, rendered["endpoints"][name])
        for name, cluster in rendered["clusters"].items()
    ]
    listeners = [
        _inline_routes(item, rendered["routes"]) for item in rendered["listeners"].values()
    ]
    static: dict[str, Any] = {"listeners": listeners, "clusters": clusters}
    if stand_in is not None and rendered.get("secrets"):
        chain, key = stand_in
        static["secrets"] = [
            {"name": name, "tls_certificate": {
                "certificate_chain": {"inline_string": chain.decode()},
                "private_key": {"inline_string": key.decode()},
            }}
            for name in rendered["secrets"]
        ]
    layers = [{"name": name, "static_layer": runtime["layer"]}
              for name, runtime in rendered.get("runtime", {}).items() if runtime.get("layer")]
    return {
        **({"layered_runtime": {"layers": layers}} if layers else {}),
        "node": {
            "id": f"{VALIDATION_NODE_CLUSTER}-{pop_resources.pop}",
            "cluster": VALIDATION_NODE_CLUSTER,
            "locality": {"zone": pop_resources.pop},
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": static,
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
            rds = hcm.pop("rds", None)
            if rds is not None:  # (a redirecting listener's route is inline already)
                hcm["route_config"] = copy.deepcopy(routes[rds["route_config_name"]])
    chains = [*static.get("filter_chains", []), static.get("default_filter_chain", {})]
    for chain in chains:
        context = chain.get("transport_socket", {}).get("typed_config", {})
        for sds in context.get("common_tls_context", {}).get(
                "tls_certificate_sds_secret_configs", []):
            sds.pop("sds_config", None)  # a static secret, by name
    return static
