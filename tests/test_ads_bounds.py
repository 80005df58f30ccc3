"""Every client-supplied input of the ADS server is bounded (issue 8, "every input bounded").

Each test is one observation of the issue, against a real grpc.aio server on loopback: a node
id of megabytes, NACKs with huge messages, distinct node ids and name lists that were kept
forever, requests queued without limit from a client that does not read, streams per
connection, and the pure checks of the protocol core.
"""

from __future__ import annotations

import asyncio
import gc
import resource
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control_plane.ads import delta, sotw
from control_plane.ads import index as index_module
from control_plane.ads.delta import DeltaStream
from control_plane.ads.limits import AdsLimits, clip
from control_plane.ads.nodes import NodeEntry
from control_plane.ads.protocol import ProtocolError
from control_plane.ads.sotw import SotwStream
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.translate.resources import ENDPOINT_TYPE as EDS
from control_plane.translate.resources import Capabilities
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.eventually import eventually
from harness.xds_client import XdsClient, local_channel, make_node

Records = list[tuple[str, dict[str, Any]]]
CLUSTERS = 4  # the example's 3 tier clusters and its standby's mirror cluster
SMALL = AdsLimits(names_per_subscription=100, streams_per_connection=4)


async def start(limits: AdsLimits = SMALL) -> tuple[BallastServer, Records]:
    records: Records = []
    ballast = BallastServer(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082),
        xds_address="127.0.0.1:0",
        record=lambda kind, fields: records.append((kind, fields)),
        limits=limits,
    )
    await ballast.start()
    return ballast, records


@pytest.fixture
async def server() -> AsyncIterator[tuple[BallastServer, Records]]:
    ballast, records = await start()
    try:
        yield ballast, records
    finally:
        await ballast.stop(0.2)


async def refused(ballast: BallastServer, node_id: str, request: Any, *, delta: bool) -> str:
    """Connect, send `request` (after a CDS subscription); the INVALID_ARGUMENT details."""
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        client = await XdsClient(channel, make_node(node_id, "ewr"), delta=delta).start()
        if request is not None:
            await client.subscribe(CDS)
            await client.wait_for(lambda c: len(c.names(CDS)) == CLUSTERS)
            await client.send_raw(request)
        else:
            await client.subscribe(CDS)
        await asyncio.wait_for(client.done.wait(), 5)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        await client.close()
        return client.error.details() or ""
    finally:
        await channel.close()


def test_clip_keeps_short_text_and_notes_the_length_of_long_text() -> None:
    assert clip("short", 10) == "short"
    clipped = clip("x" * 5000, 100)
    assert clipped.startswith("x" * 100) and "5,000 characters" in clipped
    assert len(clipped) < 150


def test_clip_with_a_tail_keeps_the_start_and_the_end() -> None:
    text = "Error adding/updating listener(s) edge: " + "config " * 1000 + ": the reason"
    clipped = clip(text, 200, tail=100)
    assert clipped.startswith("Error adding/updating listener(s) edge: config")
    assert clipped.endswith(": the reason") and f"{len(text):,} characters" in clipped
    assert len(clipped) < 250
    assert clip(text, len(text), tail=100) == text


async def test_a_node_id_of_megabytes_is_refused_and_never_recorded(server: Any) -> None:
    ballast, records = server
    details = await refused(ballast, "n" * 3_000_000, None, delta=False)
    assert "3,000,000 characters" in details and "limit is 1024" in details
    assert len(details) < 400
    assert records == [] and len(ballast.nodes) == 0


@pytest.mark.parametrize("delta", [False, True])
async def test_too_many_or_too_long_names_end_the_stream(server: Any, delta: bool) -> None:
    ballast, _ = server
    many = [f"c{i}" for i in range(SMALL.names_per_subscription + 1)]
    long_name = ["n" * (SMALL.name_chars + 1)]
    for names, expected in ((many, "101 names; the limit is 100"),
                            (long_name, "a name of 513 characters; the limit is 512")):
        request: Any = (
            DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=names) if delta
            else DiscoveryRequest(type_url=EDS, resource_names=names)
        )
        details = await refused(ballast, "greedy", request, delta=delta)
        assert expected in details


async def test_long_nonce_and_type_url_are_refused_with_a_short_message(server: Any) -> None:
    ballast, _ = server
    nonce = DiscoveryRequest(type_url=CDS, response_nonce="9" * 10_000)
    assert "10,000 characters" in await refused(ballast, "n1", nonce, delta=False)
    type_url = DiscoveryRequest(type_url="t" * 1_000_000)
    details = await refused(ballast, "n2", type_url, delta=False)
    assert "unsupported type_url" in details and "1,000,000 characters" in details
    assert len(details) < 1000


def test_delta_subscription_grows_only_to_the_limit() -> None:
    snapshot = _snapshot()
    stream = DeltaStream(SMALL)
    for start_at in range(0, 100, 50):
        names = [f"c{i}" for i in range(start_at, start_at + 50)]
        stream.on_request(
            DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=names), snapshot
        )
    with pytest.raises(ProtocolError, match="would hold 101 names; the limit is 100"):
        stream.on_request(
            DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["one-more"]), snapshot
        )
    # unsubscribing in the same request keeps it within the limit
    stream.on_request(
        DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["one-more"],
                              resource_names_unsubscribe=["c0"]),
        snapshot,
    )


def test_distinct_name_lists_do_not_grow_the_shared_caches() -> None:
    """Name lists are client-supplied: neither the interning cache nor the per-snapshot views
    keep more than their byte/name bounds, however many distinct lists arrive."""
    snapshot = _snapshot()
    limits = AdsLimits()
    streams = [SotwStream(limits) for _ in range(50)]
    for round_ in range(40):
        for i, stream in enumerate(streams):
            count = limits.names_per_subscription // 20
            names = [f"junk-{round_}-{i}-{n}-" + "x" * 200 for n in range(count)]
            stream.on_request(DiscoveryRequest(type_url=EDS, resource_names=names), snapshot)
    assert sotw._REQUESTED_BYTES[0] <= sotw.MAX_REQUESTED_BYTES
    assert sum(map(len, sotw._REQUESTED)) == sotw._REQUESTED_BYTES[0]
    views = index_module.index(snapshot, EDS)._views
    # junk subscriptions (names of nothing that exists) are never kept with the snapshot
    assert all(len(names) <= 2 * len(view.items) + index_module.SLACK_NAMES
               for names, view in views.items())
    assert sum(map(len, views)) <= index_module.MAX_VIEW_NAMES


async def test_nack_storm_is_recorded_once_clipped_and_counted(server: Any) -> None:
    ballast, records = server
    huge = "bad cluster " * 100_000 + ": why Envoy refused it"  # Envoy gives the reason last
    rejecting = True

    def reject(type_url: str, names: list[str]) -> str | None:
        return huge if type_url == CDS and rejecting else None

    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        client = await XdsClient(channel, make_node("picky", "ewr"), reject=reject).start()
        await client.subscribe(CDS)
        await client.wait_for(lambda c: len(c.responses(CDS)) == 1)
        nonce = client.responses(CDS)[0].nonce
        for _ in range(200):  # the same NACK, again and again (a replaying client)
            bad = DiscoveryRequest(type_url=CDS, response_nonce=nonce)
            bad.error_detail.message = huge
            await client.send_raw(bad)

        def counted() -> int:
            (status,) = ballast.nodes.statuses()
            nack = {t.type: t for t in status.types}["CDS"].last_nack
            return 0 if nack is None else nack.count

        await eventually(lambda: counted() == 201, 5, "201 NACKs counted")
        nacks = [fields for kind, fields in records if kind == "nack"]
        assert len(nacks) == 1
        assert len(nacks[0]["message"]) < SMALL.message_chars + 100
        assert f"{len(huge):,} characters" in nacks[0]["message"]
        assert nacks[0]["message"].endswith(": why Envoy refused it")
        (status,) = ballast.nodes.statuses()
        kept = {t.type: t for t in status.types}["CDS"].last_nack
        assert kept is not None and len(kept.message) < SMALL.message_chars + 100
        rejecting = False
        await client.close()
        await eventually(lambda: records[-1][0] == "node_disconnected", 5, "the disconnect record")
        assert records[-1][1]["repeated_nacks"] == {"CDS": 200}
    finally:
        await channel.close()


async def test_per_stream_bookkeeping_is_freed_when_streams_end(server: Any) -> None:
    """Distinct node ids (capability fallback records, NACK counts) leave nothing behind."""
    ballast, records = server
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        for i in range(30):  # sjc wants adaptive LIFO; these nodes lack it: a fallback each
            client = await XdsClient(channel, make_node(f"node-{i}", "sjc")).start()
            await client.subscribe(CDS)
            await client.wait_for(lambda c: len(c.names(CDS)) == CLUSTERS)
            await client.close()
        await eventually(lambda: len(ballast.nodes) == 0 and not ballast.ads._streams, 5,
                         "every stream gone")
        gc.collect()
        assert len(ballast.nodes) == 0 and not ballast.ads.callbacks._pushed  # type: ignore[attr-defined]
        # what a stream keeps (fallback version, NACK counts) lives in its entry: gone with it
        assert not [obj for obj in gc.get_objects() if isinstance(obj, NodeEntry)]
        assert not [name for name, value in vars(ballast.ads).items()
                    if isinstance(value, set | dict) and value]
        # the fallback is still recorded once per stream and CDS version
        assert sum(kind == "capability_fallback" for kind, _ in records) == 30
    finally:
        await channel.close()


async def test_streams_per_connection_are_bounded(server: Any) -> None:
    ballast, _ = server
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    clients = []
    try:
        for i in range(SMALL.streams_per_connection + 3):
            client = await XdsClient(channel, make_node(f"multi-{i}", "ewr")).start()
            clients.append(client)
            asyncio.get_running_loop().create_task(client.subscribe(CDS))
        await eventually(lambda: len(ballast.nodes) == SMALL.streams_per_connection, 5,
                         "the connection's stream slots taken")
        await asyncio.sleep(0.3)  # the others are held by the client, not served
        assert len(ballast.nodes) == SMALL.streams_per_connection
        await clients[0].close()  # a slot frees: the next waiting stream gets it
        await eventually(
            lambda: sum(len(c.names(CDS)) == CLUSTERS for c in clients[1:])
            == SMALL.streams_per_connection, 5, "the next waiting stream served")
    finally:
        for client in clients:
            await client.close()
        await channel.close()


async def test_a_client_that_does_not_read_stops_being_read(server: Any) -> None:
    """Requests whose responses the client never reads: the server's writes block, it stops
    reading that stream (one request read at a time), and the client's own writes stall
    on gRPC flow control instead of piling up in the server's memory (before: 40 MB/s)."""
    ballast, _ = server
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # a client with a small receive window that never grows (no BDP probing): its window fills
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{ballast.port}",
        options=[("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0),
                 ("grpc.http2.lookahead_bytes", 16384)],
    )
    call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
    try:
        first = DiscoveryRequest(type_url=CDS)
        first.node.CopyFrom(make_node("deaf", "ewr"))
        await call.write(first)
        padding = [f"not-there-{i}-" + "p" * 100 for i in range(90)]  # ~10 KB per request
        toggles = [  # each asks for other endpoints than the last: each gets a response
            DiscoveryRequest(type_url=EDS, resource_names=["shop.critical", *padding]),
            DiscoveryRequest(type_url=EDS, resource_names=["shop.normal", *padding]),
        ]
        written = 0

        async def flood() -> None:
            nonlocal written
            for i in range(100_000):
                await call.write(toggles[i % 2])
                written += 1

        task = asyncio.create_task(flood())
        seen = [-1]

        def stalled() -> bool:  # no write went through in the last half second
            before, seen[0] = seen[0], written
            return written == before

        await eventually(stalled, 50, "the writes stall", interval=0.5)
        stalled_at, sends = written, ballast.ads.sends
        await asyncio.sleep(1.0)
        assert written == stalled_at and ballast.ads.sends == sends  # stays stalled
        assert written < 2_000, written  # a few MB of flow-control windows, not more
        assert not task.done()
        task.cancel()
        # meanwhile a well-behaved node is served at once
        other = local_channel(f"127.0.0.1:{ballast.port}")
        client = await XdsClient(other, make_node("polite", "ewr")).start()
        await client.subscribe(CDS)
        await client.wait_for(lambda c: len(c.names(CDS)) == CLUSTERS, timeout=2)
        await client.close()
        await other.close()
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        assert grown_mb < 50, grown_mb
    finally:
        call.cancel()
        await channel.close()


def _snapshot() -> Any:
    from control_plane.translate import translate_pop

    served = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    return translate_pop(served, "ewr", Capabilities())


def test_a_delta_client_that_never_answers_holds_few_responses() -> None:
    snapshot = _snapshot()
    stream = DeltaStream(SMALL)
    sent = 0
    for i in range(500):  # each request asks for other endpoints: a response each, never ACKed
        new, old = ("shop.critical", "shop.normal")[:: 1 if i % 2 else -1]
        step = stream.on_request(
            DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=[new],
                                  resource_names_unsubscribe=[old]),
            snapshot,
        )
        sent += len(step.responses)
    assert sent > 2 * delta.MAX_UNANSWERED
    assert len(stream._pending) == delta.MAX_UNANSWERED
