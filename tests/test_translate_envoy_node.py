"""The stored node of a real Envoy 1.40 (tests/fixtures/envoy-1.40-node.json) is what it sends.

The fixture is the `node` of Envoy 1.40's first ADS DiscoveryRequest (protobuf JSON); the
capability tests translate against it. This test records a fresh first request from the real
binary and checks the stored extension list still matches it. To re-record after an Envoy
upgrade: `.venv/bin/python -c "import tests.test_translate_envoy_node as t; t.record_fixture()"`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest
from google.protobuf.json_format import MessageToDict, ParseDict

from control_plane.cli.envoy_validate import find_envoy
from control_plane.translate import capabilities_from_node
from control_plane.translate.bootstrap import ads_bootstrap
from harness.envoy_process import EnvoyProcess, free_port

FIXTURE = Path(__file__).parent / "fixtures" / "envoy-1.40-node.json"

pytestmark = pytest.mark.envoy


class FirstRequestRecorder(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """An ADS endpoint that keeps the first request of the first stream and answers nothing."""

    def __init__(self) -> None:
        self.first: asyncio.Future[DiscoveryRequest] = asyncio.get_running_loop().create_future()

    async def StreamAggregatedResources(self, request_iterator, context):
        async for request in request_iterator:
            if not self.first.done():
                self.first.set_result(request)
        return
        yield


async def record_first_node() -> Node:
    server = grpc.aio.server()
    recorder = FirstRequestRecorder()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    admin_port = free_port()
    envoy = EnvoyProcess(
        ads_bootstrap(node_id="recorder", pop="ewr", xds_port=port, admin_port=admin_port),
        admin_port,
    ).start()
    try:
        request = await asyncio.wait_for(recorder.first, timeout=15)
    finally:
        envoy.stop()
        await server.stop(grace=None)
    return request.node


def load_fixture_node() -> Node:
    return ParseDict(json.loads(FIXTURE.read_text()), Node(), ignore_unknown_fields=True)


async def test_fixture_matches_real_envoy_first_request() -> None:
    find_envoy()
    live = await record_first_node()
    stored = load_fixture_node()
    assert {e.name for e in live.extensions} == {e.name for e in stored.extensions}
    assert live.user_agent_build_version.version.major_number == 1
    assert live.user_agent_build_version.version.minor_number == 40


def test_fixture_is_envoy_1_40_without_adaptive_lifo() -> None:
    node = load_fixture_node()
    names = {e.name for e in node.extensions}
    assert len(names) > 400
    assert "envoy.queue_policy.fifo" in names
    assert "envoy.queue_policy.adaptive_lifo" not in names
    assert capabilities_from_node(node).adaptive_lifo is False


def test_node_advertising_adaptive_lifo_has_the_capability() -> None:
    node = load_fixture_node()
    node.extensions.add(name="envoy.queue_policy.adaptive_lifo", category="envoy.queue_policy")
    assert capabilities_from_node(node).adaptive_lifo is True


def record_fixture() -> None:
    """Rewrite the fixture from the local Envoy (run by hand when the pinned Envoy changes)."""
    node = asyncio.run(record_first_node())
    FIXTURE.write_text(
        json.dumps(MessageToDict(node, preserving_proto_field_name=True), indent=1) + "\n"
    )
