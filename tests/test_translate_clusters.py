"""Tier clusters: the seeds' numbers land in the Cluster (breakers, timeouts, EDS, TLS, HTTP/1)."""

from __future__ import annotations

import dataclasses

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import UpstreamTlsContext
from envoy.extensions.upstreams.http.v3.http_protocol_options_pb2 import HttpProtocolOptions

from control_plane.desired.model import Desired, Origin
from control_plane.translate import translate_pop
from control_plane.translate.mirror import is_mirror_cluster
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, Capabilities
from harness.models import example_desired, shop_group


def clusters(desired: Desired | None = None) -> dict[str, Cluster]:
    """The tier clusters (mirror clusters: tests/test_translate_mirror.py)."""
    resources = translate_pop(desired or example_desired(), "ewr", Capabilities())
    return {name: r.message for name, r in resources.of_type(CLUSTER_TYPE).items()
            if not is_mirror_cluster(name)}


def test_one_cluster_per_group_and_tier_with_readable_names() -> None:
    assert list(clusters()) == ["shop.critical", "shop.normal", "shop.background"]


def test_circuit_breakers_from_tier_shares_and_queue_depths() -> None:
    got = {}
    for name, cluster in clusters().items():
        (threshold,) = cluster.circuit_breakers.thresholds
        assert threshold.priority == 0  # DEFAULT
        got[name] = (
            threshold.max_connections.value,
            threshold.max_requests.value,
            threshold.max_pending_requests.value,
            threshold.max_retries.value,
            threshold.retry_budget.budget_percent.value,
            threshold.retry_budget.min_retry_concurrency.value,
        )
    assert got == {
        "shop.critical": (84, 84, 2000, 13, 15.0, 2),
        "shop.normal": (30, 30, 8000, 5, 15.0, 1),
        # no retries of its own: its retries are of attempts no origin served, one per request
        "shop.background": (6, 6, 2000, 6, 100.0, 1),
    }


def test_a_tier_without_retries_keeps_its_budget_in_a_group_of_one_origin() -> None:
    desired = example_desired()
    (group,) = desired.origin_groups
    one = dataclasses.replace(group, origins=group.origins[:1],
                              preference={pop: (group.origins[0].name,) for pop in ("ewr", "sjc")})
    (threshold,) = clusters(dataclasses.replace(desired, origin_groups=(one,)))[
        "shop.background"].circuit_breakers.thresholds
    assert (threshold.max_retries.value, threshold.retry_budget.budget_percent.value,
            threshold.retry_budget.min_retry_concurrency.value) == (1, 15.0, 0)


def test_connect_timeouts_per_tier() -> None:
    got = {name: c.connect_timeout.ToMilliseconds() for name, c in clusters().items()}
    assert got == {"shop.critical": 300, "shop.normal": 500, "shop.background": 1000}


def test_eds_over_ads_with_locality_weighted_lb() -> None:
    for cluster in clusters().values():
        assert cluster.type == Cluster.EDS
        assert cluster.eds_cluster_config.eds_config.HasField("ads")
        assert cluster.eds_cluster_config.eds_config.resource_api_version == 2  # V3
        assert cluster.common_lb_config.HasField("locality_weighted_lb_config")


def test_http1_upstream_and_no_tls_for_plain_origins() -> None:
    for cluster in clusters().values():
        options = HttpProtocolOptions()
        packed = cluster.typed_extension_protocol_options[
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ]
        assert packed.Unpack(options)
        assert options.explicit_http_config.HasField("http_protocol_options")
        # idle connections close after a tier tick (5 s): a pool whose limit the tier controller
        # lowered keeps no idle connection beyond it (those would refuse instead of queueing)
        assert options.common_http_protocol_options.idle_timeout.seconds == 5
        assert not cluster.HasField("transport_socket")
        assert len(cluster.transport_socket_matches) == 0


def test_tls_origin_gets_sni_through_a_transport_socket_match() -> None:
    tls = Origin(name="primary", address="10.0.0.1", port=443, tls=True, sni="shop.example")
    desired = example_desired(shop_group(primary=tls))
    cluster = clusters(desired=desired)["shop.critical"]
    (match,) = cluster.transport_socket_matches
    assert match.name == "primary"
    assert dict(match.match) == {"origin": "primary"}
    context = UpstreamTlsContext()
    assert match.transport_socket.typed_config.Unpack(context)
    assert context.sni == "shop.example"
    cla = translate_pop(desired, "ewr", Capabilities()).of_type(ENDPOINT_TYPE)
    primary, secondary = cla["shop.critical"].message.endpoints
    metadata = primary.lb_endpoints[0].metadata.filter_metadata["envoy.transport_socket_match"]
    assert dict(metadata) == {"origin": "primary"}
    assert not secondary.lb_endpoints[0].HasField("metadata")


def test_tls_sni_defaults_to_the_origin_address() -> None:
    tls = Origin(name="secondary", address="origin-b.example", port=443, tls=True)
    cluster = clusters(desired=example_desired(shop_group(secondary=tls)))["shop.normal"]
    context = UpstreamTlsContext()
    cluster.transport_socket_matches[0].transport_socket.typed_config.Unpack(context)
    assert context.sni == "origin-b.example"


def test_per_endpoint_stats_on_every_tier_cluster() -> None:
    """Per-host counters count every attempt (retries too): observe reads origin errors there."""
    for cluster in clusters().values():
        assert cluster.track_cluster_stats.per_endpoint_stats


def _tls_context(origin: Origin) -> UpstreamTlsContext:
    cluster = clusters(desired=example_desired(shop_group(primary=origin)))["shop.critical"]
    context = UpstreamTlsContext()
    assert cluster.transport_socket_matches[0].transport_socket.typed_config.Unpack(context)
    return context


def test_tls_origin_certificate_is_verified_by_default() -> None:
    validation = _tls_context(
        Origin(name="primary", address="10.0.0.1", port=443, tls=True, sni="shop.example")
    ).common_tls_context.validation_context
    assert validation.trusted_ca.filename == "/etc/ssl/certs/ca-certificates.crt"
    (san,) = validation.match_typed_subject_alt_names
    assert (san.san_type, san.matcher.exact) == (san.DNS, "shop.example")
    assert list(validation.verify_certificate_spki) == []
    assert list(validation.verify_certificate_hash) == []


def test_tls_verification_name_ca_and_pins() -> None:
    validation = _tls_context(Origin(
        name="primary", address="10.0.0.1", port=443, tls=True, verify_name="10.0.0.9",
        ca_file="/etc/origin-ca.pem", spki_pins=("a",), cert_pins=("b",),
    )).common_tls_context.validation_context
    assert validation.trusted_ca.filename == "/etc/origin-ca.pem"
    (san,) = validation.match_typed_subject_alt_names
    assert (san.san_type, san.matcher.exact) == (san.IP_ADDRESS, "10.0.0.9")
    assert (list(validation.verify_certificate_spki),
            list(validation.verify_certificate_hash)) == (["a"], ["b"])


def test_tls_without_verification_only_when_turned_off() -> None:
    context = _tls_context(
        Origin(name="primary", address="10.0.0.1", port=443, tls=True, verify=False))
    assert context.sni == "10.0.0.1"
    assert not context.HasField("common_tls_context")
