"""Push fan-out: a real `BallastServer` (own process) and N simulated nodes (this process).

Per (mode, N): start a fresh server, connect N nodes split across the PoPs ewr and sjc (many
streams multiplexed over few TCP connections), time the initial sync, then change one PoP's
weights R times (through the change transaction) and time each push from the change to the last
ACK of that PoP's nodes (both timestamps taken in the server). Server CPU and RSS come from
/proc/<pid>.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench.command_pipe import ServerProcess
from bench.common import median, table
from control_plane.translate.resources import ENDPOINT_TYPE as EDS
from harness.eventually import eventually
from harness.xds_client import XdsClient, connect, local_channel, make_node

POPS = ("ewr", "sjc")
# The measured floor (docs/architecture.md, "gRPC and the fan-out floor"): 10,000 nodes, one
# connection each, response bytes built once per (PoP, version), last ACK at 4.8 s (7.4 s when
# building a message per stream), ~410 µs server CPU and ~41 KB RSS per node.
FLOOR_PUSH_US_PER_NODE = 4.8e6 / 10_000
FLOOR_MESSAGE_PER_STREAM_US_PER_NODE = 7.4e6 / 10_000
FLOOR_CPU_US_PER_NODE = 410.0
FLOOR_RSS_PER_NODE = 41_000
# nodes doing their start-up exchange at once (Envoys reconnect with jittered back-off); all
# 3,000 at once made some client streams end early (CANCELLED / "Failed execute_batch")
CONNECTING = 500


def server_process(desired: str, *, gc_freeze: bool = False, protocol: str = "current"
                   ) -> ServerProcess:
    """`python -m bench.fanout_server`, driven by JSON lines over stdin/stdout."""
    args = [sys.executable, "-m", "bench.fanout_server", desired]
    if gc_freeze:
        args.append("--gc-freeze")
    if protocol != "current":
        args += ["--protocol", protocol]
    return ServerProcess(args)


@dataclass
class FanoutResult:
    mode: str
    desired: str
    nodes: int
    connections: int
    protocol: str = "current"  # "baseline": harness/protocol_baseline.py; "message": old encoder
    sync_s: float = float("nan")
    sync_cpu_s: float = float("nan")
    rss_per_node: float = float("nan")
    push_nodes: int = 0
    push_s: list[float] = field(default_factory=list)  # update -> last ACK, per push
    first_ack_s: list[float] = field(default_factory=list)
    push_cpu_s: list[float] = field(default_factory=list)  # server process_time over the push
    push_proc_cpu_s: float = float("nan")  # /proc utime+stime over all pushes
    push_bytes: list[float] = field(default_factory=list)
    push_sends: list[int] = field(default_factory=list)
    client_cpu_s: float = float("nan")  # this process over the pushes
    errors: list[str] = field(default_factory=list)

    @property
    def push_us_per_node(self) -> float:
        return median(self.push_s) * 1e6 / self.push_nodes if self.push_nodes else float("nan")

    @property
    def push_cpu_us_per_node(self) -> float:
        if not self.push_nodes:
            return float("nan")
        return median(self.push_cpu_s) * 1e6 / self.push_nodes

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["push_us_per_node"] = self.push_us_per_node
        data["push_cpu_us_per_node"] = self.push_cpu_us_per_node
        data["vs_floor_push"] = self.push_us_per_node / FLOOR_PUSH_US_PER_NODE
        data["vs_floor_cpu"] = self.push_cpu_us_per_node / FLOOR_CPU_US_PER_NODE
        return data


async def all_synced(server: ServerProcess, nodes: int, timeout: float) -> dict[str, Any]:
    """The server's `synced` answer once all `nodes` have synced, or its last one after
    `timeout` s (the caller reports the nodes that did not)."""
    last: dict[str, Any] = {}

    async def every_node_synced() -> bool:
        last.update(await server.call(cmd="synced"))
        return int(last["synced"]) >= nodes

    with contextlib.suppress(AssertionError):
        await eventually(every_node_synced, timeout, f"{nodes} nodes synced")
    return last


class BenchClient(XdsClient):
    """`XdsClient` with its writes serialized: grpc.aio refuses a second write on a call
    while one is in flight (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the reader's ACK can
    race a `subscribe` of the start-up sequence. `XdsClient._send` now holds its own write
    lock; taking that (non-reentrant) lock here too deadlocked every stream on its first write,
    so this only adds a lock for a client that has none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self, "_write_lock", None), asyncio.Lock):
            self._bench_lock: asyncio.Lock | None = asyncio.Lock()
        else:
            self._bench_lock = None

    async def _send(self, request: Any) -> None:
        if self._bench_lock is None:
            await super()._send(request)
            return
        async with self._bench_lock:
            await super()._send(request)


async def run_one(
    mode: str, desired: str, nodes: int, *, per_connection: int, pushes: int,
    gc_freeze: bool = False, timeout: float = 180.0, protocol: str = "current",
) -> FanoutResult:
    connections = -(-nodes // per_connection)
    result = FanoutResult(mode, desired, nodes, connections, protocol)
    server = server_process(desired, gc_freeze=gc_freeze, protocol=protocol)
    channels: list[grpc.aio.Channel] = []
    clients: list[XdsClient] = []
    try:
        target = f"127.0.0.1:{server.port}"
        channels = [local_channel(target) for _ in range(connections)]
        clients = [
            BenchClient(channels[i // per_connection],
                      make_node(f"bench-{POPS[i % 2]}-{i}", POPS[i % 2]), delta=mode == "delta")
            for i in range(nodes)
        ]
        await asyncio.sleep(0.2)
        rss0, cpu0 = server.rss(), server.cpu()
        start = time.monotonic()
        gate = asyncio.Semaphore(CONNECTING)

        async def gated(client: XdsClient) -> None:
            async with gate:
                await connect(client, timeout)

        await asyncio.wait_for(asyncio.gather(*(gated(c) for c in clients)), timeout)
        synced = await all_synced(server, nodes, 10)  # the last ACKs may be in flight
        await asyncio.sleep(0.5)  # let the server settle before reading RSS
        if synced["synced"] != nodes:
            result.errors.append(f"only {synced['synced']} of {nodes} nodes synced")
        result.sync_s = synced["last_sync"] - start
        result.sync_cpu_s = server.cpu() - cpu0
        result.rss_per_node = (server.rss() - rss0) / nodes
        # pushes: move shop's weights in ewr back and forth
        result.push_nodes = sum(1 for i in range(nodes) if POPS[i % 2] == "ewr")
        group, origins = await first_group(clients)
        cpu0, client_cpu0 = server.cpu(), time.process_time()
        for n in range(pushes):
            weights = {name: 5 for name in origins}
            weights[origins[0]] = 100 - 5 * (len(origins) - 1) - (10 if n % 2 == 0 else 0)
            weights[origins[1]] += 10 if n % 2 == 0 else 0
            reply = await server.call(cmd="push", pop="ewr", group=group, weights=weights,
                                      expect=result.push_nodes, timeout=timeout)
            if not reply["ok"]:
                result.errors.append(f"push {n}: {reply['acks']} of {result.push_nodes} ACKed")
                break
            result.push_s.append(reply["last_ack"] - reply["start"])
            result.first_ack_s.append(reply["first_ack"] - reply["start"])
            result.push_cpu_s.append(reply["cpu"])
            result.push_bytes.append(reply["bytes"] / result.push_nodes)
            result.push_sends.append(reply["sends"])
            await asyncio.sleep(0.3)
        result.push_proc_cpu_s = server.cpu() - cpu0
        result.client_cpu_s = time.process_time() - client_cpu0
        broken = [c for c in clients if c.error is not None]
        if broken:
            result.errors.append(f"{len(broken)} streams failed, e.g. {broken[0].error}")
    except Exception as err:  # a benchmark reports what went wrong and carries on
        result.errors.append(f"{type(err).__name__}: {err}")
    finally:
        for client in clients:
            await client.close()
        for channel in channels:
            await channel.close()
        server.stop()
    return result


async def first_group(clients: list[XdsClient]) -> tuple[str, list[str]]:
    """The origin group whose weights the pushes move, and its origins (from a node's EDS)."""
    from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment

    for client in clients:
        for name, (_, payload) in sorted(client.state.resources.get(EDS, {}).items()):
            cla = ClusterLoadAssignment.FromString(payload)
            zones = [locality.locality.zone for locality in cla.endpoints]
            return name.split(".")[0], zones
    raise RuntimeError("no node received endpoints")


def run(
    sizes: list[int], *, desired: str = "example", per_connection: int = 10, pushes: int = 5,
    modes: tuple[str, ...] = ("sotw", "delta"), gc_freeze: bool = False,
    protocols: tuple[str, ...] = ("current",),
) -> list[FanoutResult]:
    """Every (size, mode, protocol) with a fresh server AND a fresh client process: grpc.aio
    state left over from an earlier run in the same process made streams end early at a few
    thousand nodes (CANCELLED / "Failed execute_batch"). With several `protocols` (baseline,
    current) they run back to back per (size, mode), so both see about the same load."""
    results = []
    context = multiprocessing.get_context("spawn")
    for nodes in sizes:
        for mode in modes:
            for protocol in protocols:
                with ProcessPoolExecutor(1, mp_context=context) as pool:
                    result = pool.submit(_run_in_process, mode, desired, nodes,
                                         per_connection, pushes, gc_freeze, protocol).result()
                results.append(result)
                _progress(result)
    return results


def _progress(result: FanoutResult) -> None:
    mode, desired, nodes = result.mode, result.desired, result.nodes
    label = "" if result.protocol == "current" else f" [{result.protocol}]"
    print(f"  {mode:5} {desired:7} {result.connections:5,} conns {nodes:6,} nodes{label}: "
                  f"push->last ACK {median(result.push_s) * 1e3:8.1f} ms, "
                  f"initial sync {result.sync_s:6.2f} s"
                  + (f"  ERRORS: {result.errors}" if result.errors else ""), flush=True)


def _run_in_process(
    mode: str, desired: str, nodes: int, per_connection: int, pushes: int, gc_freeze: bool,
    protocol: str = "current",
) -> FanoutResult:
    return asyncio.run(run_one(mode, desired, nodes, per_connection=per_connection,
                               pushes=pushes, gc_freeze=gc_freeze, protocol=protocol))


def report(results: list[FanoutResult]) -> str:
    rows = []
    for r in results:
        rows.append([
            r.mode if r.protocol == "current" else f"{r.mode} ({r.protocol})",
            r.desired, r.nodes, r.connections, r.sync_s,
            r.sync_cpu_s * 1e6 / r.nodes, r.rss_per_node / 1e3,
            median(r.first_ack_s) * 1e3, median(r.push_s) * 1e3, r.push_us_per_node,
            r.push_cpu_us_per_node, median(r.push_bytes),
            r.push_us_per_node / FLOOR_PUSH_US_PER_NODE,
            r.push_cpu_us_per_node / FLOOR_CPU_US_PER_NODE,
        ])
    lines = [table(
        ["mode", "desired", "nodes", "conns", "sync s", "sync CPU µs/node",
         "RSS KB/node", "1st ACK ms", "last ACK ms", "push µs/node", "push CPU µs/node",
         "B/node/push", "wall/floor", "CPU/floor"],
        rows,
    )]
    key = {(r.desired, r.nodes, r.connections, r.mode): r for r in results
           if r.protocol == "current"}
    delta_rows = []
    for (desired, nodes, conns, mode), r in key.items():
        other = key.get((desired, nodes, conns, "delta"))
        if mode == "sotw" and other is not None:
            delta_rows.append([desired, nodes, conns, *_ratios(r, other)])
    if delta_rows:
        lines += ["", "SotW / delta (same run; > 1: delta is cheaper):", table(
            ["desired", "nodes", "conns", "push wall", "push CPU", "bytes/push",
             "initial sync"], delta_rows)]
    for other, title in (
        ("baseline", "baseline protocol core / current (same run; > 1: current is cheaper):"),
        ("message", "message per stream / pre-encoded bytes (same run; > 1: current is "
                    "cheaper):"),
    ):
        base = {(r.desired, r.nodes, r.connections, r.mode): r for r in results
                if r.protocol == other}
        protocol_rows = [
            [desired, nodes, conns, mode,
             b.push_us_per_node / r.push_us_per_node,
             b.push_cpu_us_per_node / r.push_cpu_us_per_node,
             b.sync_cpu_s / r.sync_cpu_s, b.sync_s / r.sync_s]
            for (desired, nodes, conns, mode), r in key.items()
            if (b := base.get((desired, nodes, conns, mode))) is not None
        ]
        if protocol_rows:
            lines += ["", title,
                      table(["desired", "nodes", "conns", "mode", "push wall", "push CPU",
                             "sync CPU", "initial sync"], protocol_rows)]
    errors = [f"  {r.mode} {r.desired} {r.nodes}: {e}"
              for r in results for e in r.errors]
    if errors:
        lines += ["", "errors:", *errors]
    return "\n".join(lines)


def _ratios(a: FanoutResult, b: FanoutResult) -> list[float]:
    return [
        a.push_us_per_node / b.push_us_per_node,
        a.push_cpu_us_per_node / b.push_cpu_us_per_node,
        median(a.push_bytes) / median(b.push_bytes),
        a.sync_s / b.sync_s,
    ]
