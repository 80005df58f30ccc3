"""One Cluster per (origin group, tier): its own connection pool, breakers and queue policy.

Endpoints arrive by EDS over ADS (one ClusterLoadAssignment per cluster, see `endpoints.py`).
Breaker numbers (the tiers source): max_connections = max_requests = ceil(share% x
max_origin_concurrency), so 70/25/5 % of 120 gives 84/30/6; max_pending_requests = the tier's queue
depth. Retries are bounded by a retry budget (the failover source: 15 % of active requests);
`max_retries` states the same bound as a count at full load, ceil(budget% x max_requests), and
`min_retry_concurrency` lets an idle pool still spend one request's full retry count (the tier's
retries). A tier without retries whose requests get one retry of an attempt no origin served
(`unserved_retry`) has a budget of 100 % (one retry per active or pending request) and a
`min_retry_concurrency` of 1: those retries add no origin work, the thing a retry budget bounds
(measured in `flap`: with the tier's 15 %, a burst of 13 image revalidations the standby refused at
once got 2 retries).

Upstream connections idle for one tier tick (`tier_actions.interval`) are closed
(`common_http_protocol_options.idle_timeout`). Envoy keeps the connections a pool opened under a
higher limit when the tier controller lowers it (preemption, shedding to the floor; measured on
1.40), and a request that finds one of them idle while the pool is at its new `max_requests` is
refused at once (`upstream_rq_pending_overflow`) instead of waiting in the pending queue, so
until they close the pool has no queue at all. Likewise at a limit of one (a shed tier's floor),
a request drawn to an origin whose pool holds no connection gets one over the breaker (Envoy lets
an empty pool open one) and is refused as it attaches (`upstream_rq_active_overflow`): it waits
only behind a request on the same origin (measured on 1.40, `tests/test_tier_shed_envoy.py`).

`track_cluster_stats.per_endpoint_stats` is on: Envoy then emits per-host counters for every
attempt (retried attempts included), which is how `observe` sees an origin's own error count when
retries hide the failures from the zone `upstream_rq_<code>` stats (measured on Envoy 1.40).
"""

from __future__ import annotations

import math

from envoy.config.cluster.v3.circuit_breaker_pb2 import CircuitBreakers
from envoy.config.cluster.v3.cluster_pb2 import Cluster, TrackClusterStats
from envoy.config.core.v3.base_pb2 import RoutingPriority, TransportSocket
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.config.core.v3.protocol_pb2 import Http1ProtocolOptions
from envoy.config.core.v3.protocol_pb2 import HttpProtocolOptions as CommonHttpProtocolOptions
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions
from envoy.type.v3.percent_pb2 import Percent
from google.protobuf.struct_pb2 import Struct
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import OriginGroup, Tier
from control_plane.translate.proto_values import duration_ms, packed
from control_plane.translate.queue_policy import QueuePolicyChoice, attach
from control_plane.translate.upstream_tls import upstream_tls

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
TRANSPORT_SOCKET_MATCH_FILTER = "envoy.transport_socket_match"
TRANSPORT_SOCKET_MATCH_KEY = "origin"
UNSERVED_RETRY_BUDGET_PERCENT = 100.0


def cluster_name(group: str, tier: str) -> str:
    return f"{group}.{tier}"


def tier_concurrency(group: OriginGroup, tier: Tier) -> int:
    """The tier's share of the group's origin connections, rounded up (70% of 120 -> 84)."""
    return group.guarantee(tier)


def unserved_retry(group: OriginGroup, tier: Tier) -> bool:
    """Whether the tier gets one retry of an attempt no origin served although it has no retries
    (the tiers source's background tier, `retryBudget: 0`): it does when the group has another
    origin to send it to. Such an attempt did no work at an origin (a connection refused or
    reset before the request went out, an HTTP/2 stream refused, a 503: the origin declined the
    request — a connection cap, a full wait line), so its retry adds no origin work: the request
    is served once, at another origin (`previous_hosts`), as a tier with retries would have it
    served, within the tier's retry budget (`routes.py`, "Retries"). A group with one origin
    has no other origin, and a retry there would only ask the one that declined again."""
    return tier.retries == 0 and len(group.origins) > 1


def tier_cluster(group: OriginGroup, tier: Tier, queue_policy: QueuePolicyChoice,
                 per_endpoint_stats: bool = True) -> Cluster:
    """The EDS cluster of one tier, field 62 (queue policy) merged in. Lending raises the
    breakers by runtime overrides (`runtime.py`), never here. Without `per_endpoint_stats`
    (an Envoy that sends load reports refuses them) its per-host counters go."""
    cluster = Cluster(
        name=cluster_name(group.name, tier.name),
        type=Cluster.EDS,
        eds_cluster_config=Cluster.EdsClusterConfig(
            eds_config=ConfigSource(
                ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3
            )
        ),
        connect_timeout=duration_ms(tier.connect_timeout_ms),
        lb_policy=Cluster.ROUND_ROBIN,
        common_lb_config=Cluster.CommonLbConfig(
            locality_weighted_lb_config=Cluster.CommonLbConfig.LocalityWeightedLbConfig()
        ),
        circuit_breakers=_circuit_breakers(group, tier),
        # Per-host counters (`cluster.<name>.endpoint.<addr>_<port>.rq_error`, ...) count every
        # attempt, retried ones included; the zone `upstream_rq_*` stats do not (observe/).
        track_cluster_stats=TrackClusterStats(per_endpoint_stats=per_endpoint_stats),
    )
    if not per_endpoint_stats:
        cluster.ClearField("track_cluster_stats")
    cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].CopyFrom(
        packed(
            HttpProtocolOptions(
                common_http_protocol_options=CommonHttpProtocolOptions(
                    idle_timeout=duration_ms(group.tier_actions.interval_ms)),
                explicit_http_config=HttpProtocolOptions.ExplicitHttpConfig(
                    http_protocol_options=Http1ProtocolOptions()
                ),
            )
        )
    )
    if group.affinity is not None:
        # a session's origin is honoured only while Ballast marks it HEALTHY (`endpoints.py`)
        cluster.common_lb_config.override_host_status.statuses.append(HealthStatus.HEALTHY)
    cluster.transport_socket_matches.extend(tls_matches(group))
    attach(cluster, queue_policy.carrier)
    return cluster


def _circuit_breakers(group: OriginGroup, tier: Tier) -> CircuitBreakers:
    concurrency = tier_concurrency(group, tier)
    budget, least = tier.retry_budget_percent, tier.retries
    if unserved_retry(group, tier):
        # its only retries are of attempts no origin served: they add no origin work, which is
        # what a budget bounds, so one per request (100 % of active and pending requests)
        budget, least = UNSERVED_RETRY_BUDGET_PERCENT, 1
    max_retries = math.ceil(budget * concurrency / 100)
    return CircuitBreakers(
        thresholds=[
            CircuitBreakers.Thresholds(
                priority=RoutingPriority.DEFAULT,
                max_connections=UInt32Value(value=concurrency),
                max_requests=UInt32Value(value=concurrency),
                max_pending_requests=UInt32Value(value=tier.max_queue_depth),
                max_retries=UInt32Value(value=max_retries),
                retry_budget=CircuitBreakers.Thresholds.RetryBudget(
                    budget_percent=Percent(value=budget),
                    min_retry_concurrency=UInt32Value(value=least),
                ),
            )
        ]
    )


def tls_matches(group: OriginGroup) -> list[Cluster.TransportSocketMatch]:
    """TLS (with SNI: the origin's `sni`, else its address) for the endpoints of TLS origins.

    Origins of one group share each tier cluster, so TLS is chosen per endpoint: endpoints carry
    `envoy.transport_socket_match: {origin: <name>}` metadata (`endpoints.py`); others stay plain.
    The certificate is verified (`upstream_tls`) unless the origin says `insecure_skip_verify`.
    """
    matches = []
    for origin in group.origins:
        if not origin.tls:
            continue
        criteria = Struct()
        criteria.update({TRANSPORT_SOCKET_MATCH_KEY: origin.name})
        matches.append(
            Cluster.TransportSocketMatch(
                name=origin.name,
                match=criteria,
                transport_socket=TransportSocket(
                    name=TLS_TRANSPORT_SOCKET,
                    typed_config=packed(upstream_tls(origin)),
                ),
            )
        )
    return matches
