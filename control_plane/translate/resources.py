"""What translation produces: Envoy resources for one PoP, serialized once, shared by every node.

A `Resource` carries the protobuf message (for reading and JSON rendering) and its wire bytes
(`payload`), which may hold extra fields xds-protos does not know yet (Cluster field 62,
queuing_policies). `version` is a content hash of the payload: equal bytes, equal version, so
versions survive restarts and a resource that did not change is never re-sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
RUNTIME_TYPE = "type.googleapis.com/envoy.service.runtime.v3.Runtime"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

# Make-before-break: the order a change is pushed in (removals go last, in reverse). Secrets
# go before the listeners that name them (a listener warms until its secrets arrive).
PUSH_ORDER: tuple[str, ...] = (
    CLUSTER_TYPE, ENDPOINT_TYPE, SECRET_TYPE, LISTENER_TYPE, ROUTE_TYPE, RUNTIME_TYPE
)
# What every node's start-up asks for; the runtime layer (RTDS) only bootstraps that name it.
STARTUP_TYPES: tuple[str, ...] = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)

T = TypeVar("T")

ADAPTIVE_LIFO_EXTENSION = "envoy.queue_policy.adaptive_lifo"
FIFO_EXTENSION = "envoy.queue_policy.fifo"


@dataclass(frozen=True)
class Capabilities:
    """What a node's Envoy can accept, from `node.extensions` on its first request.

    `queue_policies`: the node knows Cluster field 62 (it lists an enabled queue policy); without
    it field 62 is not sent at all (Envoy then queues FIFO, its default). `adaptive_lifo`: it
    lists the adaptive LIFO policy too. `access_log`: its bootstrap asks for access logs streamed
    to Ballast (node metadata `ballast_access_log: true`), so its listeners get the gRPC access
    log (key suffix `+als`). `missing_filters`: HTTP filter types (type names) that Envoy 1.40
    lists and this node does not; operator-added filters of those types are not sent to it
    (key suffix `-f<hash>`). `load_reports`: its bootstrap sends load reports to Ballast (node
    metadata `ballast_load_reports: true`): Envoy then refuses clusters with per-endpoint stats,
    so its clusters have none (key suffix `+lrs`). `grpc`: the node is a proxyless gRPC client,
    not an Envoy; the gRPC features it has that Ballast gates on (`grpc_capabilities.py`), key
    `grpc+<features>`.
    """

    adaptive_lifo: bool = False
    queue_policies: bool = True
    access_log: bool = False
    missing_filters: frozenset[str] = frozenset()
    grpc: frozenset[str] | None = None
    load_reports: bool = False

    @property
    def key(self) -> str:
        if self.grpc is not None:
            return "".join(("grpc", *(f"+{feature}" for feature in sorted(self.grpc))))
        base = ("lifo" if self.adaptive_lifo else "fifo") if self.queue_policies else "none"
        if self.access_log:
            base = f"{base}+als"
        if self.load_reports:
            base = f"{base}+lrs"
        if self.missing_filters:
            listed = "\n".join(sorted(self.missing_filters)).encode()
            base = f"{base}-f{hashlib.sha256(listed).hexdigest()[:8]}"
        return base


@dataclass(frozen=True)
class Resource:
    type_url: str
    name: str
    message: Message
    payload: bytes
    version: str = field(default="")

    @classmethod
    def of(cls, type_url: str, name: str, message: Message) -> Resource:
        payload = message.SerializeToString(deterministic=True)
        return cls(type_url, name, message, payload, content_version(payload))


def content_version(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


@dataclass(frozen=True)
class PopResources:
    """Everything one PoP's Envoys get, by type URL then resource name."""

    pop: str
    capabilities: Capabilities
    by_type: Mapping[str, Mapping[str, Resource]]
    notes: tuple[str, ...] = ()  # e.g. "shop.critical: adaptive_lifo -> fifo (not supported)"
    # values computed from these resources once and shared by every stream (see `derived`)
    _derived: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def of_type(self, type_url: str) -> Mapping[str, Resource]:
        return self.by_type.get(type_url, {})

    def type_version(self, type_url: str) -> str:
        """A version for a whole type (SotW version_info): hash of its resources' versions."""
        return self.derived(f"type_version:{type_url}", lambda s: s._type_version(type_url))

    def _type_version(self, type_url: str) -> str:
        items = sorted((n, r.version) for n, r in self.of_type(type_url).items())
        return content_version(repr(items).encode())

    def derived_if_built(self, key: str) -> Any:
        """What `derived` keeps under `key`, or None if nothing asked for it yet (never builds:
        readers of resources other threads serve may not add to it)."""
        return self._derived.get(key)

    def derived(self, key: str, build: Callable[[PopResources], T]) -> T:
        """`build(self)`, computed the first time `key` is asked for and kept with them.

        A PoP's resources never change after translation, so whatever is computed from them
        (per-type indexes, versions) holds as long as they live and is shared by every node of
        the PoP.
        """
        try:
            return self._derived[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._derived[key] = build(self)
            return value
