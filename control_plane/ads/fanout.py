"""Per-PoP push notification with debounce: a burst of changes becomes one push per stream.

The snapshot cache calls `changed(pops)`; the hub waits until no change arrived for `quiet`
seconds (but never longer than `max_delay` after the first change of the burst), then wakes the
streams of exactly those PoPs. Streams re-read the cache when woken, so they always push the
newest snapshot, whatever happened in between. Time comes from the injected `Timer` (the event
loop's by default; tests give a fake clock).
"""

from __future__ import annotations

import asyncio
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


class PushHub:
    def __init__(
        self, *, quiet: float = 0.1, max_delay: float = 1.0, timer: Timer | None = None
    ) -> None:
        self.quiet = quiet
        self.max_delay = max_delay
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._wakers: dict[str, set[Waker]] = {}
        self._pending: set[str] = set()
        self._first: float | None = None
        self._handle: Cancellable | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.flushes = 0  # bursts delivered (tests, metrics)

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
        """Wake the pending PoPs' streams now."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        pops, self._pending, self._first = self._pending, set(), None
        if not pops:
            return
        self.flushes += 1
        for pop in pops:
            for waker in list(self._wakers.get(pop, ())):
                waker()

