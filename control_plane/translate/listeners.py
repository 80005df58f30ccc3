"""One Listener per desired listener: an HTTP connection manager whose routes come by RDS over ADS.

The listener binds the PoP's `listen_address` at `port + port_offset` (several PoPs on one host);
its route configuration has the listener's name (see `routes.py`).

With `classification.trusted_priority_sources`, a second filter chain matches connections from
those networks (`source_prefix_ranges`, the direct peer's address) and uses the route
configuration `<listener>.trusted`, which believes a request's own `x-ballast-tier`; every other
connection gets the first one, which ignores and overwrites it.

A tier's queue overflow is answered with the tier's `shed_action` through the connection
manager's `local_reply_config` (`overflow.py`).

With `access_log_sample` (nodes whose bootstrap asked for it, see `capabilities.py`), each HTTP
connection manager streams a sampled gRPC access log (`envoy.access_loggers.http_grpc`, log name
`ballast`) to Ballast over the bootstrap's `ballast_xds` cluster: `runtime_filter` with
independent randomness per request, percent from the desired state (runtime key
`ballast.access_log_sample` overrides the numerator, per million).
"""

from __future__ import annotations

from envoy.config.accesslog.v3.accesslog_pb2 import AccessLog, AccessLogFilter, RuntimeFilter
from envoy.config.core.v3.address_pb2 import Address, CidrRange, SocketAddress
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.config.listener.v3.listener_components_pb2 import Filter, FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    CommonGrpcAccessLogConfig,
    HttpGrpcAccessLogConfig,
)
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import Listener as DesiredListener
from control_plane.desired.model import Pop
from control_plane.translate.affinity import session_filter
from control_plane.translate.overflow import OverflowReply, overflow_replies
from control_plane.translate.proto_values import packed

HTTP_CONNECTION_MANAGER = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"
GRPC_ACCESS_LOGGER = "envoy.access_loggers.http_grpc"
ACCESS_LOG_NAME = "ballast"
ACCESS_LOG_RUNTIME_KEY = "ballast.access_log_sample"
XDS_CLUSTER = "ballast_xds"  # the bootstraps' cluster to Ballast (translate/bootstrap.py)


def access_log(sample_rate: float) -> AccessLog:
    sampled = AccessLogFilter(runtime_filter=RuntimeFilter(
        runtime_key=ACCESS_LOG_RUNTIME_KEY,
        percent_sampled=FractionalPercent(numerator=round(sample_rate * 1_000_000),
                                          denominator=FractionalPercent.MILLION),
        use_independent_randomness=True,
    ))
    config = HttpGrpcAccessLogConfig(common_config=CommonGrpcAccessLogConfig(
        log_name=ACCESS_LOG_NAME,
        grpc_service=GrpcService(envoy_grpc=GrpcService.EnvoyGrpc(cluster_name=XDS_CLUSTER)),
        transport_api_version=ApiVersion.V3,
    ))
    return AccessLog(name=GRPC_ACCESS_LOGGER, filter=sampled, typed_config=packed(config))


def listener(
    desired_listener: DesiredListener,
    pop: Pop,
    trusted_sources: tuple[str, ...] = (),
    access_log_sample: float | None = None,
    overflow: tuple[OverflowReply, ...] = (),
    sessions: bool = False,
) -> Listener:
    """`overflow`: the tiers of the listener's origin groups, whose queue overflow is answered
    with each tier's shed action (`overflow.py`); `sessions`: a group of the listener has
    session affinity (the stateful session filter, `affinity.py`)."""
    chains = [_chain(desired_listener.name, desired_listener.name, access_log_sample, overflow,
                     sessions)]
    if trusted_sources:
        trusted = _chain(desired_listener.name, trusted_route_name(desired_listener.name),
                         access_log_sample, overflow, sessions)
        trusted.filter_chain_match.source_prefix_ranges.extend(
            _cidr(source) for source in trusted_sources
        )
        chains.insert(0, trusted)
    return Listener(
        name=desired_listener.name,
        address=Address(
            socket_address=SocketAddress(
                address=pop.listen_address,
                port_value=desired_listener.port + pop.port_offset,
            )
        ),
        filter_chains=chains,
    )


def trusted_route_name(listener_name: str) -> str:
    """Listener names have no dots, so this never clashes with another listener's routes."""
    return f"{listener_name}.trusted"


def _chain(stat_prefix: str, route_name: str, access_log_sample: float | None,
           overflow: tuple[OverflowReply, ...], sessions: bool) -> FilterChain:
    hcm = HttpConnectionManager(
        stat_prefix=stat_prefix,
        rds=Rds(
            config_source=ConfigSource(
                ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3
            ),
            route_config_name=route_name,
        ),
        http_filters=[*([session_filter()] if sessions else []),
                      HttpFilter(name=ROUTER, typed_config=packed(Router()))],
    )
    if overflow:
        hcm.local_reply_config.CopyFrom(overflow_replies(overflow))
    if access_log_sample is not None:
        hcm.access_log.append(access_log(access_log_sample))
    return FilterChain(filters=[Filter(name=HTTP_CONNECTION_MANAGER, typed_config=packed(hcm))])


def _cidr(network: str) -> CidrRange:
    address, _, length = network.partition("/")
    return CidrRange(address_prefix=address, prefix_len=UInt32Value(value=int(length)))
