"""Who may open a stream: the checks of the node a stream's first request names, and what is
read from it.

The node's id is bounded, its PoP (`node.locality.zone`, else `node.metadata["pop"]`) must be one
the desired state knows (`NodeRejected`: the stream ends with INVALID_ARGUMENT and says why);
with mTLS the peer's certificate must name that PoP and node id (`VerifyPeer`: else
PERMISSION_DENIED). Read from an admitted node: its Envoy version (a gRPC client's language and
release), its capabilities (one shared object per distinct value), and what a newer stream must
share with it to replace it (`live_key`). Private keys (SDS Secrets) go only where `KeyGate`
lets them: an mTLS port has no gate; a plaintext one refuses every stream unless the operator
allowed peers on loopback (`plaintext_key_gate`).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits, clip
from control_plane.translate.capabilities import NodeCapabilities
from control_plane.translate.grpc_capabilities import describe_grpc_client, is_grpc_client

CLAIMED_CHARS = 64  # a refused stream's claimed node id and PoP, as logged and recorded

# (the stream's context, claimed PoP, claimed node id) -> why the peer (its certificate) may
# not claim them, or None
VerifyPeer = Callable[[grpc.aio.ServicerContext[Any, Any], str, str], str | None]
# the stream's context -> why private keys (SDS Secrets) may not go to it, or None
KeyGate = Callable[[grpc.aio.ServicerContext[Any, Any]], str | None]


def plaintext_key_gate(allow_loopback: bool) -> KeyGate:
    """The gate of a port that is not mTLS: no secret goes out, except (when the operator
    allowed it) to a peer on loopback, i.e. on this very machine."""

    def gate(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        peer = context.peer() or ""
        if allow_loopback and peer_on_loopback(peer):
            return None
        if allow_loopback:
            return (f"the xDS stream is not mTLS and the peer ({clip(peer, 64)}) is not on "
                    "loopback: private keys go only over mTLS")
        return ("the xDS stream is not mTLS: private keys go only over mTLS (ballast serve "
                "--allow-plaintext-secrets lets Envoys on loopback have them)")

    return gate


def peer_on_loopback(peer: str) -> bool:
    """gRPC's peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`) names a loopback address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        host = rest.rsplit(":", 1)[0]
    elif kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
    else:
        return kind == "unix"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NodeRejected(Exception):
    """The first request names no PoP, or one the desired state does not know."""


def pop_of(node: Node) -> str:
    """The PoP a node belongs to: its locality zone, else a `pop` key in its metadata."""
    if node.locality.zone:
        return node.locality.zone
    field = node.metadata.fields.get("pop")
    if field is not None and field.WhichOneof("kind") == "string_value" and field.string_value:
        return field.string_value
    raise NodeRejected(
        f"node {node.id!r} names no PoP: set node.locality.zone (or metadata.pop) to a PoP "
        "of the desired state"
    )


def check_node_id(node: Node, limits: AdsLimits) -> None:
    if len(node.id) > limits.node_id_chars:
        raise NodeRejected(
            f"node id {clip(node.id, 64)!r} has {len(node.id):,} characters; the limit is "
            f"{limits.node_id_chars}"
        )


def live_key(node_id: str, grpc_client: bool, first: Any) -> str:
    """What a newer stream must share with an older one to replace it: the node id; for a
    proxyless gRPC client, also what its first request names. grpcio keeps one xDS client per
    channel target, each with a stream of its own and the same node (measured, grpcio 1.85:
    replacing by node id alone made two targets' streams replace each other every second), and
    each one's first request names its target's listener."""
    if not grpc_client:
        return node_id
    names = (first.resource_names if isinstance(first, DiscoveryRequest)
             else first.resource_names_subscribe)
    digest = hashlib.sha256("\0".join(sorted(names)).encode()).hexdigest()[:16]
    return f"{node_id}\0{digest}"


def envoy_version(node: Node, limit: int = DEFAULT_LIMITS.text_chars) -> str:
    """The node's Envoy version, or a gRPC client's language and release."""
    if is_grpc_client(node):
        return clip(describe_grpc_client(node), limit)
    if node.HasField("user_agent_build_version"):
        v = node.user_agent_build_version.version
        return f"{v.major_number}.{v.minor_number}.{v.patch}"
    return clip(node.user_agent_version, limit) or "unknown"


# capabilities read from nodes -> one shared instance of each (a handful of distinct values:
# the reasons are phrased from constants); bounded all the same
_CANONICAL_CAPABILITIES: dict[NodeCapabilities, NodeCapabilities] = {}
MAX_CANONICAL_CAPABILITIES = 64


def canonical_capabilities(advertised: NodeCapabilities) -> NodeCapabilities:
    """One object per distinct value, shared by the streams that advertise it."""
    found = _CANONICAL_CAPABILITIES.get(advertised)
    if found is not None:
        return found
    if len(_CANONICAL_CAPABILITIES) >= MAX_CANONICAL_CAPABILITIES:
        _CANONICAL_CAPABILITIES.clear()
    _CANONICAL_CAPABILITIES[advertised] = advertised
    return advertised
