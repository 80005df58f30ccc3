"""Pre-encoded ADS responses (`control_plane/ads/encoding.py`): the bytes parse to exactly the
message `encode_sotw`/`encode_delta` build, and the shared body is serialized once for all
streams of a PoP."""

from __future__ import annotations

import asyncio

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.ads import encoding
from control_plane.ads.delta import DeltaStream
from control_plane.ads.encoding import ResponseEncoder, encode_delta, encode_sotw, pass_bytes
from control_plane.ads.index import index
from control_plane.ads.protocol import DeltaResponse, SotwResponse
from control_plane.ads.server import AdsServicer
from control_plane.ads.sotw import SotwStream
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.translate.resources import ENDPOINT_TYPE as EDS
from control_plane.translate.resources import Capabilities, PopResources, Resource
from tests.support.ads_requests import delta_request, sotw_request


def make(type_url: str, name: str, variant: int) -> Resource:
    if type_url == CDS:
        return Resource.of(CDS, name, Cluster(name=name, connect_timeout={"seconds": variant}))
    cla = ClusterLoadAssignment(cluster_name=name)
    cla.endpoints.add().load_balancing_weight.value = variant + 1
    return Resource.of(EDS, name, cla)


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
strings = st.one_of(st.just(""), names, st.text(max_size=300))  # "" and > 127 bytes (varint)
resource_sets = st.lists(
    st.tuples(st.sampled_from((CDS, EDS)), names, st.integers(0, 5)), max_size=8
).map(lambda specs: tuple(make(t, n, v) for t, n, v in specs))


@settings(max_examples=200, deadline=None)
@given(resource_sets, strings, strings, st.sampled_from((CDS, EDS, "")), st.data())
def test_sotw_bytes_parse_to_the_message(resources, version, nonce, type_url, data):
    encoder = ResponseEncoder(max_entries=data.draw(st.integers(1, 4)))
    response = SotwResponse(type_url, version, nonce, resources)
    expected = encode_sotw(response)
    for _ in range(2):  # built, then from the cache
        wire = encoder.encode(response)
        assert DiscoveryResponse.FromString(wire) == expected
        assert len(wire) == expected.ByteSize()
    # same body, other stream: only version and nonce differ
    other = SotwResponse(type_url, data.draw(strings), data.draw(strings), resources)
    assert DiscoveryResponse.FromString(encoder.encode(other)) == encode_sotw(other)
    # equal content in a new tuple: the content key finds the same body
    copy = SotwResponse(type_url, version, nonce, tuple(resources))
    assert DiscoveryResponse.FromString(encoder.encode(copy)) == expected


@settings(max_examples=200, deadline=None)
@given(resource_sets, strings, strings, st.lists(names, max_size=5).map(tuple), st.data())
def test_delta_bytes_parse_to_the_message(resources, version, nonce, removed, data):
    encoder = ResponseEncoder(max_entries=data.draw(st.integers(1, 4)))
    type_url = data.draw(st.sampled_from((CDS, EDS)))
    response = DeltaResponse(type_url, version, nonce, resources, removed)
    expected = encode_delta(response)
    for _ in range(2):
        wire = encoder.encode(response)
        assert DeltaDiscoveryResponse.FromString(wire) == expected
        assert len(wire) == expected.ByteSize()
    # same resources, other removals: not the same body
    fewer = DeltaResponse(type_url, version, nonce, resources, removed[1:])
    assert DeltaDiscoveryResponse.FromString(encoder.encode(fewer)) == encode_delta(fewer)
    # a SotW response of the same resources does not get the delta body
    sotw = SotwResponse(type_url, version, nonce, resources)
    assert DiscoveryResponse.FromString(encoder.encode(sotw)) == encode_sotw(sotw)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(resource_sets, strings, strings, st.booleans()), max_size=30))
def test_a_small_cache_stays_correct_and_bounded(sequence):
    encoder = ResponseEncoder(max_entries=2)
    for resources, version, nonce, delta in sequence:
        if delta:
            response = DeltaResponse(EDS, version, nonce, resources, ())
            assert DeltaDiscoveryResponse.FromString(encoder.encode(response)) == encode_delta(
                response
            )
        else:
            response = SotwResponse(EDS, version, nonce, resources)
            assert DiscoveryResponse.FromString(encoder.encode(response)) == encode_sotw(response)
        assert len(encoder._by_identity) <= 2 and len(encoder._by_content) <= 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(resource_sets, strings), max_size=30), st.integers(0, 300))
def test_the_caches_keep_at_most_max_bytes_of_bodies(sequence, max_bytes):
    encoder = ResponseEncoder(max_bytes=max_bytes)
    for resources, version in sequence:
        response = SotwResponse(EDS, version, "1", resources)
        assert DiscoveryResponse.FromString(encoder.encode(response)) == encode_sotw(response)
        for cache, kept, at in ((encoder._by_content, encoder._content_bytes, 0),
                                (encoder._by_identity, encoder._identity_bytes, 1)):
            bodies = [v[at] for v in cache.values()]
            assert kept == sum(map(len, bodies))
            assert kept <= max_bytes or len(bodies) == 1  # the newest always fits


def test_bodies_idle_past_keep_bytes_leave_and_reloads_do_not_accumulate():
    now = [0.0]
    encoder = ResponseEncoder(keep_bytes=0, idle_s=60.0, clock=lambda: now[0])
    live = tuple(make(CDS, f"live{i}", 0) for i in range(3))
    for reload in range(50):  # a reload a minute: every body new, the live one asked for
        now[0] = reload * 60.0
        encoder.encode(SotwResponse(EDS, "v", "1", tuple(make(EDS, f"e{i}", reload)
                                                          for i in range(3))))
        encoder.encode(SotwResponse(CDS, "v", "1", live))
        assert len(encoder._by_content) <= 3 and len(encoder._by_identity) <= 3
    held = encoder.held_bytes()
    assert held > 0
    builds = encoder.builds
    now[0] += 30.0  # asked for again within idle_s: from the cache
    encoder.encode(SotwResponse(CDS, "v", "1", live))
    assert encoder.builds == builds


def test_idle_bodies_stay_while_the_caches_hold_less_than_keep_bytes():
    now = [0.0]
    encoder = ResponseEncoder(idle_s=1.0, clock=lambda: now[0])
    first = tuple(make(EDS, f"e{i}", 0) for i in range(3))
    encoder.encode(SotwResponse(EDS, "v", "1", first))
    for step in range(1, 20):
        now[0] = step * 10.0
        encoder.encode(SotwResponse(EDS, "v", "1", tuple(make(EDS, f"e{i}", step)
                                                          for i in range(3))))
    builds = encoder.builds
    encoder.encode(SotwResponse(EDS, "v", "1", first))  # idle 190 s, but under keep_bytes
    assert encoder.builds == builds and len(encoder._by_content) == 20


def snapshot(variant: int) -> PopResources:
    clusters = {f"c{i}": make(CDS, f"c{i}", 0) for i in range(20)}
    endpoints = {f"c{i}": make(EDS, f"c{i}", variant if i < 3 else 0) for i in range(20)}
    return PopResources("ewr", Capabilities(), {CDS: clusters, EDS: endpoints})


def test_shared_body_is_built_once_for_many_streams(monkeypatch):
    serialized = 0
    original = encoding.encode_sotw

    def counting(response):
        nonlocal serialized
        serialized += 1
        return original(response)

    monkeypatch.setattr(encoding, "encode_sotw", counting)
    encoder = ResponseEncoder()
    first, second = snapshot(0), snapshot(1)
    streams = [SotwStream() for _ in range(100)]
    wires: list[bytes] = []
    for stream in streams:
        for response in stream.on_request(sotw_request(CDS), first).responses:
            wires.append(encoder.encode(response))
        eds = sotw_request(EDS, names=list(index(first, CDS).items))
        for response in stream.on_request(eds, first).responses:
            wires.append(encoder.encode(response))
    assert serialized == 2  # CDS and EDS bodies, not 200
    assert len(wires) == 200
    pushed = [encoder.encode(r) for s in streams for r in s.on_resources(second).responses]
    assert len(pushed) == 100  # the new EDS, once per stream
    assert serialized == 3 and encoder.builds == 3
    messages = [DiscoveryResponse.FromString(w) for w in pushed]
    assert len({m.nonce for m in messages}) == 1  # every stream's 3rd response: nonce "3"
    assert all(m.resources == messages[0].resources for m in messages)


def test_delta_shared_body_is_built_once_for_many_streams():
    encoder = ResponseEncoder()
    first, second = snapshot(0), snapshot(1)
    streams = [DeltaStream() for _ in range(100)]
    for stream in streams:
        for response in stream.on_request(delta_request(CDS), first).responses:
            encoder.encode(response)
        eds = delta_request(EDS, subscribe=list(index(first, CDS).items))
        for response in stream.on_request(eds, first).responses:
            encoder.encode(response)
    assert encoder.builds == 2
    pushed = [r for s in streams for r in s.on_resources(second).responses]
    for response in pushed:
        assert len(response.resources) == 3  # only the changed endpoints
        assert DeltaDiscoveryResponse.FromString(encoder.encode(response)) == encode_delta(
            response
        )
    assert encoder.builds == 3


def test_servicer_writes_bytes_through_a_pass_through_serializer():
    handlers: list = []

    class Server:
        def add_generic_rpc_handlers(self, generic):
            handlers.extend(generic)

        def add_registered_method_handlers(self, service, methods):
            handlers.append((service, methods))

    servicer = AdsServicer.__new__(AdsServicer)
    AdsServicer.add_to(servicer, Server())  # type: ignore[arg-type]
    service, methods = handlers[-1]
    assert service == "envoy.service.discovery.v3.AggregatedDiscoveryService"
    assert set(methods) == {"StreamAggregatedResources", "DeltaAggregatedResources"}
    for handler in methods.values():
        assert handler.response_serializer is pass_bytes
    assert asyncio.iscoroutinefunction(methods["StreamAggregatedResources"].stream_stream)
