"""A simulated SotW node at a fraction of `XdsClient`'s cost, for fleets of thousands in one
process (`bench/replicas.py`, `bench/soak.py`): it does Envoy's start-up exchange (CDS, EDS
for every cluster, LDS, RDS for the listeners' routes) and ACKs every response, on wire bytes.

A response is parsed once as a `DiscoveryResponse` (upb: C), but what a node needs of its
resources (the cluster names to ask EDS for, the listener names to ask RDS for) is read once
per distinct response body (its resources and type URL) and shared by every node that gets the
same one, as is the body's digest (what the node holds, comparable across processes). Requests
are wire bytes: the node's `Node` serialized once, the names asked for encoded once per body,
the rest concatenated per request. `XdsClient` (harness/xds_client.py) stays the reference client
every test uses; this one answers the same way (tests/test_lean_node.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse

from control_plane.ads.encoding import varint
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
)
from harness.xds_client import _resource_name

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
STARTUP = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)
BODIES_KEPT = 4096  # distinct response bodies whose names and digest are remembered
# what a stream that ends (refused, reset, ended by the server, timed out) raises
STREAM_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                 ConnectionError, TimeoutError)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(data)) + data


@dataclass(frozen=True)
class Body:
    """What nodes need of one response body (shared by every node that gets it)."""

    names: tuple[str, ...]  # its resources' names
    asked: bytes  # those names as a request's resource_names (a subscription to them)
    digest: str  # of its type URL and resources: equal digests, equal config


class Bodies:
    """Response bodies seen, by their digest: names read once (bounded)."""

    def __init__(self) -> None:
        self._known: dict[bytes, Body] = {}

    def read(self, data: bytes) -> tuple[str, str, str, Body]:
        """A DiscoveryResponse's type URL, version_info, nonce and body (its resources and type
        URL: what every node of a PoP gets alike)."""
        message = DiscoveryResponse.FromString(data)
        version, nonce = message.version_info, message.nonce
        message.ClearField("version_info")
        message.ClearField("nonce")
        key = hashlib.blake2b(message.SerializeToString(), digest_size=16).digest()
        known = self._known.get(key)
        if known is None:
            type_url = message.type_url
            names = tuple(_resource_name(type_url, item.value) for item in message.resources)
            known = Body(names, b"".join(_field(3, name.encode()) for name in names), key.hex())
            if len(self._known) >= BODIES_KEPT:
                self._known.clear()
            self._known[key] = known
        return message.type_url, version, nonce, known


@dataclass
class Held:
    """What a node holds of one type: the last version it ACKed, its body, and when the ACK
    was written (`time.monotonic()`)."""

    version: str
    body: Body
    acked_at: float


@dataclass
class LeanNode:
    node_id: str
    pop: str
    bodies: Bodies
    held: dict[str, Held] = field(default_factory=dict)
    responses: int = 0
    synced_at: float = 0.0  # when every start-up type was first ACKed
    error: BaseException | None = None
    _call: grpc.aio.StreamStreamCall | None = None  # type: ignore[type-arg]
    _reader: asyncio.Task[None] | None = None
    _synced: asyncio.Event = field(default_factory=asyncio.Event)
    _step: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def node_bytes(self) -> bytes:
        node = Node(id=self.node_id, cluster="sim", user_agent_name="ballast-lean")
        node.user_agent_version = "sim"
        node.locality.zone = self.pop
        node.extensions.add(
            name="envoy.queue_policy.fifo", category="envoy.queue_policy",
            type_urls=["envoy.extensions.queue_policy.fifo.v3.FifoQueuePolicyConfig"])
        return node.SerializeToString()

    async def start(self, channel: grpc.aio.Channel, timeout: float) -> None:
        """Open the stream and do the start-up exchange; returns once every type is ACKed."""
        method = channel.stream_stream(ADS_METHOD)
        self._call = method()
        self._reader = asyncio.create_task(self._read())
        await self._write(_field(2, self.node_bytes()) + _TYPE[CLUSTER_TYPE])
        await self._wait(CLUSTER_TYPE, timeout)
        await self._write(self.held[CLUSTER_TYPE].body.asked + _TYPE[ENDPOINT_TYPE])
        await self._write(_TYPE[LISTENER_TYPE])
        await self._wait(LISTENER_TYPE, timeout)
        await self._write(self.held[LISTENER_TYPE].body.asked + _TYPE[ROUTE_TYPE])
        await self._wait(None, timeout)

    def synced(self) -> bool:
        return self._synced.is_set()

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _wait(self, type_url: str | None, timeout: float) -> None:
        """Until the node holds `type_url` (None: every start-up type); ConnectionError if the
        stream ends first."""
        async def held() -> None:
            while not (self._synced.is_set() if type_url is None else type_url in self.held):
                assert self._reader is not None
                if self._reader.done():
                    raise ConnectionError(f"the stream ended: {self.error}")
                self._step.clear()
                await self._step.wait()

        await asyncio.wait_for(held(), timeout)

    async def _write(self, data: bytes) -> None:
        assert self._call is not None
        async with self._lock:  # grpc.aio allows one write in flight per call
            await self._call.write(data)

    async def _read(self) -> None:
        assert self._call is not None
        try:
            while True:
                data = await self._call.read()
                if data is grpc.aio.EOF:
                    break
                await self._answer(data)
        except STREAM_ERRORS as err:
            self.error = err
        finally:
            self._step.set()

    async def ended(self) -> None:
        """Until the stream ends (`error` says why, None: the server ended it with OK)."""
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _answer(self, data: bytes) -> None:
        type_url, version, nonce, body = self.bodies.read(data)
        # an ACK names what the node subscribes to: EDS the clusters, RDS the listeners' routes
        source = _SUBSCRIBED_FROM.get(type_url)
        held = self.held.get(source) if source is not None else None
        await self._write(b"".join((
            _field(1, version.encode()) if version else b"",
            held.body.asked if held is not None else b"",
            _TYPE.get(type_url) or _field(4, type_url.encode()),
            _field(5, nonce.encode()),
        )))
        self.held[type_url] = Held(version, body, time.monotonic())
        self.responses += 1
        if not self._synced.is_set() and all(t in self.held for t in STARTUP):
            self.synced_at = time.monotonic()
            self._synced.set()
        self._step.set()


_TYPE = {type_url: _field(4, type_url.encode()) for type_url in STARTUP}
_SUBSCRIBED_FROM = {ENDPOINT_TYPE: CLUSTER_TYPE, ROUTE_TYPE: LISTENER_TYPE}
