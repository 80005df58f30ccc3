"""One Listener per desired listener: an HTTP connection manager whose routes come by RDS over ADS.

The listener binds the PoP's `listen_address` at `port + port_offset` (several PoPs on one host);
its route configuration has the listener's name (see `routes.py`).

With `classification.trusted_priority_sources`, a second filter chain matches connections from
those networks (`source_prefix_ranges`, the direct peer's address) and uses the route
configuration `<listener>.trusted`, which believes a request's own `x-ballast-tier`; every other
connection gets the first one, which ignores and overwrites it.

A tier's queue overflow is answered with the tier's `shed_action` through the connection
manager's `local_reply_config` (`overflow.py`); a listener with a group with session affinity
gets the stateful session filter first (`affinity.py`).

A listener with `tls` serves HTTPS: one filter chain per certificate matched by SNI
(`server_names`, read by the TLS inspector listener filter) and the default certificate's chain
as `default_filter_chain`; each chain's `DownstreamTlsContext` names its certificate as an SDS
secret on the ADS stream (`secrets.py`), so Envoy swaps certificates without draining the
listener. ALPN offers h2 and http/1.1 (the connection manager's codec follows ALPN). Operator-added
HTTP filters (`http_filters`) sit right before the router; one whose type the node's Envoy does
not list (`Capabilities.missing_filters`) is left out, with a note. A plain listener with
`redirect_to_https` answers every request with a redirect to https (an inline route, no RDS).

With `access_log_sample` (nodes whose bootstrap asked for it, see `capabilities.py`), each HTTP
connection manager streams a sampled gRPC access log (`envoy.access_loggers.http_grpc`, log name
`ballast`) to Ballast over the bootstrap's `ballast_xds` cluster: `runtime_filter` with
independent randomness per request, percent from the desired state (runtime key
`ballast.access_log_sample` overrides the numerator, per million).
"""

from __future__ import annotations

from envoy.config.accesslog.v3.accesslog_pb2 import AccessLog, AccessLogFilter, RuntimeFilter
from envoy.config.core.v3.address_pb2 import Address, CidrRange, SocketAddress
from envoy.config.core.v3.base_pb2 import TransportSocket
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from envoy.config.core.v3.grpc_service_pb2 import GrpcService
from envoy.config.listener.v3.listener_components_pb2 import (
    Filter,
    FilterChain,
    ListenerFilter,
)
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import (
    RedirectAction,
    Route,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.access_loggers.grpc.v3.als_pb2 import (
    CommonGrpcAccessLogConfig,
    HttpGrpcAccessLogConfig,
)
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2 import TlsInspector
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import TlsParameters
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import SdsSecretConfig
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    DownstreamTlsContext,
)
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf.any_pb2 import Any
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import ExtraFilter, ListenerTls, Pop
from control_plane.desired.model import Listener as DesiredListener
from control_plane.translate.affinity import session_filter
from control_plane.translate.overflow import OverflowReply, overflow_replies
from control_plane.translate.proto_values import packed

HTTP_CONNECTION_MANAGER = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"
GRPC_ACCESS_LOGGER = "envoy.access_loggers.http_grpc"
ACCESS_LOG_NAME = "ballast"
ACCESS_LOG_RUNTIME_KEY = "ballast.access_log_sample"
XDS_CLUSTER = "ballast_xds"  # the bootstraps' cluster to Ballast (translate/bootstrap.py)
TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"
TLS_VERSIONS = {"1.2": TlsParameters.TLSv1_2, "1.3": TlsParameters.TLSv1_3}
# Mozilla's "intermediate" TLS 1.2 suites (TLS 1.3's are fixed): forward secrecy, AEAD only
INTERMEDIATE_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
)


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
    missing_filters: frozenset[str] = frozenset(),
    overflow: tuple[OverflowReply, ...] = (),
    sessions: bool = False,
) -> tuple[Listener, str | None]:
    """The listener, and a note when an operator-added filter is left out because the node's
    Envoy does not list its type (`missing_filters`: type names). `overflow`: the tiers of the
    listener's origin groups, whose queue overflow is answered with each tier's shed action
    (`overflow.py`); `sessions`: a group of the listener has session affinity (the stateful
    session filter, `affinity.py`)."""
    name = desired_listener.name
    filters = tuple(f for f in desired_listener.http_filters if f.type_name not in missing_filters)
    left_out = [f for f in desired_listener.http_filters if f.type_name in missing_filters]
    note = None if not left_out else f"listener {name}: " + "; ".join(
        f"filter {f.name} not sent: the node's Envoy does not list {f.type_name} in "
        "node.extensions" for f in left_out)
    built = Listener(
        name=name,
        address=Address(
            socket_address=SocketAddress(
                address=pop.listen_address,
                port_value=desired_listener.port + pop.port_offset,
            )
        ),
    )

    def hcm(trusted: bool) -> HttpConnectionManager:
        route = trusted_route_name(name) if trusted else name
        return _hcm(name, route, access_log_sample, filters,
                    redirect=desired_listener.redirect_to_https, overflow=overflow,
                    sessions=sessions)

    tls = desired_listener.tls
    for trusted in (True, False) if trusted_sources else (False,):
        if tls is None:
            chain = _chain(hcm(trusted))
            if trusted:
                _match_sources(chain, trusted_sources)
            built.filter_chains.append(chain)
            continue
        for certificate in tls.certificates:
            chain = _chain(hcm(trusted), downstream_tls(tls, certificate.secret_name))
            if trusted:
                _match_sources(chain, trusted_sources)
            if certificate.hostnames:
                chain.filter_chain_match.server_names.extend(certificate.hostnames)
                built.filter_chains.append(chain)
            if certificate.name == tls.default:
                default = _chain(hcm(trusted), downstream_tls(tls, certificate.secret_name))
                if trusted:
                    _match_sources(default, trusted_sources)
                    built.filter_chains.append(default)
                else:
                    built.default_filter_chain.CopyFrom(default)
    if tls is not None:
        built.listener_filters.append(ListenerFilter(
            name=TLS_INSPECTOR, typed_config=packed(TlsInspector())))
    return built, note


def downstream_tls(tls: ListenerTls, secret_name: str) -> TransportSocket:
    """TLS with the certificate `secret_name` over SDS (on the ADS stream); ALPN, versions and
    ciphers from the listener's policy; client certificates required with a client CA."""
    modern = tls.cipher_policy == "modern"
    params = TlsParameters(
        tls_minimum_protocol_version=TLS_VERSIONS["1.3" if modern else tls.min_version],
        tls_maximum_protocol_version=TLS_VERSIONS[tls.max_version],
    )
    if not modern:
        params.cipher_suites.extend(INTERMEDIATE_CIPHERS)
    common = CommonTlsContext(
        tls_params=params,
        alpn_protocols=list(tls.alpn),
        tls_certificate_sds_secret_configs=[SdsSecretConfig(
            name=secret_name,
            sds_config=ConfigSource(ads=AggregatedConfigSource(),
                                    resource_api_version=ApiVersion.V3),
        )],
    )
    if tls.client_ca_pem is not None:
        common.validation_context.trusted_ca.inline_bytes = tls.client_ca_pem
    context = DownstreamTlsContext(common_tls_context=common)  # (a copy of `common`)
    if tls.client_ca_pem is not None:
        context.require_client_certificate.value = True
    return TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=packed(context))


def trusted_route_name(listener_name: str) -> str:
    """Listener names have no dots, so this never clashes with another listener's routes."""
    return f"{listener_name}.trusted"


def _hcm(stat_prefix: str, route_name: str, access_log_sample: float | None,
         extra: tuple[ExtraFilter, ...], *, redirect: bool = False,
         overflow: tuple[OverflowReply, ...] = (), sessions: bool = False,
         ) -> HttpConnectionManager:
    """The HTTP connection manager: routes by RDS (or, on a redirecting listener, one inline
    route sending everything to https); operator-added filters go right before the router."""
    hcm = HttpConnectionManager(stat_prefix=stat_prefix)
    if redirect:
        hcm.route_config.CopyFrom(RouteConfiguration(name=route_name, virtual_hosts=[
            VirtualHost(name="to_https", domains=["*"], routes=[Route(
                match=RouteMatch(prefix="/"),
                redirect=RedirectAction(https_redirect=True),
            )]),
        ]))
    else:
        hcm.rds.CopyFrom(Rds(
            config_source=ConfigSource(
                ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3
            ),
            route_config_name=route_name,
        ))
    if sessions and not redirect:
        hcm.http_filters.append(session_filter())
    hcm.http_filters.extend(
        HttpFilter(name=f.name, typed_config=Any(type_url=f.type_url, value=f.config))
        for f in extra
    )
    hcm.http_filters.append(HttpFilter(name=ROUTER, typed_config=packed(Router())))
    if overflow and not redirect:
        hcm.local_reply_config.CopyFrom(overflow_replies(overflow))
    if access_log_sample is not None:
        hcm.access_log.append(access_log(access_log_sample))
    return hcm


def _chain(hcm: HttpConnectionManager, transport: TransportSocket | None = None) -> FilterChain:
    chain = FilterChain(filters=[Filter(name=HTTP_CONNECTION_MANAGER, typed_config=packed(hcm))])
    if transport is not None:
        chain.transport_socket.CopyFrom(transport)
    return chain


def _match_sources(chain: FilterChain, sources: tuple[str, ...]) -> None:
    chain.filter_chain_match.source_prefix_ranges.extend(_cidr(source) for source in sources)


def _cidr(network: str) -> CidrRange:
    address, _, length = network.partition("/")
    return CidrRange(address_prefix=address, prefix_len=UInt32Value(value=int(length)))
