"""The sans-I/O ADS core: table tests with hand-made snapshots (real xds-protos messages)."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration

from control_plane.ads.delta import DeltaStream
from control_plane.ads.index import items_version
from control_plane.ads.protocol import Ack, DeltaResponse, Nack, ProtocolError, SotwResponse
from control_plane.ads.sotw import SotwStream
from control_plane.translate.resources import (
    CLUSTER_TYPE as CDS,
)
from control_plane.translate.resources import (
    ENDPOINT_TYPE as EDS,
)
from control_plane.translate.resources import (
    LISTENER_TYPE as LDS,
)
from control_plane.translate.resources import (
    ROUTE_TYPE as RDS,
)
from control_plane.translate.resources import (
    Capabilities,
    PopResources,
    Resource,
)
from tests.support.ads_requests import delta_request, sotw_request


def snap(
    clusters: dict[str, int] | None = None,
    weights: dict[str, int] | None = None,
    listeners: tuple[str, ...] = ("edge",),
) -> PopResources:
    """clusters: name -> connect timeout (a CDS change), weights: name -> endpoint weight."""
    clusters = {"a": 1, "b": 1} if clusters is None else clusters
    weights = weights or {}
    by_type = {
        CDS: {
            n: Resource.of(CDS, n, Cluster(name=n, connect_timeout={"seconds": t}))
            for n, t in clusters.items()
        },
        EDS: {n: Resource.of(EDS, n, _cla(n, weights.get(n, 100))) for n in clusters},
        LDS: {n: Resource.of(LDS, n, Listener(name=n)) for n in listeners},
        RDS: {n: Resource.of(RDS, n, RouteConfiguration(name=n)) for n in listeners},
    }
    return PopResources("ewr", Capabilities(), by_type)


def _cla(name: str, weight: int) -> ClusterLoadAssignment:
    cla = ClusterLoadAssignment(cluster_name=name)
    cla.endpoints.add().load_balancing_weight.value = weight
    return cla


def names(response: SotwResponse | DeltaResponse) -> list[str]:
    return [r.name for r in response.resources]


def sotw_connected(s: PopResources) -> tuple[SotwStream, dict[str, str]]:
    """A SotW stream that went through Envoy's start-up (CDS, EDS, LDS, RDS) and ACKed all."""
    stream = SotwStream()
    nonces: dict[str, str] = {}
    for type_url, subscribed in ((CDS, ()), (EDS, ("a", "b")), (LDS, ()), (RDS, ("edge",))):
        (response,) = stream.on_request(sotw_request(type_url, subscribed), s).responses
        step = stream.on_request(sotw_request(type_url, subscribed, response.nonce), s)
        assert step.responses == [] and isinstance(step.events[0], Ack)
        nonces[type_url] = response.nonce
    return stream, nonces


def delta_connected(s: PopResources) -> DeltaStream:
    stream = DeltaStream()
    for type_url, subscribed in ((CDS, ()), (EDS, ("a", "b")), (LDS, ()), (RDS, ("edge",))):
        (response,) = stream.on_request(delta_request(type_url, subscribed), s).responses
        assert stream.on_request(delta_request(type_url, nonce=response.nonce), s).responses == []
    return stream


# -- state of the world ---------------------------------------------------------------------


def test_sotw_wildcard_and_named_first_requests() -> None:
    s = snap()
    stream = SotwStream()
    (cds,) = stream.on_request(sotw_request(CDS), s).responses
    assert isinstance(cds, SotwResponse)
    assert sorted(names(cds)) == ["a", "b"] and cds.version == s.type_version(CDS)
    (eds,) = stream.on_request(sotw_request(EDS, ("a",)), s).responses
    assert names(eds) == ["a"]  # exactly the subscribed names
    assert [r.payload for r in eds.resources] == [s.of_type(EDS)["a"].payload]


def test_sotw_ack_nack_and_stale_nonce() -> None:
    s = snap()
    stream = SotwStream()
    (first,) = stream.on_request(sotw_request(CDS), s).responses
    step = stream.on_request(sotw_request(CDS, nonce=first.nonce), s)
    assert step.events == [Ack(CDS, first.version, first.nonce)] and step.responses == []
    s2 = snap({"a": 2, "b": 1})
    (second,) = stream.on_resources(s2).responses
    assert second.nonce != first.nonce
    stale = stream.on_request(sotw_request(CDS, nonce=first.nonce, error="late"), s2)
    assert stale.events == [] and stale.responses == []  # ignored entirely
    nack = stream.on_request(sotw_request(CDS, nonce=second.nonce, error="bad cluster a"), s2)
    assert nack.events == [Nack(CDS, second.version, second.nonce, "bad cluster a")]
    assert nack.responses == []


def test_sotw_nacked_version_is_not_resent_until_content_changes() -> None:
    s = snap()
    stream, _ = sotw_connected(s)
    bad = snap({"a": 2, "b": 1})
    step = stream.on_resources(bad)
    cds = next(r for r in step.responses if r.type_url == CDS)
    stream.on_request(sotw_request(CDS, nonce=cds.nonce, error="no"), bad)
    for _ in range(5):  # same snapshot again and again: nothing goes out
        assert stream.on_resources(bad).responses == []
        assert stream.on_request(sotw_request(CDS, nonce=cds.nonce), bad).responses == []
    fixed = snap({"a": 3, "b": 1})
    assert [r.type_url for r in stream.on_resources(fixed).responses] == [CDS, EDS]


def test_sotw_unknown_names_are_remembered_and_sent_when_they_appear() -> None:
    s = snap()
    stream, nonces = sotw_connected(s)
    step = stream.on_request(sotw_request(EDS, ("a", "b", "c"), nonces[EDS]), s)
    assert step.responses == []  # "c" does not exist yet, nothing else changed
    grown = snap({"a": 1, "b": 1, "c": 1})
    responses = stream.on_resources(grown).responses
    assert [r.type_url for r in responses] == [CDS, EDS]
    assert names(responses[1]) == ["a", "b", "c"]


def test_sotw_weight_change_pushes_only_eds() -> None:
    s = snap()
    stream, _ = sotw_connected(s)
    (eds,) = stream.on_resources(snap(weights={"a": 30})).responses
    assert eds.type_url == EDS and sorted(names(eds)) == ["a", "b"]


def test_sotw_cds_change_resends_unchanged_eds_warming() -> None:
    s = snap()
    stream, nonces = sotw_connected(s)
    changed = snap({"a": 5, "b": 1})  # cluster a changes, its endpoints do not
    assert changed.type_version(EDS) == s.type_version(EDS)
    cds, eds = stream.on_resources(changed).responses
    assert (cds.type_url, eds.type_url) == (CDS, EDS) and "a" in names(eds)
    # Envoy's re-request with the old EDS nonce is stale: no second EDS
    assert stream.on_request(sotw_request(EDS, ("a", "b"), nonces[EDS]), changed).responses == []


def test_sotw_make_before_break_order() -> None:
    s = snap({"a": 1, "b": 1}, listeners=("edge",))
    stream, _ = sotw_connected(s)
    # b goes away, c arrives, listener edge2 added
    new = snap({"a": 1, "c": 1}, listeners=("edge", "edge2"))
    responses = stream.on_resources(new).responses
    assert [r.type_url for r in responses] == [CDS, EDS, LDS, CDS]
    assert sorted(names(responses[0])) == ["a", "b", "c"]  # b kept while routes move
    assert sorted(names(responses[-1])) == ["a", "c"]  # removed last


def test_sotw_rejects_unknown_type_without_state_change() -> None:
    stream = SotwStream()
    with pytest.raises(ProtocolError, match="unsupported type_url"):
        stream.on_request(sotw_request("type.googleapis.com/envoy.Nope"), snap())
    with pytest.raises(ProtocolError, match="without type_url"):
        stream.on_request(sotw_request(""), snap())
    assert not stream.subscribed("type.googleapis.com/envoy.Nope")


def test_sotw_empty_wildcard_is_answered_named_empty_is_not() -> None:
    empty = PopResources("ewr", Capabilities(), {})
    stream = SotwStream()
    (cds,) = stream.on_request(sotw_request(CDS), empty).responses
    assert cds.resources == () and cds.version == items_version({})
    assert stream.on_request(sotw_request(EDS, ("a",)), empty).responses == []


# -- delta ----------------------------------------------------------------------------------


def test_delta_weight_change_sends_only_that_cla() -> None:
    s = snap()
    stream = delta_connected(s)
    (eds,) = stream.on_resources(snap(weights={"b": 40})).responses
    assert isinstance(eds, DeltaResponse)
    assert eds.type_url == EDS and names(eds) == ["b"] and eds.removed == ()


def test_delta_initial_versions_are_not_resent() -> None:
    s = snap()
    stream = DeltaStream()
    have = {"a": s.of_type(CDS)["a"].version, "b": "stale"}
    (cds,) = stream.on_request(delta_request(CDS, initial=have), s).responses
    assert names(cds) == ["b"]
    have_all = {n: r.version for n, r in s.of_type(EDS).items()}
    assert stream.on_request(delta_request(EDS, ("a", "b"), initial=have_all), s).responses == []


def test_delta_removals_come_last_in_reverse_order() -> None:
    s = snap({"a": 1, "b": 1}, listeners=("edge", "old"))
    stream = DeltaStream()
    for type_url, subscribed in ((CDS, ()), (EDS, ("a", "b")), (LDS, ()), (RDS, ("edge", "old"))):
        stream.on_request(delta_request(type_url, subscribed), s)
    new = snap({"a": 1, "c": 1}, listeners=("edge",))
    responses = stream.on_resources(new).responses
    order = [(r.type_url, names(r), list(r.removed)) for r in responses]
    assert order == [
        (CDS, ["c"], []),
        (RDS, [], ["old"]),
        (LDS, [], ["old"]),
        (EDS, [], ["b"]),
        (CDS, [], ["b"]),
    ]


def test_delta_ack_nack_and_no_resend_loop() -> None:
    s = snap()
    stream = delta_connected(s)
    bad = snap({"a": 9, "b": 1})
    cds, eds = stream.on_resources(bad).responses
    assert names(cds) == ["a"] and names(eds) == ["a"]  # warming: a's CLA again
    nack = stream.on_request(delta_request(CDS, nonce=cds.nonce, error="nope"), bad)
    assert nack.events == [Nack(CDS, cds.version, cds.nonce, "nope")] and nack.responses == []
    ack = stream.on_request(delta_request(EDS, nonce=eds.nonce), bad)
    assert ack.events == [Ack(EDS, eds.version, eds.nonce)]
    assert stream.on_resources(bad).responses == []
    assert [names(r) for r in stream.on_resources(snap({"a": 10, "b": 1})).responses] == [
        ["a"],
        ["a"],
    ]


def test_delta_subscribe_later_and_unsubscribe() -> None:
    s = snap()
    stream = delta_connected(s)
    assert stream.on_request(delta_request(EDS, ("z",)), s).responses == []  # remembered
    grown = snap({"a": 1, "b": 1, "z": 1})
    responses = stream.on_resources(grown).responses
    assert [(r.type_url, names(r)) for r in responses] == [(CDS, ["z"]), (EDS, ["z"])]
    assert stream.on_request(delta_request(EDS, unsubscribe=("z",)), grown).responses == []
    (again,) = stream.on_request(delta_request(EDS, ("z",)), grown).responses
    assert names(again) == ["z"]


def test_delta_nonce_of_another_type_is_an_error_and_keeps_state() -> None:
    s = snap()
    stream = DeltaStream()
    (cds,) = stream.on_request(delta_request(CDS), s).responses
    with pytest.raises(ProtocolError, match="answers a CDS response"):
        stream.on_request(delta_request(LDS, nonce=cds.nonce), s)
    assert not stream.subscribed(LDS)
    assert stream.on_request(delta_request(CDS, nonce=cds.nonce), s).events == [
        Ack(CDS, cds.version, cds.nonce)
    ]


def test_sotw_nacked_version_goes_again_after_another_version() -> None:
    s = snap()
    stream, _ = sotw_connected(s)
    bad, good = snap({"a": 2, "b": 1}), snap({"a": 3, "b": 1})
    cds = stream.on_resources(bad).responses[0]
    stream.on_request(sotw_request(CDS, nonce=cds.nonce, error="no"), bad)
    cds2 = stream.on_resources(good).responses[0]
    stream.on_request(sotw_request(CDS, nonce=cds2.nonce), good)
    again = stream.on_resources(bad).responses[0]  # the content changed back: send it
    assert again.type_url == CDS and again.version == cds.version
