"""`ConfigAcks`: which nodes of a PoP applied the desired-state version it serves, and which
refused one — read from the ADS streams (SotW and delta alike), for a rollout's gates and the
faces (`ballast status`, `/rollout`).

A node has applied its PoP's version when its stream last answered from the PoP's current
output and every type's last response was ACKed (`NodeEntry.applied`): a PoP's output changes
when its wave starts (or a weight shifts), the stream is pushed, and the node's ACKs follow. A
NACK is kept with the version (digest) its PoP served when it came, the node's Envoy build and
the message (the last `MAX_NACKS`, oldest dropped: a storm of NACKs holds bounded memory).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Nack as StreamNack
from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.gates import Nack, NodeAck
from control_plane.observe.source import wall_ms

MAX_NACKS = 1000


@dataclass(frozen=True)
class PopAcks:
    """One PoP's nodes against the version it serves."""

    version: str
    applied: int
    pending: int
    nacked: int

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "applied": self.applied, "pending": self.pending,
                "nacked": self.nacked}


class ConfigAcks:
    def __init__(self, nodes: NodeRegistry, cache: SnapshotCache[Any],
                 version_of: Callable[[str], str], clock: Callable[[], int] = wall_ms) -> None:
        self._nodes = nodes
        self._cache = cache
        self._version_of = version_of  # PoP -> the digest of the desired state it serves
        self._clock = clock
        self._nacks: deque[tuple[int, Nack]] = deque(maxlen=MAX_NACKS)

    def nacked(self, node: NodeEntry, nack: StreamNack) -> None:
        """A node refused a response (the ADS observer's NACK callback)."""
        self._nacks.append((self._clock(), Nack(
            pop=node.pop, node=node.node_id, version=self._version_of(node.pop),
            envoy=node.envoy_version, type_url=nack.type_url, message=nack.message)))

    def nacks(self, since_ms: int) -> tuple[Nack, ...]:
        """The NACKs that came at or after `since_ms`, oldest first."""
        return tuple(nack for at, nack in self._nacks if at >= since_ms)

    def nodes(self, pops: Iterable[str]) -> tuple[NodeAck, ...]:
        """Every connected node of `pops` and the version it applied (None: not the one its
        PoP serves now, yet)."""
        return tuple(
            NodeAck(pop, entry.node_id, version if self._applied(pop, entry) else None)
            for pop in pops for version in (self._version_of(pop),)
            for entry in sorted(self._nodes.entries(pop), key=lambda e: e.node_id))

    def pop(self, pop: str) -> PopAcks:
        """`pop`'s nodes counted: applied its version, still pending, NACKed."""
        applied = pending = nacked = 0
        for entry in self._nodes.entries(pop):
            if self._applied(pop, entry):
                applied += 1
            elif entry.overall == "NACKED":
                nacked += 1
            else:
                pending += 1
        return PopAcks(self._version_of(pop), applied, pending, nacked)

    def _applied(self, pop: str, entry: NodeEntry) -> bool:
        return entry.applied(self._cache.entry(pop, entry.capability_key))
