"""New decision records, fanned out to live streams (the dashboard's server-sent events).

The decision log calls ``publish`` after each record it writes. Each subscriber gets a bounded
queue of the records matching its filter; one that falls ``queue_size`` records behind is marked
lagging and closed, and its client reconnects with the last seq it saw (``Last-Event-ID``), which
is replayed from a short ring of recent records. Nobody polls the log.

It also remembers the newest record of each kind in ``REMEMBERED_KINDS`` (the last
``config_applied`` / ``config_rejected``), so a page can show them without searching the log.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field

from control_plane.decisions.read import Query, Record

REMEMBERED_KINDS = ("config_applied", "config_rejected")
DEFAULT_RING = 2000
DEFAULT_QUEUE = 1000
DEFAULT_MAX_SUBSCRIBERS = 64


class TooManySubscribers(RuntimeError):
    """Every live-stream slot is taken."""


@dataclass(eq=False)
class Subscription:
    query: Query
    backlog: list[Record]
    gap: bool  # records between the client's last seq and the ring's oldest are not replayed
    queue: asyncio.Queue[Record | None]
    lagging: bool = False
    closed: bool = field(default=False)

    def offer(self, record: Record) -> None:
        if self.closed or not self.query.matches(record):
            return
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            self.lagging = True
            self.close()

    def close(self) -> None:
        """Wake the reader with the end-of-stream marker (room is kept for it)."""
        if not self.closed:
            self.closed = True
            if self.queue.full():
                self.queue.get_nowait()
            self.queue.put_nowait(None)


class DecisionFeed:
    def __init__(
        self,
        ring: int = DEFAULT_RING,
        queue_size: int = DEFAULT_QUEUE,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
    ) -> None:
        self._ring: deque[Record] = deque(maxlen=ring)
        self._queue_size = queue_size
        self._max_subscribers = max_subscribers
        self._subscribers: set[Subscription] = set()
        self._latest: dict[str, Record] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliveries happen on this loop; ``publish`` from other threads hops onto it."""
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def publish(self, record: Record) -> None:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self._deliver(record)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, record)

    def _deliver(self, record: Record) -> None:
        self._ring.append(record)
        if record.get("kind") in REMEMBERED_KINDS:
            self._latest[record["kind"]] = record
        for subscription in list(self._subscribers):
            subscription.offer(record)

    def latest(self, kind: str) -> Record | None:
        return self._latest.get(kind)

    def remember(self, record: Record) -> None:
        """A record found in the log, kept unless a newer one of its kind was published."""
        kind = record["kind"]
        known = self._latest.get(kind)
        if known is None or known["seq"] < record["seq"]:
            self._latest[kind] = record

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self, query: Query, after_seq: int = 0) -> Subscription:
        """A live subscription of records from now on; with ``after_seq`` (a reconnecting
        client's last seen), the records after it still in the ring come first."""
        if len(self._subscribers) >= self._max_subscribers:
            raise TooManySubscribers(
                f"{self._max_subscribers} live streams already open; close one and retry"
            )
        backlog = [r for r in self._ring if r["seq"] > after_seq and query.matches(r)
                   ] if after_seq else []
        gap = bool(after_seq) and bool(self._ring) and self._ring[0]["seq"] > after_seq + 1
        subscription = Subscription(query, backlog, gap, asyncio.Queue(self._queue_size + 1))
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
        subscription.close()

    def close_all(self) -> None:
        for subscription in list(self._subscribers):
            self.unsubscribe(subscription)
