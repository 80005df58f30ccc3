"""What the ADS server tells the program embedding it: the observability hooks of a stream.

Modelled on go-control-plane's `server.Callbacks`: the server calls these on the event loop, in
the order things happen on a stream, and never waits for anything they do. `Callbacks` does
nothing; an embedder overrides what it needs (decision records, its own metrics, tests). An
exception raised by a callback is logged and swallowed: observing must never break a stream.
"""

from __future__ import annotations

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control_plane.ads.nodes import NodeEntry
from control_plane.ads.protocol import Ack, DeltaResponse, Nack, SotwResponse


class Callbacks:
    def on_stream_open(self, node: NodeEntry) -> None:
        """A node's stream was accepted (its first request named a known PoP)."""

    def on_stream_closed(self, node: NodeEntry, status: str, details: str) -> None:
        """The stream ended; `status` is the gRPC status code's name (OK, UNAVAILABLE, ...)."""

    def on_stream_refused(self, node_id: str, pop: str, reason: str) -> None:
        """A stream was refused with PERMISSION_DENIED: the peer's certificate does not name the
        node id and PoP its first request claims (both quoted to 64 characters); or with
        RESOURCE_EXHAUSTED over a budget (`budget.py`: `node_id` is the client identity quoted
        to 64 characters, `pop` is empty), at the 1st, 10th, 100th, ... such refusal of that
        identity."""

    def on_stream_superseded(self, older: NodeEntry, newer: NodeEntry) -> None:
        """`newer` has the node id of `older`, which is being closed (the newer stream wins)."""

    def on_request(
        self, node: NodeEntry, request: DiscoveryRequest | DeltaDiscoveryRequest
    ) -> None:
        """A request arrived (the first one included), before the stream core saw it."""

    def on_response(
        self, node: NodeEntry, response: SotwResponse | DeltaResponse, size: int
    ) -> None:
        """A response of `size` bytes was written to the stream."""

    def on_ack(self, node: NodeEntry, ack: Ack) -> None:
        """The node accepted the response with `ack.nonce`."""

    def on_nack(self, node: NodeEntry, nack: Nack) -> None:
        """The node rejected the response with `nack.nonce` (`nack.message` truncated to the
        server's limit); `node.nack_count(type_url)` > 1 when it repeats the last NACK."""

    def on_secrets_refused(self, node: NodeEntry, names: list[str], reason: str) -> None:
        """The node asked for SDS secrets (private keys) on a stream they may not go to (not
        mTLS); it is not answered. Once per stream; `names`: the first few it asked for."""

    def on_capability_fallback(
        self, node: NodeEntry, capability_key: str, version: str, notes: tuple[str, ...]
    ) -> None:
        """The node got a fallback (e.g. FIFO instead of adaptive LIFO); once per stream and CDS
        version."""
