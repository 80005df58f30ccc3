"""What one replica shares of its nodes with the others through etcd (`SharedAcks`), and its
parser: the wire format of `config_acks.py`'s replicas.

**Replicas** (etcd): an Envoy streams from one replica, so each replica knows only its own
nodes. Each one shares them (`ConfigAcks.shared`, a `SharedAcks`: per PoP the version it serves
there, every node's state — applied, pending, NACKed — and Envoy build, with the PoP's counts;
its newest `SHARED_NACKS` NACKs) under its own key in etcd, bound to its session's lease
(`replicas/replication.py` publishes it when it changes, and reads the others'), and `ConfigAcks`'
`nodes`, `nacks` and `pop` answer for the nodes of every live replica: the leader's gates hear
a node whichever replica it is connected to. A peer's node counts as applied only when that
replica serves the PoP the same version as this one. The shared value is bounded
(`config_acks.SHARED_NODE_BYTES` of listed nodes, the ones not applied listed first; the counts
always whole).

A peer's value is outside input, read by `SharedAcks.parse` alone: its size is bounded before it
is parsed, every field after, and whatever is wrong with it is a `ValueError` (the mirror that
reads it goes on). The gates **fail closed** on what they cannot read: a live replica whose
value is unreadable, or that shares none, stands in every PoP as one node that has not applied
the version (`unreadable`), so a wave waits for it and fails at its ACK timeout rather than
passing without that replica's nodes. At most `MAX_PEERS` other replicas are read. A peer's NACK
is dated when this replica first read it (`received`), not by the peer's clock: a peer whose
clock is behind cannot date a NACK before the rollout started and so hide it from the gates.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from control_plane.ads.limits import clip
from control_plane.decide.gates import Nack
from control_plane.security.terminal import escape

SHARED_NACKS = 32  # the newest NACKs a replica shares (a gate fails on the first it reads)
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
