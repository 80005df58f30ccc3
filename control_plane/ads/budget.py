"""What each client identity may make the ADS server hold at once, and the process in total.

An identity is whatever the embedder says a peer is (`Identify`): the certificate's identity
with mTLS, the peer's IP address without it; None (e.g. a loopback peer of a plaintext port,
which is the operator's own host) is held to the process totals only. Per identity: concurrent
streams, connections those streams use (a connection is the peer's address and port), and
bytes held in requests read but not yet handled and in responses being written. Over a budget
the newest stream (or the stream whose request or response would go over) is refused with
RESOURCE_EXHAUSTED; what is refused is counted per identity, and reported at the 1st, 10th,
100th, ... refusal (`Refusal.report`), so a flood of refusals makes a handful of log lines and
records, not one per stream. The numbers live in `AdsLimits` and `docs/security.md`.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from control_plane.ads.limits import AdsLimits
from control_plane.security.peer import certificate_identity

__all__ = ["Identify", "Ledger", "Refusal", "certificate_or_address", "peer_address",
           "peer_identity"]

# a stream's context -> its client identity (None: held to the process totals only)
Identify = Callable[[Any], str | None]


def peer_address(peer: str) -> str | None:
    """The IP address in a gRPC peer string (`ipv4:10.0.0.7:5000`, `ipv6:[::1]:5000`); None
    for loopback and local sockets (the operator's own host: process totals only)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host = rest.rsplit(":", 1)[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    return None if address.is_loopback else str(address)


def peer_identity(context: Any) -> str | None:
    """The default `Identify`: a call's peer address (`peer_address`)."""
    return peer_address(context.peer() or "")


def certificate_or_address(context: Any) -> str | None:
    """The `Identify` with mTLS: a call's certificate identity (`security/peer.py`), else (a
    certificate without URI SANs) its peer address."""
    return certificate_identity(context) or peer_identity(context)


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # says which budget and its number
    count: int  # refusals of this identity (or of the process totals) so far

    @property
    def report(self) -> bool:
        """Log and record this one: the 1st, 10th, 100th, ... of its identity."""
        return _power_of_ten(self.count)


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


@dataclass(slots=True)
class _Holder:
    streams: int = 0
    connections: Counter[str] = field(default_factory=Counter)  # connection -> its streams
    held: int = 0
    refused: int = 0


class Ledger:
    def __init__(self, limits: AdsLimits) -> None:
        self.limits = limits
        self._holders: dict[str, _Holder] = {}
        self.streams = 0
        self.held = 0
        self.refused = 0  # refusals over the process totals

    def open(self, identity: str | None, connection: str) -> Refusal | None:
        """A new stream of `identity` on `connection`: counted, or refused (nothing counted)."""
        limits = self.limits
        if self.streams >= limits.streams_total:
            return self._refuse_total(f"the server holds {self.streams:,} ADS streams, its "
                                      f"limit ({limits.streams_total:,})")
        if identity is not None:
            holder = self._holders.setdefault(identity, _Holder())
            if holder.streams >= limits.streams_per_identity:
                return self._refuse(holder, f"{holder.streams} streams open with this identity, "
                                    f"the limit is {limits.streams_per_identity}")
            if (connection not in holder.connections
                    and len(holder.connections) >= limits.connections_per_identity):
                return self._refuse(holder, f"{len(holder.connections)} connections with "
                                    "streams open with this identity, the limit is "
                                    f"{limits.connections_per_identity}")
            holder.streams += 1
            holder.connections[connection] += 1
        self.streams += 1
        return None

    def close(self, identity: str | None, connection: str) -> None:
        self.streams -= 1
        if identity is None:
            return
        holder = self._holders[identity]
        holder.streams -= 1
        holder.connections[connection] -= 1
        if holder.connections[connection] <= 0:
            del holder.connections[connection]
        if holder.streams == 0 and holder.held == 0:
            del self._holders[identity]

    def hold(self, identity: str | None, size: int) -> Refusal | None:
        """`size` more bytes held for a stream of `identity` (a request read and not yet handled,
        a response being written): counted, or refused (nothing counted)."""
        limits = self.limits
        if self.held + size > limits.held_bytes_total:
            return self._refuse_total(
                f"{size:,} more bytes would take what the server holds for requests and "
                f"responses over its limit ({limits.held_bytes_total:,} bytes)")
        if identity is not None:
            holder = self._holders[identity]
            if holder.held + size > limits.held_bytes_per_identity:
                return self._refuse(holder, f"{size:,} more bytes would take what this identity "
                                    "holds in requests and responses over its limit "
                                    f"({limits.held_bytes_per_identity:,} bytes)")
            holder.held += size
        self.held += size
        return None

    def release(self, identity: str | None, size: int) -> None:
        self.held -= size
        if identity is not None:
            self._holders[identity].held -= size

    def holding(self, identity: str) -> tuple[int, int, int]:
        """(streams, connections, bytes held) of `identity` now (tests, status)."""
        holder = self._holders.get(identity)
        if holder is None:
            return 0, 0, 0
        return holder.streams, len(holder.connections), holder.held

    def _refuse(self, holder: _Holder, reason: str) -> Refusal:
        holder.refused += 1
        return Refusal(f"over budget: {reason}", holder.refused)

    def _refuse_total(self, reason: str) -> Refusal:
        self.refused += 1
        return Refusal(f"over budget: {reason}", self.refused)
