"""Per-PoP push notification with debounce: a burst of changes becomes one push per stream.

The snapshot cache calls `changed(pops)`; the hub waits until no change arrived for `quiet`
seconds (but never longer than `max_delay` after the first change of the burst), then wakes the
streams of exactly those PoPs. Streams re-read the cache when woken, so they always push the
newest snapshot, whatever happened in between. Time comes from the injected `Timer` (the event
loop's by default; tests give a fake clock).

Waking is sliced: a woken stream computes and starts writing its push in the next turn of the
event loop, and asyncio runs every callback that is ready in one turn, so 10,000 streams woken
at once held the loop 2 s (nothing else ran meanwhile: `/healthz`, new nodes' first responses,
the reconcile tick, ACKs). The hub wakes a slice of the due streams per loop turn instead, sized
so that a turn takes about `turn_s`: the time from the start of one slice to the start of the
next is that turn (the slice, the woken streams' pushes, the ACKs and writes of earlier slices,
whatever else was ready), and the next slice is `turn_s` divided by that turn's cost per stream
woken. A stream
that unsubscribed before its turn is skipped; one due twice is woken once. (grpc.aio writes only
from the loop's thread, so the writes cannot leave the loop.)
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

Waker = Callable[[], None]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    """A clock the hub reads and schedules its flush on."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...


class LoopTimer:
    """The running event loop's clock."""

    def time(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_at(when, callback)


TURN_S = 0.01  # the loop turn a slice of woken streams aims at
FIRST_SLICE = 64  # streams woken in a change's first turn (later: from the turns measured)
MIN_SLICE = 8  # however costly a push, a turn wakes at least these


class PushHub:
    def __init__(
        self, *, quiet: float = 0.1, max_delay: float = 1.0, timer: Timer | None = None,
        turn_s: float = TURN_S,
    ) -> None:
        self.quiet = quiet
        self.max_delay = max_delay
        self.turn_s = turn_s
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._wakers: dict[str, set[Waker]] = {}
        self._pending: set[str] = set()
        self._first: float | None = None
        self._handle: Cancellable | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: deque[tuple[str, Waker]] = deque()  # streams to wake, in order
        self._queued: set[Waker] = set()  # the wakers in `_due`
        self._draining = False  # a slice is scheduled
        self._slice = FIRST_SLICE
        self._woken_last = 0  # streams the last slice woke
        self._slice_start = 0.0  # when it started (time.perf_counter)
        self.flushes = 0  # bursts delivered (tests, metrics)
        self.turns = 0  # loop turns that woke streams (tests, metrics)

    def subscribe(self, pop: str, waker: Waker) -> None:
        """Call `waker()` when `pop` changed, until `unsubscribe(pop, waker)` (on the loop)."""
        self._loop = asyncio.get_running_loop()
        self._wakers.setdefault(pop, set()).add(waker)

    def unsubscribe(self, pop: str, waker: Waker) -> None:
        """`waker` (or one equal to it, e.g. the same bound method) is no longer called."""
        wakers = self._wakers.get(pop)
        if wakers is not None:
            wakers.discard(waker)
            if not wakers:
                del self._wakers[pop]

    def streams(self, pop: str) -> int:
        return len(self._wakers.get(pop, ()))

    def changed(self, pops: Iterable[str]) -> None:
        """Note changed PoPs. Safe from any thread: the flush runs on the streams' loop."""
        loop = self._loop
        if loop is None:
            return  # no stream ever subscribed: nobody to wake
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            loop.call_soon_threadsafe(self.changed, frozenset(pops))
            return
        self._pending.update(pops)
        if not self._pending:
            return
        now = self._timer.time()
        if self._first is None:
            self._first = now
        deadline = min(now + self.quiet, self._first + self.max_delay)
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._timer.call_at(deadline, self.flush)

    def flush(self) -> None:
        """Wake the pending PoPs' streams: the first slice now, the others in the loop turns
        that follow."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        pops, self._pending, self._first = self._pending, set(), None
        if not pops:
            return
        self.flushes += 1
        for pop in sorted(pops):
            for waker in self._wakers.get(pop, ()):
                if waker not in self._queued:
                    self._queued.add(waker)
                    self._due.append((pop, waker))
        if not self._draining:
            self._woken_last = 0
            self._wake_slice()

    def waking(self) -> int:
        """Streams due to be woken in the coming loop turns."""
        return len(self._due)

    def _wake_slice(self) -> None:
        """Wake the next slice of due streams; schedule the rest for the next loop turn."""
        started = time.perf_counter()
        if self._woken_last:  # the turn since the last slice: what waking that many cost
            per_stream = (started - self._slice_start) / self._woken_last
            self._slice = max(MIN_SLICE, round(self.turn_s / max(per_stream, 1e-7)))
        woken = 0
        while self._due and woken < self._slice:
            pop, waker = self._due.popleft()
            self._queued.discard(waker)
            if waker in self._wakers.get(pop, ()):  # still subscribed
                waker()
                woken += 1
        self.turns += 1
        self._woken_last = woken
        self._slice_start = started
        self._draining = bool(self._due)
        if self._draining:
            assert self._loop is not None
            self._loop.call_soon(self._wake_slice)

