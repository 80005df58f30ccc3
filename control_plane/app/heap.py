"""Garbage collection kept off the event loop's critical path.

CPython's full (generation 2) collection walks every container object the process holds and
stops everything while it does. What Ballast builds before it serves — the desired state, the
translated snapshots of every PoP, the restored intent — lives as long as the server, is freed
by reference counting if it ever goes, and is most of the heap until nodes connect: walking it
finds it alive every time. `settle_heap` (called once, when the server is ready) moves it into
the generation the collector never walks (`gc.freeze()`).

Objects made later are not frozen, and the collector's thresholds stay CPython's: a stream that
ends leaves its garbage cycles to the collector, so clients that come and go cannot grow the
heap. Both alternatives were measured and dropped (docs/benchmarks.md): freezing every few seconds
kept a fuzzing run's cycles (peak RSS 1.6 GB, bound 400 MB), and collecting the youngest
generation every 10,000 allocations instead of 700 took the same run to 539 MB.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then freeze what exists now."""
    gc.collect()
    gc.freeze()


def release_heap() -> None:
    """Undo `settle_heap` (a process that goes on without the server: tests)."""
    gc.unfreeze()
