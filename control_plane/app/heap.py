"""Garbage collection kept off the event loop's critical path.

CPython's full (generation 2) collection walks every container object the process holds and
stops everything while it does: with 10,000 connected nodes that is millions of objects and a
pause of up to a second or more in which no ACK is read and no push is written (`make bench`,
docs/benchmarks.md). Most of that heap lives as long as the server or as long as a stream — the
desired state, the translated snapshots, every stream's protocol state — and reference counting
frees it when it goes; the walk only ever finds it alive.

`HeapKeeper` moves what has survived into the generation the collector never walks
(`gc.freeze()`, an O(1) list splice) right away and then every `freeze_every_s`, so full
collections only see what is young. The price is that garbage *cycles* among frozen objects
(say, a finished task and its traceback) are not freed while frozen: every `full_every_s` the
keeper unfreezes everything and collects once — one full walk in that period instead of one
every time the heap grew by a quarter.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

FREEZE_EVERY_S = 5.0
FULL_EVERY_S = 600.0


class HeapKeeper:
    def __init__(
        self,
        *,
        freeze_every_s: float = FREEZE_EVERY_S,
        full_every_s: float = FULL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.freeze_every_s = freeze_every_s
        self.full_every_s = full_every_s
        self._clock = clock
        self._sleep = sleep
        self.full_collections = 0  # the keeper's own full collections (status, tests)

    async def run(self) -> None:
        """Freeze now and every `freeze_every_s`; unfreeze and collect every `full_every_s`.
        Cancelled, it unfreezes (a process that goes on without the server collects all)."""
        gc.freeze()
        last_full = self._clock()
        try:
            while True:
                await self._sleep(self.freeze_every_s)
                if self._clock() - last_full >= self.full_every_s:
                    self.collect()
                    last_full = self._clock()
                gc.freeze()
        finally:
            gc.unfreeze()

    def collect(self) -> None:
        """Everything unfrozen and walked once (frees the cycles frozen meanwhile)."""
        started = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        self.full_collections += 1
        log.info("full garbage collection: %d unreachable objects, %.0f ms", found,
                 (time.perf_counter() - started) * 1e3)
