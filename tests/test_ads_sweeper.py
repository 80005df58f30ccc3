"""The xDS port's connections from the kernel (`ads/socket_table.py`) and the sweeper that acts
on them (`ads/sweeper.py`), against real grpc.aio servers on loopback: listed, shut down one by
one, blocked before gRPC accepts them, and closed when no valid stream uses them — whatever
other streams they open. (The per-address rules exempt loopback: `test_hostile_connections.py`
runs them between network namespaces.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import Locality, Node
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from envoy.service.load_stats.v3.lrs_pb2 import LoadStatsRequest

from control_plane.ads.connections import MAX_BLOCKED
from control_plane.ads.limits import DEFAULT_LIMITS, DESCRIPTOR_RESERVE, AdsLimits, connection_cap
from control_plane.ads.server import server_options
from control_plane.ads.socket_table import SocketTable, block_program, endpoint_of
from control_plane.gen.ballast.v1 import metrics_service_pb2 as ms
from control_plane.observe.lrs_service import SERVICE as LRS_SERVICE
from control_plane.observe.sink import OTLP_METHOD
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.envoy_process import free_port
from harness.eventually import eventually
from harness.xds_client import XdsClient, connect, local_channel, make_node
from tests.support.example_service import example_service
from tests.support.zero_window import ZeroWindowConnection

LRS_METHOD = f"/{LRS_SERVICE}/StreamLoadStats"

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux only")


@pytest.mark.parametrize(("peer", "endpoint"), [
    ("ipv4:10.0.0.7:5000", ("10.0.0.7", 5000)),
    ("ipv6:[2001:db8::7]:5000", ("2001:db8::7", 5000)),
    ("ipv6:[2001:0db8:0::0007]:1", ("2001:db8::7", 1)),
    ("ipv6:[::ffff:10.0.0.7]:5000", ("10.0.0.7", 5000)),  # v4-mapped: as the kernel lists it
    ("unix:/tmp/x.sock", None),
    ("ipv4:not-an-address:1", None),
])
def test_peer_strings_name_the_endpoints_the_kernel_lists(peer: str,
                                                          endpoint: tuple[str, int] | None
                                                          ) -> None:
    assert endpoint_of(peer) == endpoint


def test_the_block_filter_fits_bpf_with_the_most_addresses() -> None:
    v6 = [f"2001:db8::{i:x}" for i in range(MAX_BLOCKED)]
    assert len(block_program(v6)) <= 4096
    assert len(block_program([f"10.0.{i // 256}.{i % 256}" for i in range(MAX_BLOCKED)])) <= 4096


def test_the_connection_cap_is_the_descriptor_limit_less_the_reserve() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(DEFAULT_LIMITS) == max(64, soft - DESCRIPTOR_RESERVE)
    assert connection_cap(AdsLimits(connections_total=77)) == 77
    assert ("grpc.max_allowed_incoming_connections", 77) in server_options(
        AdsLimits(connections_total=77))


@contextlib.asynccontextmanager
async def grpc_server(host: str = "127.0.0.1", **options: int
                      ) -> AsyncIterator[tuple[grpc.aio.Server, int]]:
    limits = dataclasses.replace(DEFAULT_LIMITS, **options)
    server = grpc.aio.server(options=server_options(limits))
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    try:
        yield server, port
    finally:
        await server.stop(0)


async def connection(port: int, source: str = "127.0.0.1", host: str = "127.0.0.1",
                     timeout: float = 5) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=(source, 0)), timeout)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        while await asyncio.wait_for(reader.read(65536), 5):
            pass
    except (ConnectionError, TimeoutError):
        return isinstance(reader.exception(), ConnectionError) or reader.at_eof()
    return True


async def test_the_table_lists_the_ports_connections_and_shuts_down_only_those_chosen() -> None:
    async with grpc_server(connections_total=100) as (_, port):
        table = SocketTable(port)
        kept = [await connection(port) for _ in range(2)]
        doomed = [await connection(port, source="127.0.0.2") for _ in range(3)]
        ends = {w.get_extra_info("sockname") for _, w in kept + doomed}

        def listed() -> dict[tuple[str, int], int]:
            return dict(table.connections())

        found = await eventually(lambda: len(listed()) == 5 and listed(), 5, "5 connections")
        assert set(found) == {(host, port) for host, port in ends}
        inodes = [inode for (host, _), inode in found.items() if host == "127.0.0.2"]
        assert table.close(inodes) == 3
        assert table.close([1, 2, 3]) == 0  # no socket of this process: left alone
        for reader, _ in doomed:
            assert await closed_by_server(reader)
        await eventually(lambda: len(listed()) == 2, 5, "the 3 gone")
        for reader, writer in kept:
            assert not reader.at_eof()
            writer.close()
        for _, writer in doomed:
            writer.close()


@pytest.mark.parametrize(("host", "blocked", "other"), [
    ("127.0.0.1", "127.0.0.2", "127.0.0.1"),
    ("::1", "::1", None),
])
async def test_a_blocked_address_cannot_connect_until_unblocked(host: str, blocked: str,
                                                                other: str | None) -> None:
    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6")
    async with grpc_server(f"[{host}]" if ":" in host else host) as (_, port):
        table = SocketTable(port)
        table.block([blocked])
        with pytest.raises(TimeoutError):  # its SYN is dropped: no answer at all
            await connection(port, source=blocked, host=host, timeout=1)
        if other is not None:
            _, writer = await connection(port, source=other, host=host)
            writer.close()
        table.block([])
        _, writer = await connection(port, source=blocked, host=host)
        writer.close()


async def test_gRPC_closes_connections_over_the_cap_as_it_accepts_them() -> None:
    async with grpc_server(connections_total=10) as (_, port):
        held = [await connection(port) for _ in range(15)]
        closed = await asyncio.gather(*(closed_by_server(r) for r, _ in held[10:]))
        assert all(closed)
        table = SocketTable(port)
        await eventually(lambda: len(table.connections()) == 10, 5, "10 held")
        for _, writer in held:
            writer.close()


async def test_a_connection_without_a_valid_stream_is_closed_whatever_streams_it_opens(
) -> None:
    """Idle 1.5 s: a raw HTTP/2 connection opening a stream every 0.3 s (headers only, so
    gRPC's own idle timeout never fires) is closed; a node's connection carrying its ADS
    stream is not; once the node's stream ends, its connection is closed in turn."""
    limits = AdsLimits(connection_idle_ms=1500, first_request_s=30)
    ballast = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0", limits=limits)
    await ballast.start()
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    node = XdsClient(channel, make_node("steady", "ewr"))
    bogus = await ZeroWindowConnection.open("127.0.0.1", ballast.port, None)
    try:
        await connect(node, 10)
        started = time.monotonic()

        async def closed_while_opening_streams() -> bool:
            if not bogus.closed:
                await bogus.stream(None)
            return bogus.closed

        await eventually(closed_while_opening_streams, 6,
                         "the bogus-stream connection closed at the idle timeout", interval=0.3)
        assert time.monotonic() - started < 1.5 + 2.5  # idle + a sweep or two
        assert len(bogus.streams) >= 4
        assert not node.done.is_set()  # the node's stream (and connection) stays
        assert ballast.connections.acted["closed: no valid stream for 1.5 s"] == 1
        # its stream ends; its connection (the channel's) is closed once idle: by gRPC's own
        # idle timeout (no stream at all) or by the sweeper, whichever comes first
        (endpoint,) = ballast.connections._proven
        await node.close()
        table = SocketTable(ballast.port)
        await eventually(lambda: endpoint not in dict(table.connections()), 6,
                         "the node's connection closed once idle")
    finally:
        await node.close()
        await bogus.close()
        await channel.close()
        await ballast.stop(0)


async def test_a_metrics_stream_is_a_valid_stream_of_its_connection(tmp_path: Path) -> None:
    """A connection carrying only the node's metrics_service stream stays; one whose metrics
    stream never names its node is closed."""
    limits = AdsLimits(connection_idle_ms=1500)
    async with example_service(tmp_path, ads_limits=limits) as (service, _):
        port = service.server.port
        method = "/envoy.service.metrics.v3.MetricsService/StreamMetrics"
        named = ms.StreamMetricsMessage()
        named.identifier.node.id = "ewr-1"
        named.identifier.node.locality.zone = "ewr"
        stop = asyncio.Event()

        async def messages(first: ms.StreamMetricsMessage) -> AsyncIterator[bytes]:
            yield first.SerializeToString()
            await stop.wait()

        calls = []
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                              options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(2)]
        for channel, first in zip(channels, (named, ms.StreamMetricsMessage()), strict=True):
            call = channel.stream_unary(method, request_serializer=None,
                                        response_deserializer=None)
            calls.append(asyncio.ensure_future(call(messages(first))))
        try:
            await eventually(lambda: service.server.connections.acted, 8,
                             "a connection closed")
            assert service.server.connections.acted == {"closed: no valid stream for 1.5 s": 1}
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(calls[1], 5)  # the unnamed stream's connection
            assert not calls[0].done()
        finally:
            stop.set()
            await asyncio.gather(*calls, return_exceptions=True)
            for channel in channels:
                await channel.close()


async def test_a_load_report_stream_and_otlp_exports_are_valid_uses_of_their_connections(
    tmp_path: Path,
) -> None:
    """A connection carrying only a node's load-report stream stays, and so does one carrying
    only OTLP exports (one every 0.3 s, for twice the idle timeout); one whose load-report
    stream never sends its first report is closed."""
    limits = AdsLimits(connection_idle_ms=1500)
    async with example_service(tmp_path, ads_limits=limits) as (service, _):
        port = service.server.port
        stop = asyncio.Event()

        async def reports(first: LoadStatsRequest | None) -> AsyncIterator[bytes]:
            if first is not None:
                yield first.SerializeToString()
            await stop.wait()

        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                              options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(3)]
        named = LoadStatsRequest(node=Node(id="ewr-1", locality=Locality(zone="ewr")))
        calls = [channel.stream_stream(LRS_METHOD, request_serializer=None,
                                       response_deserializer=None)(reports(first))
                 for channel, first in zip(channels[:2], (named, None), strict=True)]
        export = channels[2].unary_unary(OTLP_METHOD, request_serializer=None,
                                         response_deserializer=None)
        try:
            await asyncio.wait_for(calls[0].read(), 5)  # the named stream's first answer
            started = time.monotonic()
            while time.monotonic() - started < 2 * 1.5:
                await export(b"", timeout=5)  # an empty ExportMetricsServiceRequest
                await asyncio.sleep(0.3)
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(calls[1].read(), 5)  # the unnamed stream's connection
            assert service.server.connections.acted == {"closed: no valid stream for 1.5 s": 1}
            assert not calls[0].done()
        finally:
            stop.set()
            for call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()


async def test_a_node_connection_is_counted_in_use_until_its_stream_ends() -> None:
    ballast = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0")
    await ballast.start()
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    node = XdsClient(channel, make_node("n1", "ewr"))
    refused = XdsClient(channel, make_node("n2", "nowhere"))  # an unknown PoP: not valid
    try:
        await connect(node, 10)
        await refused.start()
        await refused.send_raw(DiscoveryRequest(node=make_node("n2", "nowhere")))
        await refused.done.wait()
        sweeper = ballast.connections
        assert list(sweeper._uses.values()) == [1]
        await node.close()
        await eventually(lambda: not sweeper._uses, 5, "released at the stream's end")
        assert list(sweeper._last_used) == list(sweeper._proven)
    finally:
        await node.close()
        await refused.close()
        await channel.close()
        await ballast.stop(0)


async def test_an_identitys_connections_with_valid_streams_are_budgeted() -> None:
    """Two connections of one identity carry valid streams; a valid stream on a third is
    refused with RESOURCE_EXHAUSTED, and the connection stays unproven; once one of the two is
    closed (idle 1.5 s after its stream ended) and a sweep no longer lists it, the identity
    may prove another. (On loopback the identity is None, exempt: the sweeper is told one
    identity for every peer here.)"""
    limits = AdsLimits(proven_per_identity=2, connection_idle_ms=1500)
    ballast = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0", limits=limits)
    ballast.connections._identify = lambda _: "spiffe://ballast/pop/ewr/node/one"
    await ballast.start()
    channels = [local_channel(f"127.0.0.1:{ballast.port}") for _ in range(4)]
    nodes = [XdsClient(channel, make_node(f"n{i}", "ewr")) for i, channel in enumerate(channels)]
    try:
        for node in nodes[:2]:
            await connect(node, 10)
        sweeper = ballast.connections
        assert sweeper.holding("spiffe://ballast/pop/ewr/node/one") == 2
        await nodes[2].start()
        await nodes[2].send_raw(DiscoveryRequest(node=make_node("n2", "ewr")))
        await asyncio.wait_for(nodes[2].done.wait(), 10)
        assert nodes[2].error is not None
        assert nodes[2].error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "the limit is 2" in (nodes[2].error.details() or "")
        assert sweeper.acted["refused streams of 'spiffe://ballast/pop/ewr/node/one': "
                             "more than 2 connections with valid streams"] == 1
        assert len(sweeper._proven) == 2  # the third connection is not proven
        # one of the two goes (its stream ends, the sweeper closes it once idle): a sweep
        # forgets it, and a fourth connection proves
        await nodes[0].close()
        await eventually(lambda: sweeper.holding("spiffe://ballast/pop/ewr/node/one") == 1, 8,
                         "the closed connection forgotten")
        await connect(nodes[3], 10)
        assert sweeper.holding("spiffe://ballast/pop/ewr/node/one") == 2
    finally:
        for node in nodes:
            await node.close()
        for channel in channels:
            await channel.close()
        await ballast.stop(0)
