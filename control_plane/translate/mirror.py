"""The cache-warming mirror (the failover source): while a standby ramps, a share of the group's
cacheable requests is copied to it with Envoy's request mirroring, so its cache warms before it
takes the traffic for real.

- Each standby origin of a group in a PoP (every origin but the PoP's preferred one) has its own
  cluster `<group>.mirror-<origin>` (EDS like the tier clusters), whose only endpoint is that
  origin (TLS as in the tier clusters), sized like the group's least critical tier, without
  retries. It is always in the PoP's clusters while the group's ramp has a mirror
  (`standby_ramp.enabled` and `mirror_percent` > 0), so starting and stopping a mirror changes
  only routes (RDS).
- While a mirror is active, each cacheable route (`standby_ramp.cacheable_routes`, every route
  when left out) is preceded by a copy named `<route>-mirror` that matches only GET and HEAD
  (the cacheable methods) and carries `request_mirror_policies`: `percent` of those requests are
  also sent to the mirror cluster. Envoy sends the copy fire-and-forget with `-shadow` appended
  to the Host; the client only ever sees the answer of the route's own cluster.
"""

from __future__ import annotations

from envoy.config.cluster.v3.circuit_breaker_pb2 import CircuitBreakers
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.base_pb2 import RoutingPriority, RuntimeFractionalPercent
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from envoy.config.core.v3.protocol_pb2 import Http1ProtocolOptions
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.route.v3.route_components_pb2 import HeaderMatcher, Route, RouteAction
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions
from envoy.type.matcher.v3.regex_pb2 import RegexMatcher
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import Mirror, OriginGroup
from control_plane.translate.clusters import (
    HTTP_PROTOCOL_OPTIONS,
    tier_concurrency,
    tls_matches,
)
from control_plane.translate.endpoints import origin_locality
from control_plane.translate.proto_values import duration_ms, packed

CACHEABLE_METHODS = "GET|HEAD"
MIRROR_ROUTE_SUFFIX = "-mirror"
PER_MILLION = 1_000_000


def mirror_cluster_name(group: str, origin: str) -> str:
    return f"{group}.mirror-{origin}"


def is_mirror_cluster(name: str) -> bool:
    return ".mirror-" in name


def has_mirror(group: OriginGroup) -> bool:
    ramp = group.standby_ramp
    return ramp.enabled and ramp.mirror_percent > 0


def mirror_cluster(group: OriginGroup, origin_name: str) -> Cluster:
    """The cluster mirrored requests to `origin_name` go to: that origin only."""
    tier = max(group.tiers, key=lambda t: t.priority)  # the least critical tier's limits
    concurrency = tier_concurrency(group, tier)
    name = mirror_cluster_name(group.name, origin_name)
    cluster = Cluster(
        name=name,
        type=Cluster.EDS,
        eds_cluster_config=Cluster.EdsClusterConfig(eds_config=ConfigSource(
            ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)),
        connect_timeout=duration_ms(tier.connect_timeout_ms),
        lb_policy=Cluster.ROUND_ROBIN,
        circuit_breakers=CircuitBreakers(thresholds=[CircuitBreakers.Thresholds(
            priority=RoutingPriority.DEFAULT,
            max_connections=UInt32Value(value=concurrency),
            max_requests=UInt32Value(value=concurrency),
            max_pending_requests=UInt32Value(value=concurrency),
            max_retries=UInt32Value(value=0),
        )]),
    )
    cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].CopyFrom(packed(
        HttpProtocolOptions(explicit_http_config=HttpProtocolOptions.ExplicitHttpConfig(
            http_protocol_options=Http1ProtocolOptions()))))
    cluster.transport_socket_matches.extend(
        m for m in tls_matches(group) if m.name == origin_name)
    return cluster


def mirror_load_assignment(group: OriginGroup, origin_name: str) -> ClusterLoadAssignment:
    """The mirror cluster's one endpoint, without a locality zone: mirrored requests stay out of
    the per-origin zone stats the controller reads."""
    locality = origin_locality(group.origin(origin_name), 0)
    locality.ClearField("locality")
    return ClusterLoadAssignment(cluster_name=mirror_cluster_name(group.name, origin_name),
                                 endpoints=[locality])


def mirrored_routes(group: str, route: Route, mirror: Mirror | None) -> list[Route]:
    """`route`, preceded by its GET/HEAD mirroring copy when `mirror` covers it."""
    if (mirror is None or not mirror.origins or route.WhichOneof("action") != "route"
            or (mirror.routes is not None and route.name not in mirror.routes)):
        return [route]
    copy = Route()
    copy.CopyFrom(route)
    copy.name = route.name + MIRROR_ROUTE_SUFFIX
    copy.match.headers.append(HeaderMatcher(
        name=":method",
        string_match=StringMatcher(safe_regex=RegexMatcher(regex=CACHEABLE_METHODS)),
    ))
    fraction = RuntimeFractionalPercent(default_value=FractionalPercent(
        numerator=round(mirror.percent * PER_MILLION / 100),
        denominator=FractionalPercent.MILLION,
    ))
    copy.route.request_mirror_policies.extend(
        RouteAction.RequestMirrorPolicy(
            cluster=mirror_cluster_name(group, origin), runtime_fraction=fraction)
        for origin in mirror.origins
    )
    return [copy, route]
