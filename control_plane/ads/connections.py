"""Which of the xDS port's connections to close, and which peer addresses to block, at one
sweep (pure; `sweeper.py` lists the connections, acts, and keeps what carries over).

gRPC shows Python a connection only once it carries a stream, and its budgets per stream
(`budget.py`) leave a connection that carries none, or only streams that are refused, free to
hold a descriptor. So the sweeper lists the port's connections from the kernel and marks each
with what the services said of it: whether a **valid stream** is open on it (one the service
accepted: an ADS stream whose first request passed the node checks, a sink stream whose node
passed them), whether one ever was (a **proven** connection), and when the last one ended.
The rules, in order:

1. **idle**: a connection with no valid stream for `idle_s` — since its last one ended, or since
   it was first seen — is closed, whatever other streams it opens;
2. **per address**: an address may hold `unproven_per_address` connections that never carried
   a valid stream (loopback addresses, the operator's own host, are exempt). When more of them
   than that are older than `PROOF_S` (time enough for any node to open its first stream), or
   more than `FLOOD_FACTOR` times that of any age (a flood), all but the oldest
   `unproven_per_address` are closed and the address is **blocked**: what it sends to the
   listening socket is dropped, so its new connections never reach gRPC, for `BLOCK_S`,
   doubled at each new offence (up to `BLOCK_MAX_S`; an address clean for `BLOCK_MAX_S`
   starts again at `BLOCK_S`);
3. **reserve**: above `total - reserve` connections, connections without a valid stream are
   closed — unproven ones first, oldest first — down to `total - reserve`, so a node of a new
   identity finds room even when many addresses each stay within their budget.

A connection is counted against its client identity (the certificate's with mTLS) once it
carries a valid stream, the first moment gRPC shows Python its certificate (`sweeper.py`: at
most `proven_per_identity` such connections; `budget.py`: at most `connections_per_identity`
with ADS streams); until then against its peer address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from control_plane.ads.limits import AdsLimits

__all__ = [
    "BLOCK_MAX_S", "BLOCK_S", "FLOOD_FACTOR", "MAX_BLOCKED", "PROOF_S", "Block", "Endpoint",
    "Rules", "Seen", "Sweep", "plan",
]

Endpoint = tuple[str, int]  # a connection's peer: address, port

PROOF_S = 5.0
FLOOD_FACTOR = 4
BLOCK_S = 10.0
BLOCK_MAX_S = 300.0
MAX_BLOCKED = 256  # addresses blocked at once: the filter's size (9 BPF instructions an IPv6
# address, of the 4,096 a filter may have)


@dataclass(frozen=True, slots=True)
class Seen:
    """A connection with no valid stream open, as a sweep sees it (the plan never closes a
    connection a valid stream uses, and is handed only how many there are)."""

    endpoint: Endpoint
    since: float  # when a sweep first listed it
    proven: bool = False  # it carried a valid stream before
    last_used: float | None = None  # when its last valid stream ended

    @property
    def quiet_since(self) -> float:
        """Since when it has had no valid stream."""
        return self.last_used if self.last_used is not None else self.since


@dataclass(frozen=True)
class Rules:
    total: int  # connections the port holds at most (gRPC refuses more)
    reserve: int  # of `total`, kept free for new identities
    unproven_per_address: int
    idle_s: float

    @classmethod
    def of(cls, limits: AdsLimits, total: int) -> Rules:
        return cls(total=total, reserve=max(16, total // 16),
                   unproven_per_address=limits.unproven_per_address,
                   idle_s=limits.connection_idle_ms / 1000)


@dataclass(frozen=True, slots=True)
class Block:
    until: float  # its new connections are dropped until then
    strikes: int  # offences, each less than BLOCK_MAX_S after the last block ended


@dataclass(frozen=True)
class Sweep:
    close: dict[Endpoint, str] = field(default_factory=dict)  # connection -> why
    blocks: dict[str, Block] = field(default_factory=dict)  # what carries over to the next sweep
    offenders: tuple[str, ...] = ()  # addresses blocked (again) by this sweep

    def blocked(self, now: float) -> list[str]:
        """The addresses to block now: the latest-ending `MAX_BLOCKED` of those blocked."""
        active = sorted((b.until, a) for a, b in self.blocks.items() if b.until > now)
        return [address for _, address in active[-MAX_BLOCKED:]]


def is_local(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def plan(seen: Sequence[Seen], in_use: int, now: float, rules: Rules,
         blocks: Mapping[str, Block]) -> Sweep:
    """`seen`: the port's connections without a valid stream open; `in_use`: how many others
    it holds; `blocks`: the last sweep's."""
    close: dict[Endpoint, str] = {}
    for c in seen:
        if now - c.quiet_since >= rules.idle_s:
            close[c.endpoint] = f"no valid stream for {rules.idle_s:g} s"
    kept = {address: b for address, b in blocks.items() if now < b.until + BLOCK_MAX_S}
    offenders = _per_address(seen, now, rules, close, kept)
    _reserve(seen, in_use, rules, close)
    return Sweep(close, kept, offenders)


def _per_address(seen: Sequence[Seen], now: float, rules: Rules, close: dict[Endpoint, str],
                 blocks: dict[str, Block]) -> tuple[str, ...]:
    unproven: dict[str, list[Seen]] = {}
    for c in seen:
        if not (c.proven or c.endpoint in close or is_local(c.endpoint[0])):
            unproven.setdefault(c.endpoint[0], []).append(c)
    budget = rules.unproven_per_address
    offenders = []
    for address, held in unproven.items():
        aged = sum(now - c.since >= PROOF_S for c in held)
        if aged <= budget and len(held) <= FLOOD_FACTOR * budget:
            continue
        held.sort(key=lambda c: c.since)
        for c in held[budget:]:
            close[c.endpoint] = (f"more than {budget} connections of one address without a "
                                 "valid stream")
        previous = blocks.get(address)
        strikes = previous.strikes + 1 if previous is not None else 1
        blocks[address] = Block(now + min(BLOCK_S * 2 ** (strikes - 1), BLOCK_MAX_S),
                                strikes)
        offenders.append(address)
    return tuple(offenders)


def _reserve(seen: Sequence[Seen], in_use: int, rules: Rules,
             close: dict[Endpoint, str]) -> None:
    room = rules.total - rules.reserve
    over = in_use + len(seen) - len(close) - room
    if over <= 0:
        return
    candidates = sorted((c for c in seen if c.endpoint not in close),
                        key=lambda c: (c.proven, c.quiet_since))
    for c in candidates[:over]:
        close[c.endpoint] = (f"the port holds more than {room:,} connections (its cap "
                             f"{rules.total:,} less {rules.reserve:,} kept for new nodes)")
