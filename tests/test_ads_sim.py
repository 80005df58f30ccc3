"""Many simulated nodes (our own grpc.aio client) against a real Ballast ADS server on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

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
)
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.eventually import eventually
from harness.intent_changes import set_weights
from harness.xds_client import XdsClient, local_channel, make_node
from tests.support.forced_capabilities import force_capabilities

SHOP = ["shop.background", "shop.critical", "shop.normal"]
MEDIA = ["media.background", "media.critical", "media.normal"]
NODES_PER_POP = 25


@pytest.fixture
async def server() -> AsyncIterator[tuple[BallastServer, list[tuple[str, dict[str, Any]]]]]:
    records: list[tuple[str, dict[str, Any]]] = []
    the_desired = desired(
        listener_port=10000, primary_port=8081, secondary_port=8082, media_port=8083
    )
    ballast = BallastServer(
        the_desired,
        xds_address="127.0.0.1:0",
        record=lambda kind, fields: records.append((kind, fields)),
    )
    await ballast.start()
    try:
        yield ballast, records
    finally:
        await ballast.stop(0.5)


async def connect(
    ballast: BallastServer, node_id: str, pop: str | None, *, delta: bool, eds: list[str]
) -> tuple[XdsClient, grpc.aio.Channel]:
    """Envoy's start-up order: CDS, EDS (the clusters it wants), LDS, RDS."""
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    client = await XdsClient(channel, make_node(node_id, pop), delta=delta).start()
    await client.subscribe(CDS)
    await client.wait_for(lambda c: len(c.names(CDS)) == 7)  # 3 tiers each, shop's mirror
    await client.subscribe(EDS, eds)
    await client.subscribe(LDS)
    await client.wait_for(lambda c: c.names(LDS) == {"edge"})
    await client.subscribe(RDS, ["edge"])
    await client.wait_for(lambda c: c.names(RDS) == {"edge"} and c.names(EDS) == set(eds))
    return client, channel


async def fleet(ballast: BallastServer) -> list[tuple[str, XdsClient, grpc.aio.Channel, list[str]]]:
    """50 nodes, 25 per PoP, half SotW and half delta; odd nodes want only the shop EDS."""
    specs = []
    for pop in ("ewr", "sjc"):
        for i in range(NODES_PER_POP):
            specs.append((pop, f"{pop}-{i}", i % 2 == 0, SHOP if i % 2 else SHOP + MEDIA))
    connected = await asyncio.gather(
        *(connect(ballast, node_id, pop, delta=d, eds=eds) for pop, node_id, d, eds in specs)
    )
    return [
        (pop, client, channel, eds)
        for (pop, _, _, eds), (client, channel) in zip(specs, connected, strict=True)
    ]


async def close(nodes: list[tuple[str, XdsClient, grpc.aio.Channel, list[str]]]) -> None:
    for _, client, channel, _ in nodes:
        await client.close()
        await channel.close()


async def test_fifty_nodes_get_exactly_their_pops_resources(server: Any) -> None:
    ballast, records = server
    nodes = await fleet(ballast)
    try:
        for pop, client, _, eds in nodes:
            expected = ballast.cache.resources(pop, Capabilities())
            for type_url in (CDS, LDS, RDS):
                got = {n: payload for n, (_, payload) in client.state.resources[type_url].items()}
                assert got == {n: r.payload for n, r in expected.of_type(type_url).items()}
            assert client.names(EDS) == set(eds)  # only what it subscribed to
            eds_responses = client.responses(EDS)
            assert all(set(r.names) <= set(eds) for r in eds_responses)
            listener = Listener.FromString(client.state.resources[LDS]["edge"][1])
            assert listener.address.socket_address.port_value == (
                10000 if pop == "ewr" else 10001
            )
        # a client holds a response before the server has read its ACK: wait for those
        await eventually(lambda: {s.status for s in ballast.nodes.statuses()} == {"SYNCED"}, 10,
                         "every node's last responses ACKed", interval=0.01)
        statuses = ballast.nodes.statuses()
        assert len(statuses) == 2 * NODES_PER_POP
        assert {s.capability_key for s in statuses} == {"fifo"}
        connected = [f for kind, f in records if kind == "node_connected"]
        assert len(connected) == 2 * NODES_PER_POP
        fallbacks = [f for kind, f in records if kind == "capability_fallback"]
        assert len(fallbacks) == 2 * NODES_PER_POP  # once per node: its notes name each tier
        assert ballast.cache.translations == 2  # one translation per PoP, shared by 25 nodes
    finally:
        await close(nodes)


async def test_weight_burst_pushes_once_to_that_pop_only_changed_clusters(server: Any) -> None:
    ballast, _ = server
    nodes = await fleet(ballast)
    try:
        before = {id(c): len(c.state.log) for _, c, _, _ in nodes}
        started = time.monotonic()
        for primary in (90, 80, 70, 60, 50):  # a burst within the debounce window
            weights = {"primary": primary, "secondary": 100 - primary}
            await set_weights(ballast.intent, "ewr", "shop", weights)
        assert ballast.intent.weights("ewr", "shop") == {"primary": 50, "secondary": 50}
        ewr = [c for pop, c, _, _ in nodes if pop == "ewr"]
        wanted = ballast.cache.resources("ewr", Capabilities()).of_type(EDS)
        for client in ewr:
            await client.wait_for(
                lambda c: all(
                    c.state.resources[EDS][n][1] == wanted[n].payload for n in SHOP
                ),
                timeout=3,
            )
        pushed = time.monotonic() - started
        await asyncio.sleep(0.3)  # anything else would have arrived by now
        for pop, client, _, eds in nodes:
            new = client.state.log[before[id(client)] :]
            if pop == "sjc":
                assert new == []
                continue
            assert [r.type_url for r in new] == [EDS]  # one push, EDS only
            if client.delta:
                assert sorted(new[0].names) == SHOP  # only the changed CLAs
            else:
                assert sorted(new[0].names) == sorted(eds)  # SotW: all subscribed names
        assert ballast.hub.flushes == 1
        assert pushed < 1.0
    finally:
        await close(nodes)


@pytest.mark.parametrize(
    ("pop", "metadata_pop", "message"),
    [
        ("lax", None, "unknown PoP 'lax'; known: ewr, sjc"),
        (None, None, "names no PoP"),
        (None, "mars", "unknown PoP 'mars'"),
    ],
)
async def test_bad_pop_gets_invalid_argument(
    server: Any, pop: str | None, metadata_pop: str | None, message: str
) -> None:
    ballast, records = server
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        node = make_node("stray", pop, metadata_pop=metadata_pop)
        client = await XdsClient(channel, node).start()
        await client.subscribe(CDS)
        await asyncio.wait_for(client.done.wait(), 3)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (client.error.details() or "")
        assert client.state.log == []  # not even a half config
        assert len(ballast.nodes) == 0 and records == []
        await client.close()
    finally:
        await channel.close()


async def test_metadata_pop_and_malformed_request(server: Any) -> None:
    ballast, records = server
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        client = await XdsClient(channel, make_node("meta", metadata_pop="sjc")).start()
        await client.subscribe(LDS)
        await client.wait_for(lambda c: c.names(LDS) == {"edge"})
        assert ballast.nodes.statuses()[0].pop == "sjc"
        await client.send_raw(DiscoveryRequest(type_url="type.googleapis.com/nope.Secret"))
        await asyncio.wait_for(client.done.wait(), 3)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unsupported type_url 'type.googleapis.com/nope.Secret'" in (
            client.error.details() or ""
        )
        await client.close()
        assert [kind for kind, _ in records] == [
            "node_connected",
            "capability_fallback",
            "node_disconnected",
        ]
        assert records[-1][1]["status"] == "INVALID_ARGUMENT"
    finally:
        await channel.close()


async def test_nack_recorded_once_and_not_resent(server: Any) -> None:
    ballast, records = server
    channel = local_channel(f"127.0.0.1:{ballast.port}")

    def reject(type_url: str, names: list[str]) -> str | None:
        return "lifo? no thanks" if type_url == CDS and rejecting else None

    rejecting = False
    try:
        client = await XdsClient(channel, make_node("picky", "ewr"), reject=reject).start()
        await client.subscribe(CDS)
        await client.wait_for(lambda c: len(c.names(CDS)) == 7)  # 3 tiers each, shop's mirror
        rejecting = True
        force_capabilities(ballast.cache, "ewr", Capabilities(adaptive_lifo=True),
                           ballast.hub.changed)
        await client.wait_for(lambda c: len(c.responses(CDS)) == 2)
        await asyncio.sleep(0.5)
        assert len(client.responses(CDS)) == 2  # no resend loop
        nacks = [f for kind, f in records if kind == "nack"]
        assert len(nacks) == 1
        assert nacks[0]["message"] == "lifo? no thanks" and nacks[0]["type"] == "CDS"
        (status,) = ballast.nodes.statuses()
        assert status.status == "NACKED" and status.capability_key == "lifo"
        rejecting = False
        force_capabilities(ballast.cache, "ewr", None, ballast.hub.changed)
        await client.wait_for(lambda c: len(c.responses(CDS)) == 3)
        await eventually(lambda: ballast.nodes.statuses()[0].status == "SYNCED", 2,
                         "the server reads the ACK")
        await client.close()
    finally:
        await channel.close()


async def test_shutdown_ends_streams_with_unavailable() -> None:
    the_desired = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    ballast = BallastServer(the_desired, xds_address="127.0.0.1:0")
    await ballast.start()
    channel = local_channel(f"127.0.0.1:{ballast.port}")
    try:
        client = await XdsClient(channel, make_node("bye", "ewr"), delta=True).start()
        await client.subscribe(CDS)
        await client.wait_for(lambda c: len(c.names(CDS)) == 4)  # 3 tiers, 1 mirror cluster
        started = time.monotonic()
        await ballast.stop(2.0)
        assert time.monotonic() - started < 1.0  # streams end at once, not after the grace
        await asyncio.wait_for(client.done.wait(), 3)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.UNAVAILABLE
        assert client.error.details() == "ballast is shutting down"
        assert len(ballast.nodes) == 0
        await client.close()
    finally:
        await channel.close()
