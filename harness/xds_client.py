"""A small simulated ADS client (SotW or delta) over a real grpc.aio channel.

It behaves like a well-mannered Envoy: subscribes per type, ACKs every response (or NACKs the
ones `reject` names), keeps what it received, and logs every response for assertions. Used by
the tests and by `bench/`.

`python -m harness.xds_client PORT COUNT [POPS]`: COUNT nodes (every other one on delta, spread
over POPS PoPs p000…) connected to 127.0.0.1:PORT with every type subscribed, in a process of
their own; prints "ready" once all hold their resources and closes them when stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)
from google.rpc.status_pb2 import Status

from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
)

# (type_url, names in the response) -> NACK message, or None to ACK
Reject = Callable[[str, list[str]], str | None]


@dataclass
class Received:
    type_url: str
    version: str
    nonce: str
    names: list[str]
    removed: list[str]
    at: float


@dataclass
class ClientState:
    # type -> name -> (version, payload bytes)
    resources: dict[str, dict[str, tuple[str, bytes]]] = field(default_factory=dict)
    log: list[Received] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # type -> last version ACKed


def make_node(
    node_id: str, pop: str | None = None, *, metadata_pop: str | None = None
) -> Node:
    node = Node(id=node_id, cluster="sim", user_agent_name="ballast-sim")
    node.user_agent_version = "sim"
    # like Envoy 1.40: it lists the FIFO queue policy, so it gets Cluster field 62
    node.extensions.add(
        name="envoy.queue_policy.fifo",
        category="envoy.queue_policy",
        type_urls=["envoy.extensions.queue_policy.fifo.v3.FifoQueuePolicyConfig"],
    )
    if pop is not None:
        node.locality.zone = pop
    if metadata_pop is not None:
        node.metadata.fields["pop"].string_value = metadata_pop
    return node


def local_channel(target: str) -> grpc.aio.Channel:
    """One TCP connection per simulated node (docs/architecture.md, "gRPC and the fan-out
    floor": else channels share one)."""
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


class XdsClient:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        node: Node,
        *,
        delta: bool = False,
        reject: Reject | None = None,
    ) -> None:
        self.node = node
        self.delta = delta
        self.reject = reject
        self.state = ClientState()
        self._stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        self._call: grpc.aio.StreamStreamCall | None = None  # type: ignore[type-arg]
        self._reader: asyncio.Task[None] | None = None
        self._sent_node = False
        self._names: dict[str, set[str]] = {}
        self._changed = asyncio.Condition()
        self.error: grpc.aio.AioRpcError | None = None
        self.done = asyncio.Event()
        # gRPC allows one write in flight per stream; ACKs (reader task) and subscribe calls
        # (test code) would otherwise race (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS).
        self._write_lock = asyncio.Lock()

    async def start(self) -> XdsClient:
        if self.delta:
            self._call = self._stub.DeltaAggregatedResources()
        else:
            self._call = self._stub.StreamAggregatedResources()
        self._reader = asyncio.create_task(self._read())
        return self

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    # -- requests ----------------------------------------------------------------------------

    async def subscribe(
        self,
        type_url: str,
        names: Iterable[str] = (),
        *,
        initial_versions: dict[str, str] | None = None,
    ) -> None:
        """First request for a type (no names: wildcard), or add names to it."""
        names = list(names)
        known = self._names.setdefault(type_url, set())
        known.update(names)
        if self.delta:
            request = DeltaDiscoveryRequest(
                type_url=type_url,
                resource_names_subscribe=names,
                initial_resource_versions=initial_versions or {},
            )
        else:
            request = DiscoveryRequest(
                type_url=type_url,
                resource_names=sorted(known),
                version_info=self.state.acked.get(type_url, ""),
                response_nonce=self._last_nonce(type_url),
            )
        await self._send(request)

    async def unsubscribe(self, type_url: str, names: Iterable[str]) -> None:
        names = list(names)
        self._names.setdefault(type_url, set()).difference_update(names)
        for name in names:
            self.state.resources.get(type_url, {}).pop(name, None)
        if self.delta:
            await self._send(
                DeltaDiscoveryRequest(type_url=type_url, resource_names_unsubscribe=names)
            )
        else:
            await self._send(
                DiscoveryRequest(
                    type_url=type_url,
                    resource_names=sorted(self._names[type_url]),
                    version_info=self.state.acked.get(type_url, ""),
                    response_nonce=self._last_nonce(type_url),
                )
            )

    async def send_raw(self, request: DiscoveryRequest | DeltaDiscoveryRequest) -> None:
        await self._send(request)

    async def _send(self, request: DiscoveryRequest | DeltaDiscoveryRequest) -> None:
        assert self._call is not None, "start() first"
        async with self._write_lock:
            if not self._sent_node:
                request.node.CopyFrom(self.node)
                self._sent_node = True
            await self._call.write(request)

    def _last_nonce(self, type_url: str) -> str:
        for item in reversed(self.state.log):
            if item.type_url == type_url:
                return item.nonce
        return ""

    # -- responses ---------------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._call is not None
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    break
                await self._on_response(message)
        except grpc.aio.AioRpcError as err:
            self.error = err
        finally:
            self.done.set()
            async with self._changed:
                self._changed.notify_all()

    async def _on_response(self, message: DiscoveryResponse | DeltaDiscoveryResponse) -> None:
        type_url = message.type_url
        store = self.state.resources.setdefault(type_url, {})
        if isinstance(message, DeltaDiscoveryResponse):
            names = [r.name for r in message.resources]
            removed = list(message.removed_resources)
            version = message.system_version_info
            entries = [(r.name, r.version, r.resource.value) for r in message.resources]
        else:
            names, removed, version, entries = [], [], message.version_info, []
            for item in message.resources:
                name = _resource_name(type_url, item.value)
                names.append(name)
                entries.append((name, message.version_info, item.value))
        self.state.log.append(
            Received(type_url, version, message.nonce, names, removed, time.monotonic())
        )
        problem = self.reject(type_url, names) if self.reject else None
        if problem is None:
            if not isinstance(message, DeltaDiscoveryResponse) and type_url in _FULL_STATE:
                store.clear()
            for name, res_version, payload in entries:
                store[name] = (res_version, payload)
            for name in removed:
                store.pop(name, None)
            self.state.acked[type_url] = version
        if self.delta:
            ack = DeltaDiscoveryRequest(type_url=type_url, response_nonce=message.nonce)
        else:
            ack = DiscoveryRequest(
                type_url=type_url,
                version_info=self.state.acked.get(type_url, ""),
                response_nonce=message.nonce,
                resource_names=sorted(self._names.get(type_url, ())),
            )
        if problem is not None:
            ack.error_detail.CopyFrom(Status(code=3, message=problem))
        await self._send(ack)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[XdsClient], bool], timeout: float = 5.0) -> None:
        async def check() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self) or self.done.is_set())

        await asyncio.wait_for(check(), timeout)
        if not predicate(self):
            raise AssertionError(f"stream ended first: {self.error}")

    def names(self, type_url: str) -> set[str]:
        return set(self.state.resources.get(type_url, {}))

    def responses(self, type_url: str | None = None) -> list[Received]:
        return [r for r in self.state.log if type_url is None or r.type_url == type_url]


async def connect(client: XdsClient, timeout: float) -> None:
    """Envoy's start-up order: CDS, EDS (every cluster), LDS, RDS (the listener's routes)."""
    await client.start()
    await client.subscribe(CLUSTER_TYPE)
    await client.wait_for(lambda c: bool(c.names(CLUSTER_TYPE)), timeout)
    await client.subscribe(ENDPOINT_TYPE, sorted(client.names(CLUSTER_TYPE)))
    await client.subscribe(LISTENER_TYPE)
    await client.wait_for(lambda c: bool(c.names(LISTENER_TYPE)), timeout)
    # the route configuration is named as its listener
    await client.subscribe(ROUTE_TYPE, sorted(client.names(LISTENER_TYPE)))
    await client.wait_for(
        lambda c: bool(c.names(ROUTE_TYPE)) and c.names(ENDPOINT_TYPE) == c.names(CLUSTER_TYPE),
        timeout,
    )


def _resource_name(type_url: str, payload: bytes) -> str:
    message = _MESSAGES[type_url]()
    message.ParseFromString(payload)
    if type_url.endswith("ClusterLoadAssignment"):
        return str(message.cluster_name)
    return str(message.name)


def _message_types() -> dict[str, type]:
    from envoy.config.cluster.v3.cluster_pb2 import Cluster
    from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
    from envoy.config.listener.v3.listener_pb2 import Listener
    from envoy.config.route.v3.route_pb2 import RouteConfiguration
    from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret

    return {
        f"type.googleapis.com/{cls.DESCRIPTOR.full_name}": cls
        for cls in (Cluster, ClusterLoadAssignment, Listener, RouteConfiguration, Secret)
    }


_MESSAGES = _message_types()
_FULL_STATE = {
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
}


async def _serve_nodes(port: int, count: int, pops: int) -> None:
    channels = [local_channel(f"127.0.0.1:{port}") for _ in range(count)]
    clients = [XdsClient(channel, make_node(f"n{i:05d}", f"p{i % pops:03d}"), delta=i % 2 == 1)
               for i, channel in enumerate(channels)]
    await asyncio.gather(*(connect(client, 120) for client in clients))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for client in clients:
        await client.close()
    for channel in channels:
        await channel.close()


if __name__ == "__main__":
    port, count, *pops = (int(arg) for arg in sys.argv[1:])
    asyncio.run(_serve_nodes(port, count, pops[0] if pops else 1))
