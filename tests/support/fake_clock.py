"""A clock that moves only when a test says so: `time`/`call_at` (the push hub's timer) and
`sleep` (the desired-file watcher's), on the running event loop.

`await clock.advance(seconds)` fires every timer and wakes every sleeper that falls due, in
time order, letting the woken tasks run after each, and then leaves the clock at the target.
`await clock.idle()` lets woken tasks finish what they do (threads too) until they wait again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from harness.eventually import eventually

SETTLE_ROUNDS = 50  # loop turns after each wake-up: enough for a woken task's chain of awaits


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, FakeHandle, Callable[[], None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle()
        heapq.heappush(self._timers, (when, next(self._order), handle, callback))
        return handle

    async def sleep(self, seconds: float) -> None:
        woken = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        handle = self.call_at(self._now + seconds, wake)
        try:
            await woken
        finally:
            handle.cancel()  # a sleeper cancelled (or woken) is no longer waited for

    def waiting(self) -> int:
        """How many timers and sleepers are due some time."""
        return sum(1 for _, _, handle, _ in self._timers if not handle.cancelled)

    async def idle(self, waiting: int = 1, timeout_s: float = 10.0) -> None:
        """Let the loop run (no fake time passes) until `waiting` timers or sleepers are due:
        a task that was woken has done its work (threads included) and waits again."""
        await eventually(lambda: self.waiting() >= waiting, timeout_s,
                         "a woken task waits again", interval=0)

    async def advance(self, seconds: float) -> None:
        target = self._now + seconds
        await settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, handle, callback = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            if not handle.cancelled:
                callback()
                await settle()
        self._now = target
        await settle()


async def settle() -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(SETTLE_ROUNDS):
        await asyncio.sleep(0)
