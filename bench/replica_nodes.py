"""Simulated nodes of the replicas benchmark (`bench/replicas.py`), in a process of their own.

`python -m bench.replica_nodes FIRST COUNT POPS PER_CONNECTION PORT[,PORT...]`: nodes FIRST ..
FIRST+COUNT-1 (`harness/lean_node.py`), node i in PoP i mod POPS, PER_CONNECTION of them on a
TCP connection; connection c goes to replica c mod N (PORT is each replica's xDS port), as an
L4 balancer spreading connections round-robin would. A node whose stream ends reconnects, after
a jittered back-off of up to `RETRY_S` (Envoy's xDS retry starts at 500 ms, jittered), to the
next replica in turn: a dead replica refuses the connection and the node tries the one after.
Prints `{"port": 0}`, then answers one JSON command per stdin line (`bench/command_pipe.py`;
times are `time.monotonic()`):

- `storm {"concurrency": C, "timeout": S}`: every node does its start-up exchange, C at a time
  (Envoys reconnecting with jittered back-off); when the last one was synced, the errors;
- `watch {"versions": {pop: EDS version}, "timeout": S}`: until every node of those PoPs
  holds that version; when the last ACK of it was written;
- `config`: per PoP, the distinct configs its nodes hold (per type: version and digest);
- `resync {"dead": R, "since": T, "timeout": S}`: until every node that was on replica R (it
  died at T) is synced on another; how many were on it, how many others moved meanwhile, when
  the last was synced.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from typing import Any

import grpc

from bench.command_pipe import commands, reply
from control_plane.translate.resources import ENDPOINT_TYPE
from harness.eventually import eventually
from harness.lean_node import STARTUP, STREAM_ERRORS, Bodies, LeanNode
from harness.xds_client import local_channel

RETRY_S = 1.0
WATCH_POLL_S = 0.02


class Fleet:
    def __init__(self, first: int, count: int, pops: int, per_connection: int,
                 ports: list[int]) -> None:
        self.indices = range(first, first + count)
        self.pops = pops
        self.per_connection = per_connection
        self.ports = ports
        self.bodies = Bodies()
        self.nodes: dict[int, LeanNode] = {i: self._node(i) for i in self.indices}
        self.replica = {i: (i // per_connection) % len(ports) for i in self.indices}
        self.channels: dict[tuple[int, int], grpc.aio.Channel] = {}
        self.moved: list[tuple[float, int, int]] = []  # (when its stream ended, node, replica)
        self.keepers: list[asyncio.Task[None]] = []
        self.errors: list[str] = []

    def _node(self, index: int) -> LeanNode:
        return LeanNode(f"node-{index}", f"p{index % self.pops:03d}", self.bodies)

    def _channel(self, index: int) -> grpc.aio.Channel:
        key = (index // self.per_connection, self.replica[index])
        channel = self.channels.get(key)
        if channel is None:
            channel = self.channels[key] = local_channel(f"127.0.0.1:{self.ports[key[1]]}")
        return channel

    async def storm(self, concurrency: int, timeout: float) -> dict[str, Any]:
        gate = asyncio.Semaphore(concurrency)

        async def connect(index: int) -> None:
            async with gate:
                try:
                    await self.nodes[index].start(self._channel(index), timeout)
                except STREAM_ERRORS as err:
                    self.errors.append(f"node-{index}: {type(err).__name__}: {err}")

        await asyncio.gather(*(connect(i) for i in self.indices))
        self.keepers = [asyncio.create_task(self._keep(i)) for i in self.indices]
        return {"synced_at": max(node.synced_at for node in self.nodes.values()),
                "synced": sum(node.synced() for node in self.nodes.values()),
                "errors": self.errors[:5], "error_count": len(self.errors)}

    async def _keep(self, index: int) -> None:
        """Reconnect a node whose stream ended, to the next replica in turn."""
        while True:
            await self.nodes[index].ended()
            self.moved.append((time.monotonic(), index, self.replica[index]))
            await asyncio.sleep(random.uniform(0, RETRY_S))
            self.replica[index] = (self.replica[index] + 1) % len(self.ports)
            node = self.nodes[index] = self._node(index)
            with contextlib.suppress(*STREAM_ERRORS):
                await node.start(self._channel(index), 30)

    async def watch(self, versions: dict[str, str], timeout: float) -> dict[str, Any]:
        watched = [i for i in self.indices if self.nodes[i].pop in versions]

        def lagging() -> list[int]:
            return [i for i in watched if (held := self.nodes[i].held.get(ENDPOINT_TYPE)) is None
                    or held.version != versions[self.nodes[i].pop]]

        with contextlib.suppress(AssertionError):  # the answer counts those still behind
            await eventually(lambda: not lagging(), timeout, "every watched node on its version",
                             interval=WATCH_POLL_S)
        behind = lagging()
        ok = [self.nodes[i].held[ENDPOINT_TYPE].acked_at for i in watched if i not in behind]
        return {"nodes": len(watched), "behind": len(behind), "last_ack": max(ok, default=0.0)}

    def config(self) -> dict[str, list[list[list[str]]]]:
        configs: dict[str, set[tuple[tuple[str, str, str], ...]]] = {}
        for node in self.nodes.values():
            held = tuple((t, node.held[t].version, node.held[t].body.digest)
                         for t in STARTUP if t in node.held)
            configs.setdefault(node.pop, set()).add(held)
        return {pop: [list(map(list, config)) for config in sorted(held)]
                for pop, held in sorted(configs.items())}

    async def resync(self, dead: int, since: float, timeout: float) -> dict[str, Any]:
        """Until every node that was on replica `dead` (it died at `since`) is synced on
        another; the others must not have moved."""
        affected = {i for i in self.indices if self.replica[i] == dead} | {
            i for at, i, replica in self.moved if at >= since and replica == dead}
        with contextlib.suppress(AssertionError):  # the answer says how many resynced
            await eventually(lambda: all(self.replica[i] != dead and self.nodes[i].synced()
                                         for i in affected), timeout,
                             "the dead replica's nodes synced on another", interval=WATCH_POLL_S)
        return {"affected": len(affected),
                "others_moved": len({i for at, i, _ in self.moved if at >= since} - affected),
                "synced": sum(node.synced() for node in self.nodes.values()),
                "resynced_at": max((self.nodes[i].synced_at for i in affected), default=0.0)}

    async def close(self) -> None:
        for keeper in self.keepers:
            keeper.cancel()
        await asyncio.gather(*self.keepers, return_exceptions=True)
        for node in self.nodes.values():
            await node.close()
        for channel in self.channels.values():
            await channel.close()


async def main(first: int, count: int, pops: int, per_connection: int, ports: list[int]
               ) -> None:
    fleet = Fleet(first, count, pops, per_connection, ports)
    try:
        async for command in commands(0):
            name = command["cmd"]
            if name == "storm":
                cpu = time.process_time()
                result = await fleet.storm(command["concurrency"], command["timeout"])
                reply({**result, "cpu": time.process_time() - cpu})
            elif name == "watch":
                reply(await fleet.watch(command["versions"], command["timeout"]))
            elif name == "config":
                reply(fleet.config())
            elif name == "resync":
                reply(await fleet.resync(command["dead"], command["since"], command["timeout"]))
    finally:
        await fleet.close()


if __name__ == "__main__":
    first, count, pops, per_connection = (int(arg) for arg in sys.argv[1:5])
    asyncio.run(main(first, count, pops, per_connection,
                     [int(port) for port in sys.argv[5].split(",")]))
