"""Envoy bootstraps: the ADS bootstrap edge proxies start from (templates in
`bootstrap_templates.py`)."""

from __future__ import annotations

import ipaddress
import json
import posixpath
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from control_plane.translate.bootstrap_templates import TEMPLATES
from control_plane.translate.capabilities import (
    ACCESS_LOG_METADATA,
    ENVOY_RELEASES,
    LOAD_REPORTS_METADATA,
    NEWEST_RELEASE,
)
from control_plane.translate.listeners import XDS_CLUSTER

# Downstream connections an Envoy accepts at once (overload manager), per template: an edge
# proxy serves the Internet, a sidecar one host's applications.
MAX_CONNECTIONS = {"edge": 50_000, "sidecar": 1024}
STATS_LISTENER = "ballast_stats"
ADMIN_CLUSTER = "ballast_admin"
STATS_PATH = "/stats/prometheus"


@dataclass(frozen=True)
class XdsClientTls:
    """The node's side of mTLS to Ballast: its certificate and key, and the CA that signed
    Ballast's certificate (paths as Envoy will open them).

    With `sds_file`, Envoy reads all three through file-based SDS: that file holds the Secret
    `XDS_CLIENT_SECRET` names (the certificate and key by path), `ca_sds_file` the one
    `XDS_SERVER_CA_SECRET` names (the CA); Envoy reads a Secret's files again, together, when a
    file or directory is renamed into its watched directory (`watch_dir`, `ca_watch_dir`;
    default the files' own). New connections to Ballast then use them, without a restart.
    Renaming one file at a time leaves Envoy a moment with a key that is not its certificate's
    (it refuses that pair and logs `KEY_VALUES_MISMATCH`); a directory reached through a
    symbolic link, whose parent is watched, changes all of them in one rename
    (deploy/README.md, "Rotate certificates"). Without `sds_file` they are read once, at start.
    """

    cert: str
    key: str
    ca: str
    sds_file: str | None = None
    watch_dir: str | None = None
    ca_watch_dir: str | None = None

    @property
    def ca_sds_file(self) -> str | None:
        """The CA's SDS file, beside the certificate's: NAME.ca.sds.json for NAME.sds.json."""
        if self.sds_file is None:
            return None
        if self.sds_file.endswith(".sds.json"):
            return self.sds_file.removesuffix(".sds.json") + ".ca.sds.json"
        root, ext = posixpath.splitext(self.sds_file)
        return f"{root}.ca{ext}"


XDS_CLIENT_SECRET = "ballast_xds_client"
XDS_SERVER_CA_SECRET = "ballast_xds_ca"
SECRET_TYPE_URL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


def xds_client_sds(tls: XdsClientTls) -> dict[str, Any]:
    """The certificate's file-based SDS file (a DiscoveryResponse as JSON): the node's
    certificate and key by path, re-read together when a file is renamed into the watched
    directory."""
    return {"resources": [{
        "@type": SECRET_TYPE_URL,
        "name": XDS_CLIENT_SECRET,
        "tls_certificate": {
            "certificate_chain": {"filename": tls.cert},
            "private_key": {"filename": tls.key},
            "watched_directory": {"path": tls.watch_dir or posixpath.dirname(tls.cert)},
        },
    }]}


def xds_server_ca_sds(tls: XdsClientTls) -> dict[str, Any]:
    """The CA's file-based SDS file: the CA Ballast's certificate must chain to, re-read when a
    file is renamed into its watched directory (a CA rollover without restarting Envoy)."""
    return {"resources": [{
        "@type": SECRET_TYPE_URL,
        "name": XDS_SERVER_CA_SECRET,
        "validation_context": {
            "trusted_ca": {"filename": tls.ca},
            "watched_directory": {"path": tls.ca_watch_dir or posixpath.dirname(tls.ca)},
        },
    }]}


def add_failover_replicas(cluster: dict[str, Any], replicas: Sequence[tuple[str, int]]) -> None:
    """Replicas at priority 1 of the xDS cluster, and the health check that lets Envoy leave a
    dead preferred replica (without one, Envoy would keep choosing it). `no_traffic_interval`
    too: an xDS cluster's only traffic is its long-lived stream."""
    cluster["load_assignment"]["endpoints"].append({
        "priority": 1,
        "lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
            for host, port in replicas
        ],
    })
    cluster["health_checks"] = [{
        "timeout": "1s",
        "interval": "1s",
        "no_traffic_interval": "1s",
        "unhealthy_threshold": 1,
        "healthy_threshold": 2,
        "tcp_health_check": {},
    }]


def ads_bootstrap(
    *,
    node_id: str,
    pop: str,
    xds_host: str = "127.0.0.1",
    xds_port: int = 18000,
    admin_port: int = 9901,
    delta: bool = False,
    node_cluster: str = "ballast-edge",
    stats_flush_interval_ms: int = 5000,
    metrics_sink: bool = False,
    needed_stats_only: bool = False,
    template: str = "edge",
    envoy_release: str = NEWEST_RELEASE,
    tls: XdsClientTls | None = None,
    xds_replicas: Sequence[tuple[str, int]] = (),
    max_connections: int | None = None,
    stats_listener: tuple[str, int] | None = None,
    load_reports: bool = False,
) -> dict[str, Any]:
    """A bootstrap for one Envoy of `pop`, streaming config (and, if asked, stats and sampled
    access logs: node metadata `ballast_access_log`) to Ballast.

    `xds_replicas` are further Ballast replicas (host, port): the first address is preferred
    (priority 0), the replicas take over (priority 1) while a TCP health check finds it down, so
    an Envoy whose replica dies reconnects to another within a few seconds.

    `envoy_release` (a key of `ENVOY_RELEASES`, `KeyError` otherwise) is the Envoy that loads it:
    releases without the OTel sink's DropAction get a sink without the drop matcher.

    `needed_stats_only` adds a stats matcher: Envoy then keeps only the stats Ballast reads
    (see `NEEDED_STATS`) plus the basics an operator looks at, so every flush stays small.

    `max_connections` caps downstream connections (default per template, `MAX_CONNECTIONS`).
    `stats_listener` (host, port) adds a listener serving only `/stats/prometheus` from the
    admin (which stays on loopback), for a central Prometheus: see `stats_listener`.
    `load_reports` streams load reports (LRS) to Ballast over the xDS cluster
    (`cluster_manager.load_stats_config`: Envoy reports only where the bootstrap asks).
    """
    text = TEMPLATES[template]
    filled = string.Template(text).substitute(
        node_id=_yaml_str(node_id),
        node_cluster=_yaml_str(node_cluster),
        pop=_yaml_str(pop),
        admin_port=int(admin_port),
        api_type="DELTA_GRPC" if delta else "GRPC",
        xds_host=_yaml_str(xds_host),
        xds_port=int(xds_port),
        stats_flush_interval=f"{stats_flush_interval_ms / 1000:g}s",
        max_connections=int(max_connections or MAX_CONNECTIONS.get(template, 1024)),
    )
    bootstrap: dict[str, Any] = yaml.safe_load(filled)
    if stats_listener is not None:
        listener, cluster = stats_listener_resources(*stats_listener, admin_port=int(admin_port))
        bootstrap["static_resources"].setdefault("listeners", []).append(listener)
        bootstrap["static_resources"]["clusters"].append(cluster)
    if tls is not None:
        _xds_cluster(bootstrap)["transport_socket"] = xds_transport_socket(tls, xds_host)
    if xds_replicas:
        _add_replicas(bootstrap, xds_replicas)
    if metrics_sink:
        _add_metrics_sinks(bootstrap, envoy_release)
    if load_reports:
        _add_load_reports(bootstrap)
    if needed_stats_only:
        matcher = {"inclusion_list": {"patterns": [{"safe_regex": {"regex": r}}
                                                   for r in NEEDED_STATS]}}
        bootstrap.setdefault("stats_config", {})["stats_matcher"] = matcher
    return bootstrap


def _xds_cluster(bootstrap: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = next(c for c in bootstrap["static_resources"]["clusters"]
                                   if c["name"] == XDS_CLUSTER)
    return cluster


def _add_replicas(bootstrap: dict[str, Any], replicas: Sequence[tuple[str, int]]) -> None:
    add_failover_replicas(_xds_cluster(bootstrap), replicas)
    # a lost replica is left for another quickly: Envoy's own stream back-off would grow while it
    # still tries the dead one
    for service in bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]:
        service["envoy_grpc"]["retry_policy"] = {
            "retry_back_off": {"base_interval": "0.25s", "max_interval": "2s"}}


def _add_metrics_sinks(bootstrap: dict[str, Any], envoy_release: str) -> None:
    bootstrap["stats_sinks"] = [
        {
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "emit_tags_as_labels": True,
                # Histograms only (no Summary copy): halves the histogram payload.
                "histogram_emit_mode": "HISTOGRAM",
                "grpc_service": {"envoy_grpc": {"cluster_name": XDS_CLUSTER}},
            },
        },
        host_stats_sink(drop_others=ENVOY_RELEASES[envoy_release].otel_drop_action),
    ]
    # Asks Ballast for listeners with the gRPC access log (the measured pool wait).
    bootstrap["node"].setdefault("metadata", {})[ACCESS_LOG_METADATA] = True


def _add_load_reports(bootstrap: dict[str, Any]) -> None:
    bootstrap.setdefault("cluster_manager", {})["load_stats_config"] = {
        "api_type": "GRPC", "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}]}
    # Envoy refuses clusters with per-endpoint stats once it reports load: Ballast leaves them
    # out for nodes that say so
    bootstrap["node"].setdefault("metadata", {})[LOAD_REPORTS_METADATA] = True


# Full stat names (before tag extraction) Envoy keeps with `needed_stats_only`. Envoy's regex
# matchers must match the WHOLE name (RE2 full match), hence the trailing `.*`. Tier clusters are
# `<group>.<tier>` (names without dots), so `cluster\.[^.]+\.[^.]+\.` is a tier cluster.
# Per-endpoint stats are not in the stats store and are not affected.
NEEDED_STATS: tuple[str, ...] = (
    r"cluster\.[^.]+\.[^.]+\.zone\..*",  # per (PoP, origin): codes, completed, latency
    r"cluster\.[^.]+\.[^.]+\.(upstream_rq_(pending_active|pending_overflow|active|total|retry"
    r"|completed|time|[0-9]xx)|upstream_queue_overloaded|upstream_cx_connect_fail"
    r"|membership_(healthy|total))",
    r"control_plane\..*",  # xDS connection state, rejected updates
    r"(server|cluster_manager|listener_manager)\..*",
    r"http\.[^.]+\.downstream_rq_.*",
)


def host_stats_sink(*, drop_others: bool = True) -> dict[str, Any]:
    """Envoy's OpenTelemetry stats sink, for the per-host stats the metrics_service sink lacks.

    Measured on Envoy 1.40: only this sink flushes per-endpoint stats (tier clusters set
    `track_cluster_stats.per_endpoint_stats`); they arrive at Ballast's OTLP endpoint (same port)
    as `cluster.endpoint.rq_total` {envoy.cluster_name, envoy.endpoint_address, ballast_pop}.
    Everything but endpoint stats is dropped here (the metrics_service sink has it already);
    without `drop_others` (Envoy 1.36 has no DropAction) the sink also sends the stats the stats
    matcher keeps, which Ballast's OTLP endpoint ignores.
    Counters stay cumulative: host counter deltas are latched by any reader, so every admin
    `/stats/prometheus` scrape would steal them from this sink (measured).
    """
    drop = "type.googleapis.com/envoy.extensions.stat_sinks.open_telemetry.v3.SinkConfig.DropAction"
    full_name = (
        "type.googleapis.com/envoy.extensions.matching.common_inputs.stats.v3.StatFullNameMatchInput"
    )
    not_an_endpoint_stat = {
        "not_matcher": {
            "single_predicate": {
                "input": {"name": "stat_full_name", "typed_config": {"@type": full_name}},
                "value_match": {"contains": ".endpoint."},
            }
        }
    }
    config: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.stat_sinks.open_telemetry.v3.SinkConfig",
        "grpc_service": {"envoy_grpc": {"cluster_name": XDS_CLUSTER}},
        "emit_tags_as_attributes": True,
        "use_tag_extracted_name": True,
        "report_counters_as_deltas": False,
    }
    if drop_others:
        config["custom_metric_conversions"] = {
            "matcher_list": {
                "matchers": [
                    {
                        "predicate": not_an_endpoint_stat,
                        "on_match": {"action": {"name": "drop", "typed_config": {"@type": drop}}},
                    }
                ]
            }
        }
    return {"name": "envoy.stat_sinks.open_telemetry", "typed_config": config}


def stats_listener_resources(host: str, port: int, *, admin_port: int
                             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A listener on (host, port) answering exactly `GET /stats/prometheus` (no query string,
    no other path or method: the `:path` header is compared whole) from the admin on loopback
    through a static cluster; everything else gets a 404 from the listener itself and never
    reaches the admin (/quitquitquit, /config_dump, /runtime_modify, /logging, ...)."""
    exact = [
        {"name": ":path", "string_match": {"exact": STATS_PATH}},
        {"name": ":method", "string_match": {"exact": "GET"}},
    ]
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": STATS_LISTENER,
        "codec_type": "HTTP1",
        "route_config": {"name": STATS_LISTENER, "virtual_hosts": [{
            "name": STATS_LISTENER,
            "domains": ["*"],
            "routes": [
                {"match": {"path": STATS_PATH, "headers": exact},
                 "route": {"cluster": ADMIN_CLUSTER, "timeout": "10s"}},
                {"match": {"prefix": "/"},
                 "direct_response": {"status": 404, "body": {"inline_string":
                                                             f"only {STATS_PATH}\n"}}},
            ],
        }]},
        "http_filters": [{
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }],
    }
    listener = {
        "name": STATS_LISTENER,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }
    cluster = {
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": ADMIN_CLUSTER, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                         "port_value": admin_port}}}}]}]},
    }
    return listener, cluster


def xds_transport_socket(tls: XdsClientTls, server: str) -> dict[str, Any]:
    """mTLS from Envoy to Ballast: the node's certificate, Ballast's certificate checked against
    the CA and against the name or address the node dials (`server`), HTTP/2 by ALPN."""
    try:
        ipaddress.ip_address(server)
        san_type = "IP_ADDRESS"
    except ValueError:
        san_type = "DNS"
    common: dict[str, Any] = {"alpn_protocols": ["h2"]}
    names = {"match_typed_subject_alt_names": [{"san_type": san_type,
                                                "matcher": {"exact": server}}]}
    if tls.sds_file is None or tls.ca_sds_file is None:
        common["tls_certificates"] = [{"certificate_chain": {"filename": tls.cert},
                                       "private_key": {"filename": tls.key}}]
        common["validation_context"] = {"trusted_ca": {"filename": tls.ca}, **names}
    else:
        common["tls_certificate_sds_secret_configs"] = [
            _file_sds(XDS_CLIENT_SECRET, tls.sds_file)]
        common["combined_validation_context"] = {
            "default_validation_context": names,
            "validation_context_sds_secret_config": _file_sds(XDS_SERVER_CA_SECRET,
                                                              tls.ca_sds_file),
        }
    context: dict[str, Any] = {
        "@type": "type.googleapis.com/"
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    }
    if san_type == "DNS":
        context["sni"] = server
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _file_sds(name: str, path: str) -> dict[str, Any]:
    """An SdsSecretConfig read from the file `path` (watched: renamed over, it is read again)."""
    return {"name": name, "sds_config": {
        "path_config_source": {"path": path,
                               "watched_directory": {"path": posixpath.dirname(path)}},
        "resource_api_version": "V3",
    }}


def _yaml_str(value: str) -> str:
    """Quote a value for the YAML template (json quoting is valid YAML)."""
    return json.dumps(str(value))
