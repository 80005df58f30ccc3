"""The identity of a gRPC peer from its verified client certificate (the mTLS port's services:
ADS, the metrics_service sink, OTLP), as plain checks the servicers are handed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from control_plane.security.identity import NodeIdentity, identities, node_mismatch

# (call context, claimed PoP, claimed node id) -> why the peer may not claim them, or None
NodePeerCheck = Callable[[grpc.aio.ServicerContext[Any, Any], str, str], str | None]
# call context -> the PoP of the peer's certificate, None when it names no node
PeerPop = Callable[[grpc.aio.ServicerContext[Any, Any]], str | None]
# a valid stream's call context (one whose node passed the checks) -> what to call once, as
# the stream ends: its connection is in use meanwhile; or the stream ended with
# RESOURCE_EXHAUSTED, over its identity's budget of connections (`ads/sweeper.py`)
Vouch = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[Callable[[], None]]]


def peer_uris(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
    """The URI SANs of the peer's verified client certificate (none without TLS)."""
    return [v.decode("utf-8", "replace") for v in context.auth_context().get("peer_uri", [])]


def certificate_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The peer's certificate identity (its URI SANs, space-separated), None without any: what
    the ADS budgets count per client with mTLS."""
    uris = peer_uris(context)
    return " ".join(sorted(uris)) if uris else None


def check_node_peer(context: grpc.aio.ServicerContext[Any, Any], pop: str, node_id: str
                    ) -> str | None:
    """Why this peer may not speak for node `node_id` of PoP `pop`; None when it may."""
    return node_mismatch(peer_uris(context), pop, node_id)


def peer_pop(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The PoP of the peer's node identity (exactly one), else None."""
    nodes = [i for i in identities(peer_uris(context)) if isinstance(i, NodeIdentity)]
    return nodes[0].pop if len(nodes) == 1 else None
