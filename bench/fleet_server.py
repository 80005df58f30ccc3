"""The server side of the fleet benchmark (`bench/fleet.py`): Ballast, or the raw grpc.aio floor.

`python -m bench.fleet_server ballast|floor POPS GROUPS [VARIANT]` prints `{"port": ...}` when
serving (VARIANT: Ballast without one of its parts, `VARIANTS`),
then answers one JSON command per stdin line with one JSON line (times are `time.monotonic()`,
shared with the client process):

- `synced`: nodes that ACKed all four types, when the last one did;
- `push {"pops": [...] | "*", "expect": N}`: shift one origin group's weights in those PoPs and
  wait for N ACKs of the new versions. Each side makes what it pushes first, off the loop (the
  floor serializes its bodies; Ballast translates the changed PoPs as a reconcile tick does,
  `await change.prepare()` in the change transaction), then swaps it in (the floor in one loop
  callback; Ballast: the rest of the transaction, whose last step is the swap — no store or
  log here); returns the time of that swap (`tick_s`), first/last ACK, CPU;
- `lag`: the largest event-loop stall since the last `lag` (a 5 ms sleep, measured), and the
  longest garbage collection (its wall time and its CPU) and the time in them, then reset;
- `heap`: the objects a full collection would walk now, and the frozen ones;
- `stop`.

`ballast`: a real `BallastServer` (every PoP translated before the port is bound, on a worker
thread, and the heap settled, as `BallastService` does under `ballast serve`), no debounce.
`floor`: the cheapest grpc.aio fan-out (docs/architecture.md, "gRPC and the fan-out floor"): a
generic handler with a bytes serializer, every response body serialized once per (PoP, type,
version) and only `version_info` and `nonce` appended per stream; SotW only, it answers a type's
first request (no nonce), counts a request with the latest nonce as an ACK and ignores one with an
older nonce. Both serve the same resources (Ballast's translation of the same desired state).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from bench.command_pipe import commands, reply
from control_plane.ads import nodes as nodes_module
from control_plane.desired.model import Desired, GroupWeights
from control_plane.intent.pair_changes import PairChange, changes_of
from control_plane.lifecycle import heap
from control_plane.lifecycle.heap import release_heap, settle_heap
from control_plane.translate.pop import PopIntent, translate_pop
from control_plane.translate.resources import (
    ENDPOINT_TYPE,
    PUSH_ORDER,
    STARTUP_TYPES,
    Capabilities,
)
from control_plane.xds_port.server import BallastServer
from harness.models import fleet_desired

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
PROBE_S = 0.005
PUSHED_GROUP = "g000"


class Tracker:
    """Initial syncs and the ACKs of one push's versions, per PoP."""

    def __init__(self) -> None:
        self.types: dict[object, set[str]] = {}
        self.synced = 0
        self.synced_by_pop: dict[str, int] = {}
        self.last_sync = 0.0
        self.targets: dict[str, str] = {}  # pop -> the EDS version being pushed
        self.expected = 0
        self.acks = 0
        self.first_ack = 0.0
        self.last_ack = 0.0
        self.done: asyncio.Future[None] | None = None

    def on_ack(self, stream: object, pop: str, type_url: str, version: str) -> None:
        now = time.monotonic()
        types = self.types.setdefault(stream, set())
        if len(types) < len(STARTUP_TYPES) and type_url in STARTUP_TYPES:
            types.add(type_url)
            if len(types) == len(STARTUP_TYPES):
                self.synced += 1
                self.synced_by_pop[pop] = self.synced_by_pop.get(pop, 0) + 1
                self.last_sync = now
        if type_url == ENDPOINT_TYPE and self.targets.get(pop) == version:
            self.acks += 1
            if self.acks == 1:
                self.first_ack = now
            self.last_ack = now
            if self.acks >= self.expected and self.done is not None and not self.done.done():
                self.done.set_result(None)


class LagProbe:
    """The loop's largest stall (a 5 ms sleep, measured), and the longest garbage collection
    and the time spent in them (`gc.callbacks`) since the last `take`."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.gc_longest = 0.0
        self.gc_total = 0.0
        self.gc_longest_cpu = 0.0  # the CPU of the longest (a loaded machine stretches walls)
        self._gc_started = (0.0, 0.0)
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = (time.perf_counter(), time.thread_time())
            return
        spent = time.perf_counter() - self._gc_started[0]
        self.gc_total += spent
        if spent > self.gc_longest:
            self.gc_longest = spent
            self.gc_longest_cpu = time.thread_time() - self._gc_started[1]

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            self.worst = max(self.worst, time.perf_counter() - started - PROBE_S)

    def take(self) -> dict[str, float]:
        taken = {"worst": self.worst, "gc_longest": self.gc_longest, "gc_total": self.gc_total,
                 "gc_longest_cpu": self.gc_longest_cpu}
        self.worst = self.gc_longest = self.gc_total = self.gc_longest_cpu = 0.0
        return taken


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def heap_census() -> dict[str, int]:
    """The objects a full garbage collection would walk now (tracked, not frozen), and the
    frozen ones."""
    return {"walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}


def shifted(desired: Desired, pop: str, step: int) -> GroupWeights:
    group = desired.group(PUSHED_GROUP)
    home = group.home_weights(pop)
    first, second = group.preference[pop][:2]
    move = 1 + step % 40  # a PoP's weights differ from any of its last 39 pushes
    return {**home, first: home[first] - move, second: home[second] + move}


# -- Ballast ---------------------------------------------------------------------------------

# Ballast as it was before one of its parts (`python -m bench.run --only fleet --variants ...`):
# what each part is worth, measured in the same run (these reach into the parts' internals)
VARIANTS = {
    "gc-startup": "the heap frozen once at start-up, CPython's collections (no survivors "
                  "frozen, no collections on the loop)",
    "gc-survivors": "what a full collection finds alive frozen, on CPython's schedule",
    "gc-no-young": "full collections on the loop, without its own young collections",
    "unsliced": "a change's streams all woken in one loop turn",
}


class BallastSide:
    def __init__(self, desired: Desired, tracker: Tracker, variant: str = "") -> None:
        self.desired = desired
        self.tracker = tracker
        self.variant = variant
        original = nodes_module.NodeEntry.acked

        def acked(entry: Any, type_url: str, version: str) -> None:
            original(entry, type_url, version)
            tracker.on_ack(entry.stream, entry.pop, type_url, version)

        nodes_module.NodeEntry.acked = acked  # type: ignore[method-assign]
        self.server = BallastServer(desired, xds_address="127.0.0.1:0", debounce=0.0,
                                    max_delay=0.0)

    async def start(self) -> int:
        cache = self.server.cache
        cache.commit_entries(await asyncio.to_thread(cache.prepare_entries(Capabilities())))
        await self.server.start()
        settle_heap()  # as `ballast serve` does
        if self.variant.startswith("gc-"):
            release_heap()
            gc.collect()
            gc.freeze()
            if self.variant == "gc-survivors":
                gc.callbacks.append(_freeze_survivors)
            elif self.variant == "gc-no-young":
                settle_heap()
                assert heap._collections is not None
                heap._collections.stop()
                gc.set_threshold(*heap._collections.thresholds[:2], heap.NO_FULL_COLLECTION)
        elif self.variant == "unsliced":
            self.server.hub.turn_s = 1e9
        return int(self.server.port)

    async def push(self, pops: list[str], step: int, started: Callable[[], None]
                   ) -> dict[str, str]:
        """The change translated before the push, off the loop, as a reconcile tick does; then
        `started()` and the rest of the change transaction, whose last stage is the swap."""
        intent = self.server.intent
        async with intent.change() as change:
            change.tick(changes_of(change.base, [
                PairChange((pop, PUSHED_GROUP), shifted(self.desired, pop, step),
                           intent.controller((pop, PUSHED_GROUP))) for pop in pops]),
                planned_for=change.base.desired)
            await change.prepare()
            await asyncio.sleep(0.05)
            started()
        cache = self.server.cache
        return {pop: cache.resources(pop, Capabilities()).type_version(ENDPOINT_TYPE)
                for pop in pops}

    async def stop(self) -> None:
        await self.server.stop(0.5)


# -- the floor -------------------------------------------------------------------------------

def _field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field."""
    out = bytearray([number << 3 | 2])
    size = len(value)
    while size > 0x7F:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + value


class FloorStream:
    def __init__(self, side: FloorSide, context: Any) -> None:
        self.side = side
        self.context = context
        self.pop = ""
        self.nonces: dict[str, str] = {}
        self.sent: dict[str, str] = {}
        self.count = 0
        self.lock = asyncio.Lock()

    async def send(self, type_url: str) -> None:
        version, body = self.side.bodies[self.pop][type_url]
        self.count += 1
        nonce = str(self.count)
        self.nonces[type_url], self.sent[type_url] = nonce, version
        async with self.lock:
            await self.context.write(body + _field(1, version.encode()) + _field(5, nonce.encode()))


class FloorSide:
    def __init__(self, desired: Desired, tracker: Tracker) -> None:
        self.desired = desired
        self.tracker = tracker
        self.bodies: dict[str, dict[str, tuple[str, bytes]]] = {}
        self.streams: dict[str, set[FloorStream]] = {}
        self.sending: set[asyncio.Future[None]] = set()  # pushes in flight (kept referenced)
        self.server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 1000)])

    def _bodies(self, pop: str, weights: dict[str, GroupWeights]) -> dict[str, tuple[str, bytes]]:
        resources = translate_pop(self.desired, pop, Capabilities(), PopIntent(weights=weights))
        out = {}
        for type_url in PUSH_ORDER:
            items = resources.of_type(type_url)
            body = b"".join(_field(2, _field(1, type_url.encode()) + _field(2, r.payload))
                            for r in items.values()) + _field(4, type_url.encode())
            out[type_url] = (resources.type_version(type_url), body)
        return out

    async def start(self) -> int:
        def build() -> dict[str, dict[str, tuple[str, bytes]]]:
            return {pop: self._bodies(pop, {}) for pop in self.desired.pop_names}

        self.bodies = await asyncio.to_thread(build)
        handler = grpc.method_handlers_generic_handler(
            "envoy.service.discovery.v3.AggregatedDiscoveryService",
            {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self._ads, request_deserializer=DiscoveryRequest.FromString,
                response_serializer=lambda data: data)},
        )
        self.server.add_generic_rpc_handlers((handler,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def _ads(self, requests: Any, context: Any) -> None:
        stream = FloorStream(self, context)
        try:
            async for request in requests:
                if not stream.pop:
                    stream.pop = request.node.locality.zone
                    self.streams.setdefault(stream.pop, set()).add(stream)
                type_url = request.type_url
                if request.response_nonce:  # an ACK or NACK; of an older response: ignored
                    if request.response_nonce == stream.nonces.get(type_url) and \
                            not request.HasField("error_detail"):
                        self.tracker.on_ack(stream, stream.pop, type_url, request.version_info)
                    continue
                await stream.send(type_url)
        finally:
            self.streams.get(stream.pop, set()).discard(stream)

    def prepare(self, pops: list[str], step: int) -> dict[str, tuple[str, bytes]]:
        """The pushed EDS bodies, serialized before the push (the floor's premise)."""
        return {pop: self._bodies(pop, {PUSHED_GROUP: shifted(self.desired, pop, step)})[
            ENDPOINT_TYPE] for pop in pops}

    def push(self, bodies: dict[str, tuple[str, bytes]]) -> dict[str, str]:
        for pop, body in bodies.items():
            self.bodies[pop][ENDPOINT_TYPE] = body
            for stream in self.streams.get(pop, ()):
                sending = asyncio.ensure_future(stream.send(ENDPOINT_TYPE))
                self.sending.add(sending)
                sending.add_done_callback(self.sending.discard)
        return {pop: version for pop, (version, _) in bodies.items()}

    async def stop(self) -> None:
        await self.server.stop(0.5)


# -- command loop ----------------------------------------------------------------------------

async def main(kind: str, pops: int, groups: int, variant: str = "") -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    desired = fleet_desired(pops, groups)
    tracker = Tracker()
    side: BallastSide | FloorSide = (BallastSide(desired, tracker, variant)
                                     if kind == "ballast" else FloorSide(desired, tracker))
    port = await side.start()
    gc.collect()
    probe = LagProbe()
    probe_task = asyncio.create_task(probe.run())
    step = 0
    async for command in commands(port):
        name = command["cmd"]
        if name == "synced":
            reply({"synced": tracker.synced, "last_sync": tracker.last_sync,
                   "by_pop": tracker.synced_by_pop, "streams": len(tracker.types),
                   "types_acked": dict(Counter(len(t) for t in tracker.types.values()))})
        elif name == "lag":
            reply(probe.take())
        elif name == "heap":
            reply(heap_census())
        elif name == "push":
            step += 1
            targets = list(desired.pop_names) if command["pops"] == "*" else command["pops"]
            reply(await push(side, tracker, targets, step, command))
    probe_task.cancel()
    await side.stop()


async def push(side: BallastSide | FloorSide, tracker: Tracker, pops: list[str], step: int,
               command: dict[str, Any]) -> dict[str, Any]:
    tracker.acks, tracker.expected = 0, command["expect"]
    tracker.done = asyncio.get_running_loop().create_future()
    # both sides make what they push before the push starts, off the loop: the floor
    # serializes its bodies (its premise), Ballast translates as a reconcile tick does
    marks: dict[str, float] = {}

    def started() -> None:
        marks.update(cpu=time.process_time(), start=time.monotonic(), tick=time.perf_counter())

    if isinstance(side, FloorSide):
        bodies = await asyncio.to_thread(side.prepare, pops, step)
        await asyncio.sleep(0.05)
        started()
        tracker.targets = side.push(bodies)
    else:
        tracker.targets = await side.push(pops, step, started)
    tick = time.perf_counter() - marks["tick"]
    cpu0, start = marks["cpu"], marks["start"]
    try:
        await asyncio.wait_for(tracker.done, command.get("timeout", 120.0))
        ok = True
    except TimeoutError:
        ok = False
    tracker.targets = {}
    return {"ok": ok, "start": start, "tick_s": tick, "first_ack": tracker.first_ack,
            "last_ack": tracker.last_ack, "acks": tracker.acks,
            "cpu": time.process_time() - cpu0}


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5]))
