"""Garbage collection kept off the event loop's critical path.

CPython's full (generation 2) collection walks every container object the process holds and
stops everything while it does. What Ballast builds before it serves — the desired state, the
translated resources of every PoP, the restored intent — lives as long as the server, is freed
by reference counting if it ever goes, and is most of the heap until nodes connect: walking it
finds it alive every time. `settle_heap` (called once, when the server is ready) moves it into
the generation the collector never walks (`gc.freeze()`).

Objects made later are not frozen until a hot reload (below), and the collector's thresholds
stay CPython's: a stream that ends leaves its garbage cycles to the collector, so clients that
come and go cannot grow the heap. Both alternatives were measured and dropped
(docs/benchmarks.md): freezing every few seconds kept a fuzzing run's cycles (peak RSS 1.6 GB,
bound 400 MB), and collecting the youngest generation every 10,000 allocations instead of 700
took the same run to 539 MB.

A hot reload builds every PoP's output anew on a worker thread (`reload_heap`). Frozen start-up
leaves the collector's count of long-lived objects small, so the build's allocations set off a
full collection every second or so, each walking what the build made so far while it holds the
GIL: at 100 PoPs x 50 groups, 85-160 ms each, the event loop stalled meanwhile (docs/
benchmarks.md). During a reload the collector makes young collections only (the oldest
generation's threshold is out of reach), in small pieces on whichever thread allocates; most of
what a 100 x 50 reload allocates (120,000 objects) are tuples of strings that a young collection
untracks. After it the young generations are collected once (they are small) and what is alive
is frozen, as start-up's heap is: the new output lives until the next reload, and is freed by
reference counting then. Measured and dropped (docs/benchmarks.md): the collector off during the
reload (its first young collection after the reload walked all 120,000 objects, 70-150 ms on
the loop right after the swap), young collections without the freeze (the full collection that
follows walked the new output with everything else, 185-290 ms), and a freeze after a reload
run with the collector off (it kept the garbage cycles of every client that left during the
reload: a fuzz run's peak RSS 575 MB against its 400 MB bound).

What the freeze after a reload takes also holds the streams of the nodes connected then: were
any of a stream's objects freed only by the collector, they would stay once that node left.
They are not: 200 nodes frozen alive, then gone (streams closed, or the client killed), left 0
to 5 objects for a full collection to find; `tests/test_heap_streams.py` keeps it so (a stream
that left one cycle behind fails it). A stream the server ended with a status did leave one
(26 objects a stream, its requests held by them: the error gRPC keeps on the call, whose
traceback's frames hold the call; a fuzzing run's peak RSS 299-404 MB against 183-232 MB once
the ADS handlers clear those frames, `ads/server._without_cycles`). A periodic sweep
(unfreeze, collect, freeze) would bound any such leak, but at 100 PoPs x 50 groups it holds the
loop 550-620 ms (docs/benchmarks.md): not worth it for nothing to collect.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# the oldest generation's threshold during a reload: out of reach of its young collections
NO_FULL_COLLECTION = 2**31 - 1


def settle_heap() -> None:
    """Collect once, then freeze what exists now."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def reload_heap() -> Iterator[None]:
    """No full collection while the body (a reload) runs: the oldest generation's threshold is
    out of reach meanwhile, the young generations are collected as usual (in small pieces, on
    whichever thread allocates). After it CPython's thresholds are back, the young garbage is
    collected and what is alive is frozen (what the reload built lives until the next one)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.collect(1)
        gc.freeze()


def release_heap() -> None:
    """Undo `settle_heap` (a process that goes on without the server: tests)."""
    gc.unfreeze()
