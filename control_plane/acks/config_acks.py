"""`ConfigAcks`: which nodes of a PoP applied the desired-state version it serves, and which
refused one — read from the ADS streams (SotW and delta alike), for a rollout's gates and the
faces (`ballast status`, `/rollout`).

A node has applied its PoP's version when its stream last answered from the PoP's current
output and every type's last response was ACKed (`NodeEntry.applied`): a PoP's output changes
when its wave starts (or a weight shifts), the stream is pushed, and the node's ACKs follow. A
NACK is kept with the version (digest) its PoP served when it came, the node's Envoy build and
the message (the last `MAX_NACKS`, oldest dropped: a storm of NACKs holds bounded memory).

**Replicas** (etcd): an Envoy streams from one replica, so each replica knows only its own
nodes. Each one shares them (`shared()`, a `SharedAcks`: `shared_acks.py`, the value and its
bounded parser) and `nodes`, `nacks` and `pop` answer for the nodes of every live replica: the
leader's gates hear a node whichever replica it is connected to. A peer's node counts as
applied only when that replica serves the PoP the same version as this one; a live replica
whose value is unreadable, or that shares none, stands in every PoP as one node that has not
applied the version (the gates fail closed).

A NACK's node id, Envoy build, type and message are a node's text: they are escaped
(`security/terminal.py`) as they become a gate's input, so the readings and the rollout's
reason that quote them (records, `ballast rollout status`) hold no control characters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from control_plane.acks.shared_acks import (
    NODE_STATES,
    SHARED_NACKS,
    NodeState,
    SharedAcks,
    SharedPop,
)
from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Nack as StreamNack
from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.gates import Nack, NodeAck
from control_plane.observe.source import wall_ms
from control_plane.security.terminal import escape

MAX_NACKS = 1000
# listed nodes a replica shares: etcd refuses a request over 1.5 MiB by default; a node id is
# at most 1024 characters (`AdsLimits`), a typical one a few dozen: thousands of nodes fit
SHARED_NODE_BYTES = 512 * 1024


@dataclass(frozen=True)
class PopAcks:
    """One PoP's nodes against the version it serves (with replicas: summed over the live
    replicas, and `replicas`: each one's own counts and version)."""

    version: str
    applied: int
    pending: int
    nacked: int
    replicas: tuple[tuple[str, SharedPop], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"version": self.version, "applied": self.applied,
                                 "pending": self.pending, "nacked": self.nacked}
        if self.replicas:
            shown["replicas"] = {replica: {"version": pop.version, "applied": pop.applied,
                                           "pending": pop.pending, "nacked": pop.nacked}
                                 for replica, pop in self.replicas}
        return shown


class ConfigAcks:
    def __init__(self, nodes: NodeRegistry, cache: SnapshotCache[Any],
                 version_of: Callable[[str], str], clock: Callable[[], int] = wall_ms,
                 *, replica: str = "",
                 peers: Callable[[], Mapping[str, SharedAcks]] = dict) -> None:
        """`replica`: this replica's id among several ("" alone); `peers`: what the other live
        replicas share (replica id -> its nodes)."""
        self._nodes = nodes
        self._cache = cache
        self._version_of = version_of  # PoP -> the digest of the desired state it serves
        self._clock = clock
        self.replica = replica
        self._peers = peers
        self._nacks: deque[tuple[int, Nack]] = deque(maxlen=MAX_NACKS)
        self._events = 0  # streams opened or closed, ACKs and NACKs (`touch`)

    @property
    def generation(self) -> int:
        """Grows with every event that may change what `shared` says: a stream's (`touch`) or
        a PoP's output changing (the output cache's count of changes: read, never told)."""
        return self._events + self._cache.changes

    def touch(self, *_: object) -> None:
        """Something that may change a node's state happened: a stream opened or closed, an
        ACK or NACK came (the ADS observer's callbacks)."""
        self._events += 1

    def nacked(self, node: NodeEntry, nack: StreamNack) -> None:
        """A node refused a response (the ADS observer's NACK callback)."""
        self._nacks.append((self._clock(), Nack(
            pop=node.pop, node=escape(node.node_id), version=self._version_of(node.pop),
            envoy=escape(node.envoy_version), type_url=escape(nack.type_url),
            message=escape(nack.message), replica=self.replica)))
        self.touch()

    def nacks(self, since_ms: int) -> tuple[Nack, ...]:
        """The NACKs that came at or after `since_ms` (to any live replica), oldest first."""
        every = [*self._nacks, *(entry for _, shared in self._others()
                                 for entry in shared.nacks_read())]
        return tuple(nack for at, nack in sorted(every, key=lambda e: e[0]) if at >= since_ms)

    def nodes(self, pops: Iterable[str]) -> tuple[NodeAck, ...]:
        """Every connected node of `pops` (to any live replica) and the version it applied
        (None: not the one its PoP serves now, yet)."""
        acks = []
        others = self._others()
        for pop in pops:
            version = self._version_of(pop)
            acks.extend(NodeAck(pop, entry.node_id, version, self.replica,
                                round(entry.synced_at * 1000) or None)
                        if self._applied(pop, entry) else NodeAck(pop, entry.node_id, None,
                                                                  self.replica)
                        for entry in sorted(self._nodes.entries(pop), key=lambda e: e.node_id))
            for replica, shared in others:
                if shared.unreadable:  # fails closed: one node that has not applied it
                    acks.append(NodeAck(pop, f"the nodes on replica {replica}: "
                                        f"{shared.unreadable}", None, replica))
                    continue
                held = shared.pops.get(pop)
                if held is None:
                    continue
                acks.extend(NodeAck(pop, node, held.version if state == "applied" else None,
                                    replica) for node, state, _ in held.nodes)
                waiting = held.unlisted_waiting()
                if waiting:  # not listed (the size bound): still not applied
                    acks.append(NodeAck(pop, f"{waiting} more node(s) not applied", None,
                                        replica))
        return tuple(acks)

    def pop(self, pop: str) -> PopAcks:
        """`pop`'s nodes counted (on every live replica): applied its version, still pending,
        NACKed."""
        mine = self._local(pop)
        if not self.replica:
            return PopAcks(mine.version, mine.applied, mine.pending, mine.nacked)
        counts = [(self.replica, mine)]
        counts += [(replica, shared.pops[pop]) for replica, shared in self._others()
                   if pop in shared.pops]
        applied = pending = nacked = 0
        for _, held in counts:
            same = held.version == mine.version  # applied another version: not this one yet
            applied += held.applied if same else 0
            pending += held.pending + (0 if same else held.applied)
            nacked += held.nacked
        return PopAcks(mine.version, applied, pending, nacked,
                       tuple(sorted(counts, key=lambda c: c[0])))

    def shared(self) -> SharedAcks:
        """This replica's nodes and newest NACKs, as it shares them with the others."""
        budget = SHARED_NODE_BYTES
        pops: dict[str, SharedPop] = {}
        for pop, entries in sorted(self._nodes.by_pop().items()):  # one pass over the nodes
            states = sorted(((entry.node_id, self._state(pop, entry), entry.envoy_version)
                             for entry in entries),
                            key=lambda n: (n[1] == "applied", n[0]))
            listed = []
            for node in states:
                cost = len(node[0]) + len(node[2]) + 24  # the JSON around them
                if cost > budget:
                    break
                budget -= cost
                listed.append(node)
            counts = {state: sum(1 for _, s, _ in states if s == state) for state in NODE_STATES}
            pops[pop] = SharedPop(self._version_of(pop), tuple(listed), counts["applied"],
                                  counts["pending"], counts["nacked"])
        return SharedAcks(pops, tuple(list(self._nacks)[-SHARED_NACKS:]))

    def _others(self) -> list[tuple[str, SharedAcks]]:
        return sorted(((replica, shared) for replica, shared in self._peers().items()
                       if replica != self.replica), key=lambda peer: peer[0])

    def _local(self, pop: str) -> SharedPop:
        counts = dict.fromkeys(NODE_STATES, 0)
        for entry in self._nodes.entries(pop):
            counts[self._state(pop, entry)] += 1
        return SharedPop(self._version_of(pop), (), counts["applied"], counts["pending"],
                         counts["nacked"])

    def _state(self, pop: str, entry: NodeEntry) -> NodeState:
        if self._applied(pop, entry):
            return "applied"
        return "nacked" if entry.overall == "NACKED" else "pending"

    def _applied(self, pop: str, entry: NodeEntry) -> bool:
        return entry.applied(self._cache.entry(pop, entry.capability_key))
