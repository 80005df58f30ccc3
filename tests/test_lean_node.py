"""The benchmarks' lean simulated node (`harness/lean_node.py`) answers a real Ballast as the
reference client (`harness/xds_client.py`) does: the same start-up exchange, the same resources
and versions ACKed, a push followed; its digests tell equal configs from different ones."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from control_plane.translate.resources import ENDPOINT_TYPE
from control_plane.xds_port.server import BallastServer
from harness.eventually import eventually
from harness.intent_changes import set_weights
from harness.lean_node import STARTUP, Bodies, LeanNode
from harness.models import fleet_desired
from harness.xds_client import XdsClient, connect, local_channel, make_node


@pytest.fixture
async def server() -> AsyncIterator[BallastServer]:
    ballast = BallastServer(fleet_desired(pops=2, groups=3), xds_address="127.0.0.1:0",
                            debounce=0.0)
    await ballast.start()
    try:
        yield ballast
    finally:
        await ballast.stop(0.5)


async def test_a_lean_node_holds_and_acks_what_the_reference_client_does(
        server: BallastServer) -> None:
    channel = local_channel(f"127.0.0.1:{server.port}")
    bodies = Bodies()
    lean = LeanNode("lean-1", "p000", bodies)
    other = LeanNode("lean-2", "p000", bodies)
    elsewhere = LeanNode("lean-3", "p001", bodies)
    reference = XdsClient(channel, make_node("ref-1", "p000"))
    try:
        for node in (lean, other, elsewhere):
            await node.start(channel, 10)
        await connect(reference, 10)
        for type_url in STARTUP:
            held = lean.held[type_url]
            assert set(held.body.names) == reference.names(type_url), type_url
            assert held.version == reference.state.acked[type_url]
            assert held.body.digest == other.held[type_url].body.digest
        assert lean.held[ENDPOINT_TYPE].body.digest != elsewhere.held[ENDPOINT_TYPE].body.digest
        await eventually(lambda: all(n.status == "SYNCED" for n in server.nodes.statuses()),
                         5, "every node SYNCED in the server's registry")
        before = lean.held[ENDPOINT_TYPE]
        await set_weights(server.intent, "p000", "g000", {"o0": 30, "o1": 70})
        await eventually(lambda: lean.held[ENDPOINT_TYPE].version != before.version
                         and reference.state.acked.get(ENDPOINT_TYPE)
                         == lean.held[ENDPOINT_TYPE].version, 5, "the push ACKed by both")
        assert lean.held[ENDPOINT_TYPE].body.digest != before.body.digest
        await eventually(lambda: all(n.status == "SYNCED" for n in server.nodes.statuses()),
                         5, "the push ACKed in the server's registry")
    finally:
        for node in (lean, other, elsewhere):
            await node.close()
        await reference.close()
        await channel.close()


async def test_a_stream_that_ends_ends_the_node_with_its_error(server: BallastServer) -> None:
    channel = local_channel(f"127.0.0.1:{server.port}")
    node = LeanNode("lean-gone", "nowhere", Bodies())  # a PoP the desired state lacks
    try:
        with pytest.raises(ConnectionError, match="INVALID_ARGUMENT"):
            await node.start(channel, 10)
        await node.ended()
        assert node.error is not None and not node.synced()
    finally:
        await node.close()
        await channel.close()
