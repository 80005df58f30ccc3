"""What Ballast does with the ADS server's callbacks: decision records and its own metrics.

Records: `node_connected`, `node_disconnected`, `node_refused`, `node_superseded`,
`secrets_refused`, `capability_fallback` and `nack`, each handed to
`record(kind, fields)`; a NACK repeating the last one of its stream and (type, version) is only
counted (`repeated_nacks` in the stream's `node_disconnected`). A node's `capability_fallback`
is recorded when it differs from the last one recorded for that node id (PoP, capabilities,
reason, notes; the last `FALLBACKS_KEPT` node ids remembered): a node reconnecting to the same
fallback is counted (`ballast_capability_fallbacks`), its `node_connected` names its
capabilities. Its notes are grouped: what is said of many clusters is said once, naming a few.
Metrics: connected nodes per PoP, responses and bytes sent, ACKs and NACKs per type, fallbacks
served per PoP, and the seconds from a response to the ACK that answers it (the latest response
of that type on that stream; an answer to an older one is not timed).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from control_plane.ads.callbacks import Callbacks
from control_plane.ads.nodes import NodeEntry
from control_plane.ads.protocol import Ack, DeltaResponse, Nack, SotwResponse, short_name
from control_plane.own_metrics.registry import BallastMetrics

Record = Callable[[str, dict[str, Any]], None]
FALLBACKS_KEPT = 10_000  # node ids whose last recorded fallback is remembered (oldest forgotten)
SUBJECTS_SHOWN = 3  # of the clusters (listeners, services) a grouped note is said of


def grouped_notes(notes: Sequence[str], shown: int = SUBJECTS_SHOWN) -> list[str]:
    """Notes ("subject: what") that say the same of several subjects as one, naming the first
    `shown` of them and how many more ("g000.critical, g000.normal, g001.critical and 37 more:
    adaptive_lifo requested, ..."); a note said of one subject stays as it is."""
    said: dict[str, list[str]] = {}
    for note in notes:
        subject, colon, what = note.partition(": ")
        said.setdefault(what if colon else note, []).append(subject if colon else "")
    grouped = []
    for what, subjects in said.items():
        named = ", ".join(s for s in subjects[:shown] if s)
        more = f" and {len(subjects) - shown} more" if len(subjects) > shown else ""
        grouped.append(f"{named}{more}: {what}" if named else what)
    return grouped


class AdsObserver(Callbacks):
    def __init__(
        self,
        *,
        record: Record | None = None,
        metrics: BallastMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        nacked: Callable[[NodeEntry, Nack], None] | None = None,
        answered: Callable[[], None] | None = None,
    ) -> None:
        self._record = record
        self._nacked = nacked  # every NACK, repeats too (a rollout's gates: `config_acks.py`)
        self._answered = answered  # a stream opened or closed, an ACK came (`config_acks.py`)
        self.metrics = metrics
        self._monotonic = monotonic
        # (stream, type_url) -> (nonce, monotonic time) of the last response not yet answered
        self._pushed: dict[tuple[int, str], tuple[str, float]] = {}
        # hash of a node id -> hash of its last recorded fallback (at most FALLBACKS_KEPT)
        self._fallbacks: OrderedDict[int, int] = OrderedDict()

    def on_stream_open(self, node: NodeEntry) -> None:
        self._touch()
        if self.metrics is not None:
            self.metrics.connected_nodes.labels(node.pop).inc()
        self._emit("node_connected", node=node.node_id, pop=node.pop, mode=node.mode,
                   envoy_version=node.envoy_version, capabilities=node.capability_key,
                   capability_reason=node.capability_reason)

    def on_stream_closed(self, node: NodeEntry, status: str, details: str) -> None:
        self._touch()
        if self.metrics is not None:
            self.metrics.connected_nodes.labels(node.pop).dec()
        for key in [key for key in self._pushed if key[0] == node.stream]:
            del self._pushed[key]
        extra = {"repeated_nacks": dict(node.repeated_nacks)} if node.repeated_nacks else {}
        self._emit("node_disconnected", node=node.node_id, pop=node.pop, mode=node.mode,
                   status=status, details=details, **extra)

    def on_stream_refused(self, node_id: str, pop: str, reason: str) -> None:
        self._emit("node_refused", node=node_id, pop=pop, reason=reason)

    def on_stream_superseded(self, older: NodeEntry, newer: NodeEntry) -> None:
        self._emit("node_superseded", node=newer.node_id, pop=newer.pop,
                   stream=newer.stream, closed_stream=older.stream, closed_pop=older.pop)

    def on_response(
        self, node: NodeEntry, response: SotwResponse | DeltaResponse, size: int
    ) -> None:
        if self.metrics is None:
            return
        kind = short_name(response.type_url)
        self.metrics.pushes.labels(kind).inc()
        self.metrics.push_bytes.labels(kind).inc(size)
        self._pushed[(node.stream, response.type_url)] = (response.nonce, self._monotonic())

    def on_ack(self, node: NodeEntry, ack: Ack) -> None:
        self._touch()
        self._count_answer(node, ack)

    def on_nack(self, node: NodeEntry, nack: Nack) -> None:
        self._count_answer(node, nack)
        if self._nacked is not None:
            self._nacked(node, nack)
        if node.nack_count(nack.type_url) > 1:
            return  # counted in node.repeated_nacks, recorded with the disconnect
        self._emit("nack", node=node.node_id, pop=node.pop, type=short_name(nack.type_url),
                   version=nack.version, message=nack.message)

    def on_secrets_refused(self, node: NodeEntry, names: list[str], reason: str) -> None:
        self._emit("secrets_refused", node=node.node_id, pop=node.pop, secrets=names,
                   reason=reason)

    def on_capability_fallback(
        self, node: NodeEntry, capability_key: str, version: str, notes: tuple[str, ...]
    ) -> None:
        if self.metrics is not None:
            self.metrics.capability_fallbacks.labels(node.pop).inc()
        said = hash((node.pop, capability_key, node.capability_reason, notes))
        known = hash(node.node_id)
        last = self._fallbacks.get(known)
        self._fallbacks[known] = said
        self._fallbacks.move_to_end(known)
        if len(self._fallbacks) > FALLBACKS_KEPT:
            self._fallbacks.popitem(last=False)
        if last == said:
            return  # recorded before for this node: not news (counted above)
        self._emit("capability_fallback", node=node.node_id, pop=node.pop,
                   capabilities=capability_key, reason=node.capability_reason, version=version,
                   notes=grouped_notes(notes), notes_total=len(notes))

    def _count_answer(self, node: NodeEntry, event: Ack | Nack) -> None:
        """ACK/NACK counters; push-to-ACK seconds when the ACK answers the latest push."""
        if self.metrics is None:
            return
        kind = short_name(event.type_url)
        pushed = self._pushed.get((node.stream, event.type_url))
        if pushed is not None and pushed[0] == event.nonce:
            del self._pushed[(node.stream, event.type_url)]
            if isinstance(event, Ack):
                self.metrics.convergence.labels(kind).observe(self._monotonic() - pushed[1])
        if isinstance(event, Ack):
            self.metrics.acks.labels(kind).inc()
        else:
            self.metrics.nacks.labels(kind).inc()

    def _touch(self) -> None:
        if self._answered is not None:
            self._answered()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._record is not None:
            self._record(kind, fields)
