"""The Envoy bootstrap templates `ads_bootstrap` fills, as Python data (no file is read).

They are `string.Template` text (`${name}` placeholders, `$$` for a literal `$`) of YAML, kept
with their comments: `ballast bootstrap --template NAME` prints one filled in. Being module data,
they ship inside the wheel and translation stays free of file I/O. The edge and the sidecar
template share everything but their opening comment and the sidecar's node metadata.
"""
# ruff: noqa: E501 (template lines are Envoy config: a long regex or type URL stays whole)

from __future__ import annotations

_NODE = r"""node:
  id: ${node_id}
  cluster: ${node_cluster}
  locality:
    zone: ${pop}
"""

# everything after the node: the same for every template
_SHARED = r"""admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: ${admin_port}}
dynamic_resources:
  ads_config:
    api_type: ${api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
      - envoy_grpc: {cluster_name: ballast_xds}
  cds_config: {ads: {}, resource_api_version: V3}
  lds_config: {ads: {}, resource_api_version: V3}
# Ballast's tier controller lends concurrency by runtime overrides of circuit breakers (RTDS over
# the same ADS stream: no cluster rebuild); the admin layer keeps /runtime_modify working.
layered_runtime:
  layers:
    - name: ballast_tiers
      rtds_layer:
        name: ballast_tiers
        rtds_config: {ads: {}, resource_api_version: V3}
    - name: admin
      admin_layer: {}
static_resources:
  clusters:
    - name: ballast_xds
      type: STRICT_DNS
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options:
              connection_keepalive: {interval: 30s, timeout: 5s}
      load_assignment:
        cluster_name: ballast_xds
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {address: ${xds_host}, port_value: ${xds_port}}
# Downstream connections are capped (`ballast bootstrap --max-connections`): past the cap Envoy
# refuses new ones instead of running out of file descriptors (and it stops warning that they
# are unlimited).
overload_manager:
  resource_monitors:
    - name: envoy.resource_monitors.global_downstream_max_connections
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig
        max_active_downstream_connections: ${max_connections}
stats_flush_interval: ${stats_flush_interval}
stats_config:
  # Per-(PoP, origin) stats of a tier cluster come out as labels, not inside metric names.
  # Tier clusters are named <group>.<tier>: Envoy's default envoy.cluster_name tag stops at the
  # first dot ("shop"), so ballast_cluster carries the whole name ("shop.critical"). Measured on
  # Envoy 1.40: cluster.shop.critical.zone.ewr.primary.upstream_rq_5xx becomes
  # cluster.zone.upstream_rq_xx {ballast_cluster, local_zone, upstream_zone, response code class}.
  stats_tags:
    - tag_name: ballast_cluster
      regex: '^cluster\.((.+?)\.)(?:zone\.|upstream_|circuit_breakers\.|membership_|lb_|retry_|outlier_detection\.|health_check\.|bind_errors|original_dst_|update_|version|max_host_weight|warming_state|assignment_|default\.|http1\.|http2\.|http3\.|internal\.|external\.|canary\.|ssl\.|tls\.)'
    - tag_name: local_zone
      regex: '^cluster\..+?\.zone\.(([^.]+)\.)[^.]+\.[^.]+$$'
    - tag_name: upstream_zone
      regex: '^cluster\..+?\.zone\.[^.]+\.(([^.]+)\.)[^.]+$$'
    # Every stat carries its PoP, so a Prometheus scraping many Envoys can group cluster-wide
    # gauges (pending requests) by PoP too.
    - tag_name: ballast_pop
      fixed_value: ${pop}
"""

EDGE = r"""# Bootstrap template for an edge Envoy of one PoP, fed by Ballast over ADS.
# `ballast bootstrap` fills the placeholders; everything else (listeners, routes, tier clusters,
# endpoints) arrives over xDS. node.locality.zone = the PoP: Ballast picks the PoP's config by it,
# and Envoy emits per-(PoP, origin) zone stats only when it is set (docs/architecture.md, "Per-origin stats").
""" + _NODE + _SHARED

SIDECAR = r"""# Bootstrap template for a sidecar Envoy: one per application host, in front of that application
# only, fed by Ballast over ADS like an edge proxy. `ballast bootstrap --template sidecar` fills
# the placeholders. It differs from EDGE only in the node metadata naming the role; its cap on
# downstream connections keeps a runaway local client from exhausting the host's file
# descriptors.
""" + _NODE + """  metadata:
    role: sidecar
""" + _SHARED

TEMPLATES: dict[str, str] = {"edge": EDGE, "sidecar": SIDECAR}
