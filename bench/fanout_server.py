"""The server side of the fan-out benchmark: a real `BallastServer` in its own process.

Run by `bench.fanout` as `python -m bench.fanout_server DESIRED [--gc-freeze]
[--protocol baseline]`; it prints one
JSON line `{"port": ...}` when serving, then answers one JSON command per stdin line with one
JSON line on stdout. Times are `time.monotonic()` (CLOCK_MONOTONIC, the same clock in every
process), so the client process can subtract them from its own.

The only instrumentation is a wrapper around `NodeEntry.acked` (one comparison per ACK): it
notes when every node finished its initial sync and when the last node of a PoP ACKed a push.
`--protocol baseline` swaps the per-stream core for `harness.protocol_baseline` (the protocol core
before the per-snapshot index) so one benchmark run can compare both in the same server;
`--protocol message` keeps the core but builds and serializes a response message per stream
(the encoder before the serialize-once path of `control_plane/ads/encoding.py`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from typing import Any

from bench.command_pipe import commands, reply
from bench.common import desired_by_name
from control_plane.ads import nodes as nodes_module
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate.resources import (
    ENDPOINT_TYPE,
    STARTUP_TYPES,
    Capabilities,
)
from control_plane.xds_port.server import BallastServer
from harness.intent_changes import set_weights


class AckTracker:
    def __init__(self) -> None:
        self.synced_types: dict[int, set[str]] = {}
        self.synced = 0
        self.last_sync = 0.0
        self.target: tuple[str, str, str] | None = None  # (pop, type_url, version)
        self.expected = 0
        self.acks = 0
        self.first_ack = 0.0
        self.last_ack = 0.0
        self.done: asyncio.Future[None] | None = None

    def on_ack(self, entry: Any, type_url: str, version: str) -> None:
        now = time.monotonic()
        types = self.synced_types.setdefault(entry.stream, set())
        if len(types) < len(STARTUP_TYPES) and type_url in STARTUP_TYPES:
            types.add(type_url)
            if len(types) == len(STARTUP_TYPES):
                self.synced += 1
                self.last_sync = now
        if self.target == (entry.pop, type_url, version):
            self.acks += 1
            if self.acks == 1:
                self.first_ack = now
            self.last_ack = now
            if self.acks >= self.expected and self.done is not None and not self.done.done():
                self.done.set_result(None)


def install(tracker: AckTracker) -> None:
    original = nodes_module.NodeEntry.acked

    def acked(self: Any, type_url: str, version: str) -> None:
        original(self, type_url, version)
        tracker.on_ack(self, type_url, version)

    nodes_module.NodeEntry.acked = acked  # type: ignore[method-assign]


def use_baseline_protocol() -> None:
    """Serve with the pre-index protocol core (`harness/protocol_baseline.py`)."""
    from control_plane.ads import server as ads_server
    from harness import protocol_baseline

    ads_server.SotwStream = protocol_baseline.SotwStream  # type: ignore[misc]
    ads_server.DeltaStream = protocol_baseline.DeltaStream  # type: ignore[misc]


def use_message_encoder() -> None:
    """Serve with a `DiscoveryResponse` built and serialized per stream (the encoder before
    `control_plane/ads/encoding.py`'s serialize-once path), for before/after comparisons."""
    from control_plane.ads import server as ads_server
    from control_plane.ads.encoding import encode_delta, encode_sotw
    from control_plane.ads.protocol import SotwResponse

    class MessageEncoder:
        def encode(self, response: Any) -> bytes:
            if isinstance(response, SotwResponse):
                return encode_sotw(response).SerializeToString()
            return encode_delta(response).SerializeToString()

    ads_server.ResponseEncoder = MessageEncoder  # type: ignore[misc,assignment]


def pushed_bytes(metrics: BallastMetrics) -> float:
    total = 0.0
    for family in metrics.push_bytes.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                total += sample.value
    return total


async def main(desired_name: str, freeze: bool) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tracker = AckTracker()
    install(tracker)
    metrics = BallastMetrics()
    # no debounce: the benchmark measures the fan-out, not the 100 ms quiet period
    ballast = BallastServer(
        desired_by_name(desired_name), xds_address="127.0.0.1:0", debounce=0.0,
        max_delay=0.0, metrics=metrics,
    )
    await ballast.start()
    async for command in commands(ballast.port):
        kind = command["cmd"]
        if kind == "synced":
            reply({"synced": tracker.synced, "last_sync": tracker.last_sync,
                   "nodes": len(ballast.nodes), "bytes": pushed_bytes(metrics),
                   "sends": ballast.ads.sends})
        elif kind == "push":
            if freeze:
                gc.freeze()  # everything alive now is old: the push's collections skip it
            reply(await push(ballast, tracker, metrics, command))
    await ballast.stop(0.5)


async def push(
    ballast: BallastServer, tracker: AckTracker, metrics: BallastMetrics, command: dict[str, Any]
) -> dict[str, Any]:
    pop, group, weights = command["pop"], command["group"], command["weights"]
    bytes_before, sends_before = pushed_bytes(metrics), ballast.ads.sends
    tracker.acks, tracker.expected = 0, command["expect"]
    tracker.done = asyncio.get_running_loop().create_future()
    cpu0 = time.process_time()
    start = time.monotonic()
    await set_weights(ballast.intent, pop, group, weights)
    version = ballast.cache.resources(pop, Capabilities()).type_version(ENDPOINT_TYPE)
    tracker.target = (pop, ENDPOINT_TYPE, version)
    updated = time.monotonic()
    try:
        await asyncio.wait_for(tracker.done, command.get("timeout", 120.0))
        ok = True
    except TimeoutError:
        ok = False
    cpu = time.process_time() - cpu0
    tracker.target = None
    return {
        "ok": ok, "start": start, "updated": updated, "first_ack": tracker.first_ack,
        "last_ack": tracker.last_ack, "acks": tracker.acks, "cpu": cpu,
        "bytes": pushed_bytes(metrics) - bytes_before, "sends": ballast.ads.sends - sends_before,
    }


if __name__ == "__main__":
    args = sys.argv[2:]
    protocol = args[args.index("--protocol") + 1] if "--protocol" in args else "current"
    if protocol == "baseline":
        use_baseline_protocol()
    elif protocol == "message":
        use_message_encoder()
    asyncio.run(main(sys.argv[1], "--gc-freeze" in args))
