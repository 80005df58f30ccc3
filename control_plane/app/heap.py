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

A hot reload builds every PoP's output anew on a worker thread (`reload_heap`). Frozen start-up
leaves the collector's count of long-lived objects small, so the build's allocations set off a
full collection every second or so, each walking what the build made so far while it holds the
GIL: at 100 PoPs x 50 groups, 85-160 ms each, the event loop stalled meanwhile (docs/
benchmarks.md). During a reload the collector is off. What the reload built is not frozen after
it: everything alive then would be, the garbage cycles of clients that left during the reload
among it, kept for good (a fuzz run with a desired-state change every wave: peak RSS 575 MB
against its 400 MB bound; 296 MB without that freeze).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def settle_heap() -> None:
    """Collect once, then freeze what exists now."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def reload_heap() -> Iterator[None]:
    """No cyclic collection while the body (a reload) runs; the collector is on again after it,
    and what became garbage meanwhile is collected as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def release_heap() -> None:
    """Undo `settle_heap` (a process that goes on without the server: tests)."""
    gc.unfreeze()
