"""One gRPC process, three targets: grpcio keeps one xDS client (one ADS stream) per channel
target, each with the process's one node. Ballast keeps both streams (a newer stream replaces
an older one of the same node only when it names the same target), so neither is cut and the
streams do not take turns replacing each other (measured before the fix: every second, for as
long as the process ran). A target with its port (`shop-api:<port>`) is a target of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from control_plane.translate.grpc_bootstrap import grpc_bootstrap
from harness.eventually import eventually
from harness.grpc_client import GrpcClientProcess
from harness.grpc_fleet import grpc_fleet

OTHER = """  other-api:
    port: {port}
    origins:
      only: {{address: 127.0.0.1}}
"""


async def test_three_targets_in_one_process_keep_three_streams(tmp_path: Path) -> None:
    def with_other(text: str) -> str:
        port = text.split("port: ", 2)[2].split("}", 1)[0]  # the secondary's port
        return text.replace("rollout:", OTHER.format(port=port) + "rollout:")

    async with grpc_fleet(tmp_path, rate=0, pops=(), probes=False, edit=with_other) as fleet:
        server = fleet.service.server
        bootstrap = grpc_bootstrap(node_id="ewr-two", pop="ewr",
                                   servers=[("127.0.0.1", server.port)])
        with_port = f"xds:///shop-api:{fleet.origins['primary'].port}"
        client = await asyncio.to_thread(
            GrpcClientProcess, bootstrap, "xds:///shop-api", "ewr", tmp_path,
            also=("xds:///other-api", with_port))
        try:
            shop = await asyncio.to_thread(client.ask, "calls 20")
            other = await asyncio.to_thread(client.ask, "calls 5 xds:///other-api")
            named = await asyncio.to_thread(client.ask, f"calls 5 {with_port}")
            assert not shop["errors"] and sum(shop["by_origin"].values()) == 20, shop
            assert other == {"by_origin": {"secondary": 5}, "errors": {}}, other
            assert not named["errors"], named  # the target with its port: its own listener

            def synced() -> list[str]:
                return [s.status for s in server.nodes.by_node("ewr-two")]

            await eventually(lambda: synced() == ["SYNCED"] * 3, 10, "three streams synced")
            await asyncio.sleep(3)  # the old loop replaced a stream every second
            streams = server.nodes.by_node("ewr-two")
            assert len(streams) == 3 and all(s.status == "SYNCED" for s in streams), streams
            assert not fleet.records("node_superseded"), fleet.records("node_superseded")
            assert all(s.types[0].type == "LDS" for s in streams), streams
        finally:
            await asyncio.to_thread(client.stop)
