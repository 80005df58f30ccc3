"""`ConfigAcks`: which nodes of a PoP applied the desired-state version it serves, and which
refused one — read from the ADS streams (SotW and delta alike), for a rollout's gates and the
faces (`ballast status`, `/rollout`).

A node has applied its PoP's version when its stream last answered from the PoP's current
output and every type's last response was ACKed (`NodeEntry.applied`): a PoP's output changes
when its wave starts (or a weight shifts), the stream is pushed, and the node's ACKs follow. A
NACK is kept with the version (digest) its PoP served when it came, the node's Envoy build and
the message (the last `MAX_NACKS`, oldest dropped: a storm of NACKs holds bounded memory).

**Replicas** (etcd): an Envoy streams from one replica, so each replica knows only its own
nodes. Each one shares them (`shared()`, a `SharedAcks`: per PoP the version it serves there,
every node's state — applied, pending, NACKed — and Envoy build, with the PoP's counts; its
newest `SHARED_NACKS` NACKs) under its own key in etcd, bound to its session's lease
(`app/replication.py` publishes it when it changes, and reads the others'), and `nodes`,
`nacks` and `pop` answer for the nodes of every live replica: the leader's gates hear a node
whichever replica it is connected to. A peer's node counts as applied only when that replica
serves the PoP the same version as this one. The shared value is bounded (`SHARED_NODE_BYTES`
of listed nodes, the ones not applied listed first; the counts always whole).

A peer's value is outside input, read by `SharedAcks.parse` alone: its size is bounded before it
is parsed, every field after, and whatever is wrong with it is a `ValueError` (the mirror that
reads it goes on). The gates **fail closed** on what they cannot read: a live replica whose
value is unreadable, or that shares none, stands in every PoP as one node that has not applied
the version (`unreadable`), so a wave waits for it and fails at its ACK timeout rather than
passing without that replica's nodes. At most `MAX_PEERS` other replicas are read. A peer's NACK
is dated when this replica first read it (`received`), not by the peer's clock: a peer whose
clock is behind cannot date a NACK before the rollout started and so hide it from the gates.

A NACK's node id, Envoy build, type and message are a node's text: they are escaped
(`security/terminal.py`) as they become a gate's input, so the readings and the rollout's
reason that quote them (records, `ballast rollout status`) hold no control characters.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from control_plane.ads.limits import clip
from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Nack as StreamNack
from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.gates import Nack, NodeAck
from control_plane.observe.source import wall_ms
from control_plane.security.terminal import escape

MAX_NACKS = 1000
SHARED_NACKS = 32  # the newest NACKs a replica shares (a gate fails on the first it reads)
# listed nodes a replica shares: etcd refuses a request over 1.5 MiB by default; a node id is
# at most 1024 characters (`AdsLimits`), a typical one a few dozen: thousands of nodes fit
SHARED_NODE_BYTES = 512 * 1024
MAX_SHARED_NODES = 50_000  # listed nodes read from a peer's value (more: refused)
MAX_SHARED_POPS = 10_000
# a peer's whole value, refused unparsed when larger (etcd's own request limit is 1.5 MiB)
MAX_SHARED_BYTES = 2 * 1024 * 1024
MAX_PEERS = 64  # other replicas read (`acks/<id>` keys beyond: ignored)
# a peer's NACK message: what `ads` keeps of one (`AdsLimits.message_chars`) passes whole;
# longer is clipped to its start and its end (Envoy gives the reason last)
MAX_PEER_MESSAGE_CHARS = 4096
MAX_MS = 2**53  # a time in ms: an integer JSON keeps exact
MAX_NODE_CHARS = 1024
MAX_TEXT_CHARS = 256  # an Envoy build, a version digest, a replica id
MAX_TYPE_URL_CHARS = 512
NodeState = Literal["applied", "pending", "nacked"]
NODE_STATES: tuple[NodeState, ...] = ("applied", "pending", "nacked")


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


@dataclass(frozen=True)
class SharedPop:
    """One replica's nodes of one PoP: the version it serves there, its nodes listed (node id,
    state, Envoy build; those not applied first, as many as the size allows) and all of them
    counted."""

    version: str
    nodes: tuple[tuple[str, NodeState, str], ...]
    applied: int
    pending: int
    nacked: int

    def unlisted_waiting(self) -> int:
        """Nodes not applied that the list left out (it lists those first)."""
        listed = sum(1 for _, state, _ in self.nodes if state != "applied")
        return max(0, self.pending + self.nacked - listed)


@dataclass(frozen=True)
class SharedAcks:
    """What one replica shares of its nodes with the others (see the module docstring)."""

    pops: Mapping[str, SharedPop]
    nacks: tuple[tuple[int, Nack], ...]  # (wall ms on the sharing replica, NACK), oldest first
    # when this replica first read each NACK (wall ms on its own clock; `received`)
    read_ms: tuple[int, ...] = ()
    unreadable: str = ""  # why this replica cannot tell that peer's nodes (then nothing else)

    @classmethod
    def unknown(cls, why: str) -> SharedAcks:
        """A live peer whose nodes cannot be told (see the module docstring)."""
        return cls({}, (), unreadable=why)

    @classmethod
    def parse(cls, replica: str, raw: bytes) -> SharedAcks:
        """A peer's value as etcd holds it, read back bounded; ValueError when it is not one."""
        if len(raw) > MAX_SHARED_BYTES:
            raise ValueError(f"{len(raw):,} bytes; the limit is {MAX_SHARED_BYTES:,}")
        try:
            return cls.from_json(replica, json.loads(raw))
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as err:
            raise ValueError(f"{type(err).__name__}: {clip(str(err), 200)}") from err

    def received(self, before: SharedAcks | None, now_ms: int) -> SharedAcks:
        """This value as read at `now_ms`: a NACK `before` held keeps the time it was first
        read, a new one is dated `now_ms`."""
        known = dict(zip(before.nacks, before.read_ms, strict=True)) if before else {}
        return dataclasses.replace(
            self, read_ms=tuple(known.get(entry, now_ms) for entry in self.nacks))

    def nacks_read(self) -> list[tuple[int, Nack]]:
        """(when this replica first read it, NACK): the peer's own time until `received`."""
        if len(self.read_ms) != len(self.nacks):
            return list(self.nacks)
        return [(at, nack) for at, (_, nack) in zip(self.read_ms, self.nacks, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            "pops": {pop: {"version": shared.version, "nodes": [list(n) for n in shared.nodes],
                           "applied": shared.applied, "pending": shared.pending,
                           "nacked": shared.nacked}
                     for pop, shared in sorted(self.pops.items())},
            "nacks": [{"at_ms": at, "pop": n.pop, "node": n.node, "version": n.version,
                       "envoy": n.envoy, "type_url": n.type_url, "message": n.message}
                      for at, n in self.nacks],
        }

    @classmethod
    def from_json(cls, replica: str, data: Any) -> SharedAcks:
        """A peer's value, parsed, read back with every field bounded; ValueError (or KeyError,
        TypeError, OverflowError) when it is not one (`parse` turns them all into ValueError)."""
        if not isinstance(data, dict) or not isinstance(data["pops"], dict):
            raise ValueError("not the shared ACKs of a replica")
        if len(data["pops"]) > MAX_SHARED_POPS or len(data["nacks"]) > SHARED_NACKS:
            raise ValueError("more PoPs or NACKs than a replica shares")
        pops: dict[str, SharedPop] = {}
        listed = 0
        for pop, value in data["pops"].items():
            nodes = []
            for node, state, envoy in value["nodes"]:
                if state not in NODE_STATES:
                    raise ValueError(f"node state {state!r}")
                nodes.append((_text(node, MAX_NODE_CHARS), state, _text(envoy, MAX_TEXT_CHARS)))
            listed += len(nodes)
            if listed > MAX_SHARED_NODES:
                raise ValueError(f"more than {MAX_SHARED_NODES} nodes listed")
            pops[_text(pop, MAX_TEXT_CHARS)] = SharedPop(
                _text(value["version"], MAX_TEXT_CHARS), tuple(nodes), _count(value["applied"]),
                _count(value["pending"]), _count(value["nacked"]))
        nacks = tuple(
            (_ms(n["at_ms"]), Nack(
                pop=_text(n["pop"], MAX_TEXT_CHARS),
                node=escape(_text(n["node"], MAX_NODE_CHARS)),
                version=_text(n["version"], MAX_TEXT_CHARS),
                envoy=escape(_text(n["envoy"], MAX_TEXT_CHARS)),
                type_url=escape(_text(n["type_url"], MAX_TYPE_URL_CHARS)),
                message=escape(_message(n["message"])), replica=escape(replica)))
            for n in data["nacks"])
        return cls(pops, nacks)


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value[:limit]


def _message(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return clip(value, MAX_PEER_MESSAGE_CHARS, tail=MAX_PEER_MESSAGE_CHARS // 2)


def _ms(value: Any) -> int:
    if not isinstance(value, int) or not 0 <= value < MAX_MS:
        raise ValueError(f"{value!r} is not a time in ms")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


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
