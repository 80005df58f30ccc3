"""Reconnect storms: at most `initial_syncs` streams do their initial exchange at once, and a
push to a node that is already synced never waits behind the ones still starting.

Real `BallastServer`, real gRPC, simulated SotW nodes. Two "stuck" nodes ask for clusters and
never for the rest, so they keep both start-up slots (for `initial_sync_s`, 30 s here).
"""

from __future__ import annotations

import grpc

from control_plane.ads.limits import AdsLimits
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.translate.resources import ENDPOINT_TYPE as EDS
from control_plane.translate.resources import Capabilities
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.eventually import eventually
from harness.intent_changes import set_weights
from harness.xds_client import XdsClient, connect, local_channel, make_node


async def test_start_ups_wait_for_a_slot_while_synced_nodes_get_their_pushes() -> None:
    ballast = BallastServer(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082),
        xds_address="127.0.0.1:0", debounce=0.0, max_delay=0.0,
        limits=AdsLimits(initial_syncs=2, initial_sync_s=30),
    )
    await ballast.start()
    channels: list[grpc.aio.Channel] = []
    clients: list[XdsClient] = []

    def client(name: str) -> XdsClient:
        channels.append(local_channel(f"127.0.0.1:{ballast.port}"))
        clients.append(XdsClient(channels[-1], make_node(name, "ewr")))
        return clients[-1]

    try:
        synced = client("synced")
        await connect(synced, 10)  # all four types: its slot is free again
        await eventually(lambda: ballast.ads.syncing == 0, 10, "no stream syncing", interval=0.01)
        stuck = [client("stuck-1"), client("stuck-2")]
        for node in stuck:
            await node.start()
            await node.subscribe(CDS)
            await node.wait_for(lambda c: bool(c.names(CDS)))
        assert ballast.ads.syncing == 2
        waiting = client("waiting")
        await waiting.start()
        await waiting.subscribe(CDS)
        # connected, but no slot: not answered
        await eventually(lambda: ballast.ads.ledger.streams == 4, 10, "4 streams connected",
                         interval=0.01)
        assert ballast.ads.syncing == 2
        # listed once admitted, not while it waits (145 listings of one id waited before)
        assert len(ballast.nodes) == 3 and not ballast.nodes.by_node("waiting")

        await set_weights(ballast.intent, "ewr", "shop", {"primary": 60, "secondary": 40})
        want = ballast.cache.resources("ewr", Capabilities()).of_type(EDS)["shop.critical"].payload
        await synced.wait_for(lambda c: c.state.resources[EDS]["shop.critical"][1] == want)
        assert not waiting.responses(), "a start-up got a slot it should not have"

        await stuck[0].close()  # a slot frees: the waiting node starts
        await waiting.wait_for(lambda c: bool(c.names(CDS)))
        assert len(ballast.nodes.by_node("waiting")) == 1
    finally:
        for each in clients:
            await each.close()
        for channel in channels:
            await channel.close()
        await ballast.stop(0)
