"""The load-report server over real gRPC: what it answers, what it keeps, and how it refuses
what is over a bound, over an identity's budget, or not the certificate's node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import Locality, Node
from envoy.config.endpoint.v3.load_report_pb2 import ClusterStats, UpstreamLocalityStats
from envoy.service.load_stats.v3.lrs_pb2 import LoadStatsRequest, LoadStatsResponse

from control_plane.ads.budget import Ledger
from control_plane.ads.limits import AdsLimits
from control_plane.desired import parse_desired
from control_plane.observe.load_reports import LoadReports
from control_plane.observe.lrs_service import (
    SERVICE,
    LoadReportingServicer,
    add_load_reporting_service,
)
from tests.test_translate_grpc import TEXT

Stream = Callable[..., Any]


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, Stream]]:
    options = getattr(request, "param", {})
    store = LoadReports(parse_desired(TEXT, "grpc.yaml"))
    servicer = LoadReportingServicer(store, lambda pop: pop in ("ewr", "sjc"), interval_ms=1500,
                                     endpoint_granularity=True, clock=lambda: 5_000, **options)
    server = grpc.aio.server()
    add_load_reporting_service(server, servicer)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                        options=[("grpc.use_local_subchannel_pool", 1)])
    stream = channel.stream_stream(f"/{SERVICE}/StreamLoadStats",
                                   request_serializer=LoadStatsRequest.SerializeToString,
                                   response_deserializer=LoadStatsResponse.FromString)
    yield servicer, stream
    await channel.close()
    await server.stop(0)


def first(node_id: str = "g1", pop: str = "ewr") -> LoadStatsRequest:
    return LoadStatsRequest(node=Node(id=node_id, locality=Locality(zone=pop)))


def load(issued: int, zone: str = "primary") -> LoadStatsRequest:
    return LoadStatsRequest(cluster_stats=[ClusterStats(cluster_name="shop-api",
                                                        upstream_locality_stats=[
        UpstreamLocalityStats(locality=Locality(zone=zone), total_issued_requests=issued,
                              total_successful_requests=issued)])])


async def test_the_server_asks_for_every_cluster_and_keeps_the_reports(
        served: tuple[LoadReportingServicer, Stream]) -> None:
    servicer, stream = served
    call = stream()
    await call.write(first())
    answer = await call.read()
    assert answer.send_all_clusters and answer.report_endpoint_granularity
    assert answer.load_reporting_interval.ToMilliseconds() == 1500
    await call.write(load(7))
    await call.write(load(5, "secondary"))
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    signals = servicer.store.read_window(5_000, 1_000)["ewr", "shop-api"]
    assert {name: s.requests for name, s in signals.items()} == {"primary": 7, "secondary": 5}


@pytest.mark.parametrize(("opening", "code", "words"), [
    (first(pop="lhr"), grpc.StatusCode.INVALID_ARGUMENT, "unknown PoP 'lhr'"),
    (LoadStatsRequest(), grpc.StatusCode.INVALID_ARGUMENT, "must name the node"),
    (first(node_id="n" * 2000), grpc.StatusCode.INVALID_ARGUMENT, "must name the node"),
])
async def test_a_stream_must_open_with_a_known_node(
        served: tuple[LoadReportingServicer, Stream], opening: LoadStatsRequest,
        code: grpc.StatusCode, words: str) -> None:
    servicer, stream = served
    call = stream()
    await call.write(opening)
    assert await call.code() == code
    assert words in await call.details()
    assert servicer.store.nodes() == {}


async def test_a_report_over_a_bound_ends_the_stream(
        served: tuple[LoadReportingServicer, Stream]) -> None:
    servicer, stream = served
    call = stream()
    await call.write(first())
    await call.read()
    await call.write(LoadStatsRequest(cluster_stats=[ClusterStats(cluster_name="c")] * 5000))
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "clusters in one report" in await call.details()
    assert servicer.refused == 1


@pytest.mark.parametrize("served", [{"first_request_s": 0.2}], indirect=True)
async def test_a_stream_that_says_nothing_is_ended(
        served: tuple[LoadReportingServicer, Stream]) -> None:
    _, stream = served
    call = stream()
    assert await asyncio.wait_for(call.code(), 5) == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("served", [{
    "budget": Ledger(AdsLimits(streams_per_identity=1, held_bytes_per_identity=64)),
    "identify": lambda context: "spiffe://ballast/node/ewr/g1",
}], indirect=True)
async def test_an_identity_holds_its_budget_of_streams_and_bytes(
        served: tuple[LoadReportingServicer, Stream]) -> None:
    _, stream = served
    one = stream()
    await one.write(first())
    await one.read()
    two = stream()
    await two.write(first("g2"))
    assert await two.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1 streams open with this identity" in await two.details()
    await one.write(LoadStatsRequest(cluster_stats=[ClusterStats(cluster_name="x" * 100)]))
    assert await one.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more bytes" in await one.details()
    three = stream()  # the identity's stream went with the refusal: room for a new one
    await three.write(first("g3"))
    assert (await three.read()).send_all_clusters
    three.cancel()


@pytest.mark.parametrize("served", [{
    "verify_peer": lambda context, pop, node: None if (pop, node) == ("ewr", "g1")
    else f"the certificate is for node 'g1', the stream claims {node!r}",
}], indirect=True)
async def test_with_mtls_a_client_reports_for_its_certificates_node_only(
        served: tuple[LoadReportingServicer, Stream]) -> None:
    servicer, stream = served
    call = stream()
    await call.write(first("g2"))
    assert await call.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "the stream claims 'g2'" in await call.details()
    ok = stream()
    await ok.write(first("g1"))
    await ok.read()
    assert servicer.store.nodes() == {"g1": "ewr"}
    ok.cancel()
