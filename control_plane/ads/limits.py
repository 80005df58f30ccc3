"""How much any one ADS client may make the server hold, and how over-long text is shortened.

Every field a client writes is bounded before anything keeps it: a request over a bound ends
the stream with INVALID_ARGUMENT (the message says which bound), and free text the server
only reports (NACK messages, the node's version string) is kept truncated with its original
length noted (`clip`). The numbers are in `docs/security.md`; `AdsLimits` carries them so
tests (and operators, through `ballast serve` options) can change them.

Why these values: Envoy node ids are host names or pod names (Kubernetes caps names at 253
characters); resource names are cluster and route names of the desired state (a few dozen
characters); Ballast's nonces are decimal counters; a PoP has tens to hundreds of resources
per type, so 10,000 names in one subscription is far above any real Envoy, and far below what
would stall the event loop (a 3 M-name delta subscription held 1.1 GB and took 2 s).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "DESCRIPTOR_RESERVE", "AdsLimits", "clip", "connection_cap"]

# descriptors the xDS port's connections leave to the rest of the process: the admin API's
# connections (at most 256, `admin/connections.py`), the state store, the desired file, the
# decision log, etcd and Prometheus clients, probes, gRPC's own
DESCRIPTOR_RESERVE = 512
MIN_CONNECTIONS_TOTAL = 64


@dataclass(frozen=True)
class AdsLimits:
    node_id_chars: int = 1024
    name_chars: int = 512  # resource names and type URLs
    nonce_chars: int = 64
    message_chars: int = 2048  # NACK error messages, as kept and recorded
    text_chars: int = 256  # other reported node text: versions, PoP names in messages
    names_per_subscription: int = 10_000
    streams_per_connection: int = 100
    # streams doing their initial exchange at once (all types answered and ACKed, or
    # `initial_sync_s`); the others wait unread, so a reconnect storm cannot queue the pushes
    # of nodes already synced behind thousands of start-ups
    initial_syncs: int = 256
    initial_sync_s: float = 5.0
    request_bytes: int = 4 * 1024 * 1024  # gRPC max receive message length
    # a new connection's TLS / HTTP/2 handshake; gRPC's default lets an idle one hold 120 s
    handshake_ms: int = 10_000
    # a connection without a stream for this long is closed (GOAWAY; gRPC's default: never),
    # and one without a valid stream for this long, whatever other streams it opens
    # (`connections.py`)
    connection_idle_ms: int = 60_000
    # deadlines: a stream's first request; a response write that makes no progress
    first_request_s: float = 10.0
    write_stall_s: float = 10.0
    # budgets (`budget.py`) per client identity (the certificate's with mTLS, else the peer's
    # address) and for the process: a node needs one ADS stream on one connection, two for a
    # moment while it reconnects; a request is at most `request_bytes`
    streams_per_identity: int = 8
    connections_per_identity: int = 4
    held_bytes_per_identity: int = 16 * 1024 * 1024
    streams_total: int = 20_000
    held_bytes_total: int = 256 * 1024 * 1024
    # connections (`connections.py`): the port's total (0: the descriptor limit less
    # `DESCRIPTOR_RESERVE`, `connection_cap()`), what one peer address may hold in connections
    # that never carried a valid stream, and what one identity may hold in connections that
    # did (an Envoy uses one for ADS, its stats sinks and load reports, and one per worker
    # thread for access logs: each worker has its own connection pool — 5 at --concurrency 4)
    connections_total: int = 0
    unproven_per_address: int = 32
    proven_per_identity: int = 128


DEFAULT_LIMITS = AdsLimits()


def connection_cap(limits: AdsLimits) -> int:
    """The xDS port's connection cap: `limits.connections_total`, else the process's soft
    descriptor limit less `DESCRIPTOR_RESERVE` (at least `MIN_CONNECTIONS_TOTAL`)."""
    if limits.connections_total:
        return limits.connections_total
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CONNECTIONS_TOTAL, soft - DESCRIPTOR_RESERVE)


def clip(text: str, limit: int, *, tail: int = 0) -> str:
    """`text`, or `limit` of its characters and the original length when it is longer: the
    first `limit - tail` and the last `tail` (an Envoy NACK echoes the refused config first
    and gives the reason last)."""
    if len(text) <= limit:
        return text
    tail = min(max(tail, 0), limit)
    end = f" … {text[len(text) - tail:]}" if tail else ""
    return f"{text[:limit - tail]}… [truncated: {len(text):,} characters]{end}"
