"""What a proxyless gRPC client of one PoP gets: its gRPC services as xDS resources. Pure.

gRPC asks for every resource by name and reads them as gRFC A27/A28 say, so per service
(`OriginGroup.grpc`) of the desired state:

- Listener `<target>` and `<target>:<port>` (the two ways to dial it): only an `api_listener`
  holding an HttpConnectionManager that takes its routes by RDS over ADS, the router filter last;
- RouteConfiguration `<service>`: one virtual host whose domains are those two names, one
  default route (prefix "") to the cluster, with the call's time limit (`max_stream_duration`,
  A31) where the client has it;
- Cluster `<service>`: EDS over ADS, ROUND_ROBIN (an LB policy gRPC lacks NACKs the whole
  response), load reports to Ballast itself (`lrs_server: self`), `max_requests` (A32), and
  for a TLS service the client's certificate provider instance `ballast` for its certificate
  and the CA its origins chain to, their names matched as subject alt names (A29);
- ClusterLoadAssignment `<service>`: one locality per origin, zone = the origin's name (so a
  load report's localities name origins), weighted by the PoP's weights. gRPC skips a locality
  without a weight and does no overprovisioning (a priority keeps everything while any of its
  localities is reachable), so the origins with weight are priority 0 and those at 0 are
  priority 1, weight 1 each: the client's own fallback while every weighted origin is down,
  until Ballast moves the weights.

What a client's release lacks (`grpc_capabilities.py`) is left out with a note; a TLS service
is left out whole for a client without certificate providers (it would ignore the TLS settings
and dial its origins in plaintext). Envoys get none of this, gRPC clients nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from envoy.config.cluster.v3.circuit_breaker_pb2 import CircuitBreakers
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.base_pb2 import Locality, TransportSocket
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
    SelfConfigSource,
)
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.api_listener_pb2 import ApiListener
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_components_pb2 import Route, RouteAction, RouteMatch, VirtualHost
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import (
    CertificateProviderPluginInstance,
    CertificateValidationContext,
)
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import Desired, GroupWeights, OriginGroup
from control_plane.translate.proto_values import duration_ms, packed
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Resource,
)

# the certificate provider instance a TLS service names: `ballast bootstrap --grpc --tls-*`
# defines it (file_watcher: the node's certificate, key and CA)
CERTIFICATE_PROVIDER = "ballast"
ROUTER_FILTER = "envoy.filters.http.router"
TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
FALLBACK_PRIORITY = 1  # origins at weight 0: the client's fallback (see the module docstring)


class Built(Protocol):
    resource: Resource


class Maker(Protocol):
    """The incremental builder of `pop.py`: the previous translation's resource when `inputs`
    are equal, else `build()`."""

    def resource(self, type_url: str, name: str, inputs: tuple[object, ...],
                 build: Callable[[], tuple[Message, str | None]]) -> Built: ...


def grpc_resources(
    desired: Desired, features: frozenset[str], weights: dict[str, GroupWeights], make: Maker
) -> tuple[dict[str, dict[str, Resource]], list[str]]:
    """Every gRPC service's resources for a client with `features` (by type URL), and the
    notes on what it was not sent."""
    by_type: dict[str, dict[str, Resource]] = {
        CLUSTER_TYPE: {}, ENDPOINT_TYPE: {}, LISTENER_TYPE: {}, ROUTE_TYPE: {}}
    notes: list[str] = []
    for group in desired.grpc_services:
        service = group.grpc
        assert service is not None
        if service.tls and "tls" not in features:
            notes.append(f"{group.name}: not sent: a TLS service, and the client has no "
                         "certificate providers (gRFC A29, gRPC 1.41)")
            continue
        limits = tuple(sorted(features & {"max_requests", "timeout"}))
        for feature in ("max_requests", "timeout"):
            if getattr(service, "timeout_ms" if feature == "timeout" else feature) \
                    and feature not in features:
                notes.append(f"{group.name}: {feature} not sent (the client's release "
                             "lacks it)")
        for name in service.listener_names:
            by_type[LISTENER_TYPE][name] = make.resource(
                LISTENER_TYPE, name, (group.name,),
                lambda name=name, group=group: (api_listener(name, group.name), None),
            ).resource
        by_type[ROUTE_TYPE][group.name] = make.resource(
            ROUTE_TYPE, group.name, (service, limits),
            lambda group=group, limits=limits: (routes(group, "timeout" in limits), None),
        ).resource
        by_type[CLUSTER_TYPE][group.name] = make.resource(
            CLUSTER_TYPE, group.name, (service, group.origins, limits),
            lambda group=group, limits=limits: (cluster(group, "max_requests" in limits), None),
        ).resource
        held = weights[group.name]
        by_type[ENDPOINT_TYPE][group.name] = make.resource(
            ENDPOINT_TYPE, group.name, (group.origins, tuple(sorted(held.items()))),
            lambda group=group, held=held: (load_assignment(group, held), None),
        ).resource
    return by_type, notes


def _ads() -> ConfigSource:
    return ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)


def api_listener(name: str, route_name: str) -> Listener:
    hcm = HttpConnectionManager(
        rds=Rds(config_source=_ads(), route_config_name=route_name),
        http_filters=[HttpFilter(name=ROUTER_FILTER, typed_config=packed(Router()))],
    )
    return Listener(name=name, api_listener=ApiListener(api_listener=packed(hcm)))


def routes(group: OriginGroup, timeout: bool) -> RouteConfiguration:
    service = group.grpc
    assert service is not None
    action = RouteAction(cluster=group.name)
    if timeout and service.timeout_ms:
        action.max_stream_duration.max_stream_duration.CopyFrom(duration_ms(service.timeout_ms))
    return RouteConfiguration(name=group.name, virtual_hosts=[VirtualHost(
        name=group.name, domains=list(service.listener_names),
        routes=[Route(match=RouteMatch(prefix=""), route=action)],
    )])


def cluster(group: OriginGroup, max_requests: bool) -> Cluster:
    service = group.grpc
    assert service is not None
    made = Cluster(
        name=group.name,
        type=Cluster.EDS,
        eds_cluster_config=Cluster.EdsClusterConfig(eds_config=_ads()),
        lb_policy=Cluster.ROUND_ROBIN,
        lrs_server=ConfigSource(self=SelfConfigSource()),
    )
    if max_requests and service.max_requests is not None:
        made.circuit_breakers.CopyFrom(CircuitBreakers(thresholds=[CircuitBreakers.Thresholds(
            max_requests=UInt32Value(value=service.max_requests))]))
    if service.tls:
        made.transport_socket.CopyFrom(_tls(_names(o.expected_name for o in group.origins)))
    return made


def _names(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _tls(server_names: list[str]) -> TransportSocket:
    """The client's certificate and the origins' CA from the certificate provider instance,
    named in the fields gRPC reads now and in the ones releases before them read (gRPC reads
    the former where both are set)."""
    instance = CertificateProviderPluginInstance(instance_name=CERTIFICATE_PROVIDER)
    older = CommonTlsContext.CertificateProviderInstance(instance_name=CERTIFICATE_PROVIDER)
    validation = CertificateValidationContext(
        ca_certificate_provider_instance=instance,
        match_subject_alt_names=[StringMatcher(exact=value) for value in server_names],
    )
    common = CommonTlsContext(
        tls_certificate_provider_instance=instance,
        tls_certificate_certificate_provider_instance=older,
        combined_validation_context=CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=validation,
            validation_context_certificate_provider_instance=older,
        ),
    )
    return TransportSocket(name=TLS_TRANSPORT_SOCKET,
                           typed_config=packed(UpstreamTlsContext(common_tls_context=common)))


def load_assignment(group: OriginGroup, weights: GroupWeights) -> ClusterLoadAssignment:
    """One locality per origin: weighted at priority 0, or (at weight 0) priority 1 with
    weight 1, so no locality lacks a weight and no priority has a gap."""
    assignment = ClusterLoadAssignment(cluster_name=group.name)
    for origin in group.origins:
        weight = weights[origin.name]
        assignment.endpoints.append(LocalityLbEndpoints(
            locality=Locality(zone=origin.name),
            lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=Address(
                socket_address=SocketAddress(address=origin.address,
                                             port_value=origin.port))))],
            load_balancing_weight=UInt32Value(value=weight or 1),
            priority=0 if weight > 0 else FALLBACK_PRIORITY,
        ))
    return assignment
