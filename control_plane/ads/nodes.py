"""Registry of connected nodes: who is connected, what it was sent, what it ACKed or rejected.

Plain data out (`statuses()`), for the admin API and the tests. Status per type: SYNCED when the
last response sent was ACKed, NACKED when it was rejected, STALE while it awaits an answer.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from control_plane.ads.protocol import short_name
from control_plane.translate.resources import PopResources

Status = Literal["SYNCED", "STALE", "NACKED"]


@dataclass(frozen=True, slots=True)
class Rejection:
    version: str
    message: str
    at: float  # unix time of the latest NACK of this version
    count: int = 1  # NACKs of this version in a row (only the first is recorded)


@dataclass(frozen=True)
class TypeStatus:
    type: str  # CDS, EDS, LDS, RDS
    last_sent: str | None
    last_acked: str | None
    last_nack: Rejection | None
    sends: int
    status: Status


@dataclass(frozen=True)
class NodeStatus:
    stream: int
    node_id: str
    pop: str
    mode: Literal["sotw", "delta"]
    envoy_version: str
    connected_since: float  # unix time
    capability_key: str
    capability_reason: str
    status: Status
    types: tuple[TypeStatus, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "node_id": self.node_id,
            "pop": self.pop,
            "mode": self.mode,
            "envoy_version": self.envoy_version,
            "connected_since": self.connected_since,
            "capability_key": self.capability_key,
            "capability_reason": self.capability_reason,
            "status": self.status,
            "types": {
                t.type: {
                    "last_sent": t.last_sent,
                    "last_acked": t.last_acked,
                    "last_nack": None
                    if t.last_nack is None
                    else {
                        "version": t.last_nack.version,
                        "message": t.last_nack.message,
                        "at": t.last_nack.at,
                        "count": t.last_nack.count,
                    },
                    "sends": t.sends,
                    "status": t.status,
                }
                for t in self.types
            },
        }


@dataclass(slots=True)
class _TypeRecord:
    last_sent: str | None = None
    last_acked: str | None = None
    last_nack: Rejection | None = None
    outcome: Status = "STALE"
    sends: int = 0


@dataclass(slots=True)
class NodeEntry:
    stream: int
    node_id: str
    pop: str
    mode: Literal["sotw", "delta"]
    envoy_version: str
    connected_since: float
    capability_key: str
    capability_reason: str
    types: dict[str, _TypeRecord] = field(default_factory=dict)
    fallback_version: str | None = None  # CDS version whose capability fallback was reported
    repeated_nacks: dict[str, int] = field(default_factory=dict)  # type -> NACKs after the first
    secrets_refused: str | None = None  # why its SDS requests go unanswered (not mTLS)
    # the PoP output the stream last answered from (a push or a request): with every type
    # SYNCED, the node has applied it (`applied`)
    answered_from: PopResources | None = None
    synced_at: float = 0.0  # unix time of the ACK that made every type SYNCED (0: never)

    def _record(self, type_url: str) -> _TypeRecord:
        record = self.types.get(type_url)
        if record is None:
            record = self.types[type_url] = _TypeRecord()
        return record

    def sent(self, type_url: str, version: str) -> None:
        record = self._record(type_url)
        record.last_sent = version
        record.sends += 1
        record.outcome = "STALE"

    def acked(self, type_url: str, version: str) -> None:
        record = self._record(type_url)
        record.last_acked = version
        if version == record.last_sent and record.outcome != "SYNCED":
            record.outcome = "SYNCED"
            if self.overall == "SYNCED":  # when the node applied what it was last sent
                self.synced_at = time.time()

    def nacked(self, type_url: str, version: str, message: str) -> int:
        """Note a NACK; how many NACKs of this version came in a row (1: a new one)."""
        record = self._record(type_url)
        previous = record.last_nack
        count = previous.count + 1 if previous is not None and previous.version == version else 1
        record.last_nack = Rejection(version, message, time.time(), count)
        if count > 1:
            kind = short_name(type_url)
            self.repeated_nacks[kind] = self.repeated_nacks.get(kind, 0) + 1
        if version == record.last_sent:
            record.outcome = "NACKED"
        return count

    def applied(self, current: PopResources | None) -> bool:
        """Whether the node ACKed everything `current` (its PoP's current output) holds: the
        stream last answered from it and every type's last response was ACKed."""
        return (current is not None and self.answered_from is current
                and self.overall == "SYNCED")

    def nack_count(self, type_url: str) -> int:
        """NACKs in a row of the latest NACKed version of `type_url` (0: none)."""
        record = self.types.get(type_url)
        return 0 if record is None or record.last_nack is None else record.last_nack.count

    def status(self) -> NodeStatus:
        types = tuple(
            TypeStatus(
                type=short_name(type_url),
                last_sent=r.last_sent,
                last_acked=r.last_acked,
                last_nack=r.last_nack,
                sends=r.sends,
                status=r.outcome,
            )
            for type_url, r in self.types.items()
        )
        return NodeStatus(
            stream=self.stream,
            node_id=self.node_id,
            pop=self.pop,
            mode=self.mode,
            envoy_version=self.envoy_version,
            connected_since=self.connected_since,
            capability_key=self.capability_key,
            capability_reason=self.capability_reason,
            status=self.overall,
            types=types,
        )

    @property
    def overall(self) -> Status:
        """NACKED if any type is, else STALE if any awaits an answer, else SYNCED."""
        outcomes = [r.outcome for r in self.types.values()]
        return "NACKED" if "NACKED" in outcomes else "STALE" if "STALE" in outcomes else "SYNCED"


def _by_node_id(entry: NodeEntry) -> tuple[str, int]:
    return entry.node_id, entry.stream


@dataclass(frozen=True)
class PopCensus:
    """One PoP's connected streams, counted without building every node's status."""

    by_status_version: Counter[tuple[Status, str]]  # (status, Envoy version) -> streams
    listed: list[NodeStatus]  # the first ones by node id
    nacked: list[NodeStatus]  # the first NACKED ones by node id


class NodeRegistry:
    def __init__(self) -> None:
        self._entries: dict[int, NodeEntry] = {}
        self._ids = itertools.count(1)

    def connect(
        self,
        *,
        node_id: str,
        pop: str,
        mode: Literal["sotw", "delta"],
        envoy_version: str,
        capability_key: str,
        capability_reason: str,
    ) -> NodeEntry:
        entry = NodeEntry(
            stream=next(self._ids),
            node_id=node_id,
            pop=pop,
            mode=mode,
            envoy_version=envoy_version,
            connected_since=time.time(),
            capability_key=capability_key,
            capability_reason=capability_reason,
        )
        self._entries[entry.stream] = entry
        return entry

    def disconnect(self, entry: NodeEntry) -> None:
        self._entries.pop(entry.stream, None)

    def __len__(self) -> int:
        return len(self._entries)

    def statuses(self, pop: str | None = None) -> list[NodeStatus]:
        """Every stream's status, or only those of `pop`."""
        return [e.status() for e in self._entries.values() if pop is None or e.pop == pop]

    def census(self, listed: int, nacked: int) -> dict[str, PopCensus]:
        """Per PoP: streams by (status, version), and the statuses of the first `listed` and of
        the first `nacked` NACKED streams by node id. Costs a pass over the entries, not a
        status object per node (the dashboard's overview of a large fleet)."""
        by_pop: dict[str, list[NodeEntry]] = {}
        for entry in self._entries.values():
            by_pop.setdefault(entry.pop, []).append(entry)
        census = {}
        for pop, entries in by_pop.items():
            overall = [(entry, entry.overall) for entry in entries]
            census[pop] = PopCensus(
                by_status_version=Counter((status, e.envoy_version) for e, status in overall),
                listed=[e.status() for e in heapq.nsmallest(listed, entries, key=_by_node_id)],
                nacked=[e.status() for e in heapq.nsmallest(
                    nacked, (e for e, status in overall if status == "NACKED"), key=_by_node_id)],
            )
        return census

    def pops(self) -> set[str]:
        """The PoPs with a stream connected."""
        return {e.pop for e in self._entries.values()}

    def by_pop(self) -> dict[str, list[NodeEntry]]:
        """Every live entry grouped by its PoP, in one pass (read, never kept)."""
        grouped: dict[str, list[NodeEntry]] = {}
        for entry in self._entries.values():
            grouped.setdefault(entry.pop, []).append(entry)
        return grouped

    def entries(self, pop: str) -> Iterator[NodeEntry]:
        """The live entries of `pop`'s streams (read, never kept: the registry owns them)."""
        return (e for e in self._entries.values() if e.pop == pop)

    def by_node(self, node_id: str) -> list[NodeStatus]:
        return [e.status() for e in self._entries.values() if e.node_id == node_id]
