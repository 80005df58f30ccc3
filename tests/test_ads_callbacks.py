"""`ads/` tells its embedder what happens on a stream through `Callbacks`, and a callback that
raises never breaks the stream (real gRPC on loopback, the simulated client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from control_plane.ads.callbacks import Callbacks
from control_plane.ads.fanout import PushHub
from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Ack, DeltaResponse, Nack, SotwResponse
from control_plane.ads.server import AdsServicer
from control_plane.ads.snapshots import SnapshotCache
from control_plane.translate import translate_pop
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.translate.resources import LISTENER_TYPE as LDS
from harness.ads_desired import desired
from harness.eventually import eventually
from harness.xds_client import XdsClient, local_channel, make_node


class Recorder(Callbacks):
    """Every call, in order; raises from each callback when `explode` is set."""

    def __init__(self, *, explode: bool = False) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.explode = explode

    def _note(self, *call: str) -> None:
        self.calls.append(call)
        if self.explode:
            raise RuntimeError(f"callback {call[0]} broke")

    def on_stream_open(self, node: NodeEntry) -> None:
        self._note("open", node.node_id, node.pop, node.mode)

    def on_stream_closed(self, node: NodeEntry, status: str, details: str) -> None:
        self._note("closed", node.node_id, status)

    def on_request(self, node: NodeEntry, request: object) -> None:
        self._note("request", node.node_id)

    def on_response(
        self, node: NodeEntry, response: SotwResponse | DeltaResponse, size: int
    ) -> None:
        assert size > 0
        self._note("response", response.type_url, response.nonce)

    def on_ack(self, node: NodeEntry, ack: Ack) -> None:
        self._note("ack", ack.type_url, ack.nonce)

    def on_nack(self, node: NodeEntry, nack: Nack) -> None:
        self._note("nack", nack.type_url, nack.nonce, nack.message)


@pytest.fixture(params=[False, True], ids=["quiet", "raising"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder(explode=request.param)
    served = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    cache = SnapshotCache(
        lambda the_desired, pop, caps, _: translate_pop(the_desired, pop, caps),
        lambda the_desired: the_desired.pop_names,
        served,
    )
    servicer = AdsServicer(cache, PushHub(quiet=0.0), NodeRegistry(), callbacks=recorder)
    server = grpc.aio.server()
    servicer.add_to(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", recorder
    finally:
        servicer.close_streams()
        await server.stop(0.5)


async def test_a_stream_tells_open_request_response_ack_nack_and_close(
    served: tuple[str, Recorder],
) -> None:
    target, recorder = served
    channel = local_channel(target)
    client = await XdsClient(
        channel,
        make_node("n1", "ewr"),
        reject=lambda type_url, _: "no" if type_url == CDS else None,
    ).start()
    await client.subscribe(CDS)
    await client.wait_for(lambda c: bool(c.responses(CDS)))
    await client.subscribe(LDS)  # after a NACK the stream still answers
    await client.wait_for(lambda c: LDS in c.state.acked)
    rejected, accepted = client.responses(CDS)[0], client.responses(LDS)[0]
    await eventually(lambda: ("ack", LDS, accepted.nonce) in recorder.calls, 2, "the LDS ACK",
                     interval=0.01)
    await client.close()
    await channel.close()
    await eventually(lambda: recorder.calls and recorder.calls[-1][0] == "closed", 2,
                     "the stream's close", interval=0.01)
    kinds = [call[0] for call in recorder.calls]
    assert kinds[:3] == ["open", "request", "response"]
    assert recorder.calls[0] == ("open", "n1", "ewr", "sotw")
    assert recorder.calls[2] == ("response", CDS, rejected.nonce)
    assert ("nack", CDS, rejected.nonce, "no") in recorder.calls
    assert ("response", LDS, accepted.nonce) in recorder.calls
    assert ("ack", LDS, accepted.nonce) in recorder.calls
    assert kinds[-1] == "closed"
    assert recorder.calls[-1][:2] == ("closed", "n1")
