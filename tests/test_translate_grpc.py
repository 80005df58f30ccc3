"""What proxyless gRPC clients get (gRFC A27/A28/A29/A31/A32), and what Envoys do not: the one
translation entry point (`translate_pop`) for nodes that identify as gRPC clients."""

from __future__ import annotations

import pytest
from envoy.config.core.v3.base_pb2 import Node
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import UpstreamTlsContext
from google.protobuf.struct_pb2 import Struct

from control_plane.admin.capability_keys import capabilities_for_key
from control_plane.desired import parse_desired
from control_plane.desired.model import Desired
from control_plane.translate import PopIntent, translate_pop
from control_plane.translate.capabilities import read_node_capabilities
from control_plane.translate.grpc_capabilities import describe_grpc_client
from control_plane.translate.grpc_resources import CERTIFICATE_PROVIDER
from control_plane.translate.pop import built_resources
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
)

TEXT = """\
pops:
  ewr: {}
  sjc: {}
origin_groups:
  shop:
    origins:
      primary: {address: 127.0.0.1, port: 8081}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {name: shop, domains: ["*"], origin_group: shop}
grpc_services:
  shop-api:
    port: 50051
    origins:
      primary: {address: 10.0.0.1}
      secondary: {address: 10.0.0.2, port: 50052}
      third: {address: 10.0.0.3}
    preference: {ewr: [primary, secondary, third], sjc: [secondary, primary, third]}
    max_requests: 200
    timeout: 5s
  cart-api:
    target: cart.internal
    port: 443
    tls: true
    origins:
      a: {address: 10.0.1.1, verify_name: cart.internal}
"""
ALL = Capabilities(grpc=frozenset({"max_requests", "timeout", "tls"}))


@pytest.fixture(scope="module")
def desired() -> Desired:
    return parse_desired(TEXT, "grpc.yaml")


def test_a_grpc_client_gets_its_services_and_nothing_of_envoys(desired: Desired) -> None:
    resources = translate_pop(desired, "ewr", ALL)
    assert set(resources.of_type(LISTENER_TYPE)) == {
        "shop-api", "shop-api:50051", "cart.internal", "cart.internal:443"}
    assert set(resources.of_type(ROUTE_TYPE)) == {"shop-api", "cart-api"}
    assert set(resources.of_type(CLUSTER_TYPE)) == {"shop-api", "cart-api"}
    assert set(resources.of_type(ENDPOINT_TYPE)) == {"shop-api", "cart-api"}
    assert resources.notes == ()
    envoy = translate_pop(desired, "ewr", Capabilities())
    names = {name for items in envoy.by_type.values() for name in items}
    assert not names & {"shop-api", "cart-api", "shop-api:50051"}, names
    assert "shop.critical" in envoy.of_type(CLUSTER_TYPE)


def test_listener_route_and_cluster_are_what_grpc_reads(desired: Desired) -> None:
    resources = translate_pop(desired, "ewr", ALL)
    listener = resources.of_type(LISTENER_TYPE)["shop-api:50051"].message
    hcm = HttpConnectionManager()
    assert listener.api_listener.api_listener.Unpack(hcm)
    assert not listener.filter_chains and not listener.HasField("address")
    assert hcm.rds.route_config_name == "shop-api" and hcm.rds.config_source.HasField("ads")
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    assert hcm.http_filters[0].HasField("typed_config")
    routes = resources.of_type(ROUTE_TYPE)["shop-api"].message
    (host,) = routes.virtual_hosts
    assert list(host.domains) == ["shop-api", "shop-api:50051"]
    (route,) = host.routes
    assert route.match.prefix == "" and route.route.cluster == "shop-api"
    assert route.route.max_stream_duration.max_stream_duration.seconds == 5
    cluster = resources.of_type(CLUSTER_TYPE)["shop-api"].message
    assert cluster.type == cluster.EDS and cluster.lb_policy == cluster.ROUND_ROBIN
    assert cluster.eds_cluster_config.eds_config.HasField("ads")
    assert cluster.lrs_server.HasField("self")
    assert cluster.circuit_breakers.thresholds[0].max_requests.value == 200
    assert not cluster.HasField("transport_socket")


def test_weights_are_locality_weights_and_origins_at_zero_a_priority_below(
        desired: Desired) -> None:
    intent = PopIntent(weights={"shop-api": {"primary": 0, "secondary": 70, "third": 30}})
    resources = translate_pop(desired, "ewr", ALL, intent)
    cla = resources.of_type(ENDPOINT_TYPE)["shop-api"].message
    assert [(e.locality.zone, e.load_balancing_weight.value, e.priority)
            for e in cla.endpoints] == [("primary", 1, 1), ("secondary", 70, 0), ("third", 30, 0)]
    assert [e.lb_endpoints[0].endpoint.address.socket_address.port_value
            for e in cla.endpoints] == [50051, 50052, 50051]
    assert not cla.HasField("policy")  # no overprovisioning factor: gRPC has none
    home = translate_pop(desired, "sjc", ALL).of_type(ENDPOINT_TYPE)["shop-api"].message
    assert [(e.locality.zone, e.load_balancing_weight.value, e.priority)
            for e in home.endpoints] == [("primary", 5, 0), ("secondary", 90, 0), ("third", 5, 0)]


def test_a_tls_service_names_the_certificate_provider(desired: Desired) -> None:
    cluster = translate_pop(desired, "ewr", ALL).of_type(CLUSTER_TYPE)["cart-api"].message
    context = UpstreamTlsContext()
    assert cluster.transport_socket.typed_config.Unpack(context)
    common = context.common_tls_context
    assert common.tls_certificate_provider_instance.instance_name == CERTIFICATE_PROVIDER
    assert common.tls_certificate_certificate_provider_instance.instance_name == \
        CERTIFICATE_PROVIDER  # what releases before the newer fields read
    validation = common.combined_validation_context
    assert validation.default_validation_context.ca_certificate_provider_instance.instance_name \
        == CERTIFICATE_PROVIDER
    assert [m.exact for m in validation.default_validation_context.match_subject_alt_names] == [
        "cart.internal"]


@pytest.mark.parametrize(("features", "left_out", "notes"), [
    (frozenset(), {"cart-api"}, {"cart-api: not sent", "max_requests not sent",
                                 "timeout not sent"}),
    (frozenset({"max_requests", "timeout"}), {"cart-api"}, {"cart-api: not sent"}),
    (frozenset({"tls"}), set(), {"max_requests not sent", "timeout not sent"}),
])
def test_what_a_release_lacks_is_left_out_with_a_note(
        desired: Desired, features: frozenset[str], left_out: set[str], notes: set[str]) -> None:
    resources = translate_pop(desired, "ewr", Capabilities(grpc=features))
    assert {"shop-api", "cart-api"} - set(resources.of_type(CLUSTER_TYPE)) == left_out
    assert all(any(note in said for said in resources.notes) for note in notes), resources.notes
    assert len(resources.notes) == len(notes)
    cluster = resources.of_type(CLUSTER_TYPE)["shop-api"].message
    assert cluster.HasField("circuit_breakers") == ("max_requests" in features)
    route = resources.of_type(ROUTE_TYPE)["shop-api"].message.virtual_hosts[0].routes[0]
    assert route.route.HasField("max_stream_duration") == ("timeout" in features)


def test_a_weight_change_rebuilds_only_that_assignment(desired: Desired) -> None:
    before = translate_pop(desired, "ewr", ALL)
    intent = PopIntent(weights={"shop-api": {"primary": 80, "secondary": 15, "third": 5}})
    after = translate_pop(desired, "ewr", ALL, intent, previous=before)
    assert built_resources(after) == ((ENDPOINT_TYPE, "shop-api"),)
    full = translate_pop(desired, "ewr", ALL, intent)
    assert {(t, n): r.payload for t, items in after.by_type.items() for n, r in items.items()} \
        == {(t, n): r.payload for t, items in full.by_type.items() for n, r in items.items()}


@pytest.mark.parametrize(("name", "version", "key", "shown"), [
    ("gRPC C-core linux Python", "C-core 58.0.0 Python 1.85.3",
     "grpc+max_requests+timeout+tls", "gRPC Python 1.85.3"),
    ("gRPC Java", "1.40.1", "grpc+max_requests+timeout", "gRPC Java 1.40.1"),
    ("gRPC Go", "1.36.0", "grpc", "gRPC Go 1.36.0"),
    ("gRPC Node Pure JS", "1.10.0", "grpc+max_requests+timeout", "gRPC Node 1.10.0"),
    ("gRPC C-core linux", "C-core 58.0.0", "grpc", "gRPC client of unknown release"),
])
def test_grpc_clients_are_told_apart_from_envoys_by_their_user_agent(
        name: str, version: str, key: str, shown: str) -> None:
    node = Node(id="n", user_agent_name=name, user_agent_version=version)
    read = read_node_capabilities(node)
    assert read.capabilities.key == key
    assert describe_grpc_client(node) == shown
    assert capabilities_for_key(key) == read.capabilities


def test_node_metadata_marks_a_grpc_client_of_unknown_release() -> None:
    metadata = Struct()
    metadata.update({"ballast_client": "grpc"})
    read = read_node_capabilities(Node(id="n", metadata=metadata))
    assert read.capabilities.key == "grpc" and "lacks" in read.reason
    assert read_node_capabilities(Node(id="n", user_agent_name="envoy")).capabilities.grpc is None


def test_envoys_reporting_load_get_no_per_endpoint_stats(desired: Desired) -> None:
    metadata = Struct()
    metadata.update({"ballast_load_reports": True})
    read = read_node_capabilities(Node(id="e", user_agent_name="envoy", metadata=metadata))
    assert read.capabilities.load_reports and read.capabilities.key.endswith("+lrs")
    resources = translate_pop(desired, "ewr", read.capabilities)
    cluster = resources.of_type(CLUSTER_TYPE)["shop.critical"].message
    assert not cluster.HasField("track_cluster_stats")
    plain = translate_pop(desired, "ewr", Capabilities()).of_type(CLUSTER_TYPE)
    assert plain["shop.critical"].message.track_cluster_stats.per_endpoint_stats
