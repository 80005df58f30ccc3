"""Garbage collection kept off the event loop's critical path.

CPython's full (generation 2) collection walks every container object the process holds and
stops everything while it does. What Ballast builds before it serves — the desired state, the
translated resources of every PoP, the restored intent — lives as long as the server, is freed
by reference counting if it ever goes, and is most of the heap until nodes connect: walking it
finds it alive every time. `settle_heap` (called once, when the server is ready) moves it into
the generation the collector never walks (`gc.freeze()`).

Then nodes connect, and each stream holds ~70 objects of its own, most of them gRPC's (the
coroutines, futures and batch operations of its pending read): 700,000 at 10,000 nodes. With
CPython's schedule a full collection walked them all, 0.6-0.9 s with the loop stopped, again
and again as the fleet grew (each time the oldest generation had grown by a quarter), and in a
global change. So from `settle_heap` on, while a loop runs, the collector keeps a schedule of
its own (`_Collections`):

- a full collection is made by the loop after every collection of the middle generation
  (CPython makes none itself), and what it finds alive is frozen at once: the next one walks
  only what reached the oldest generation since, ~25,000 objects at most in a storm of 10,000
  nodes (docs/benchmarks.md);
- a young collection runs every `YOUNG_EVERY_S` besides CPython's own. CPython counts objects
  made *less objects freed*: a stream that reads its next request frees the objects of its last
  read (old, frozen) as it makes new ones, so in a global change the young generation grew to
  140,000 objects without a collection, and the one that came walked them all (140 ms).

What a freeze keeps is never walked again, so a cycle among objects frozen alive that later
become garbage stays. A stream leaves none when it ends: 200 nodes frozen alive, then gone
(streams closed, or the client killed), left 0 to 5 objects for a full collection to find;
`tests/test_heap_streams.py` keeps it so (a stream that left one cycle behind fails it). A
stream the server ended with a status did leave one (26 objects a stream, its requests held by
them: the error gRPC keeps on the call, whose traceback's frames hold the call; a fuzzing run's
peak RSS 299-404 MB against 183-232 MB once the ADS handlers clear those frames,
`ads/server._without_cycles`). `bench/soak.py` runs the whole service for hours with nodes
coming and going, reloads, incidents and rollouts, and fails if memory grows.

A hot reload builds every PoP's output anew on a worker thread (`reload_heap`): its
allocations would set off full collections every second or so, each walking what the build made
so far while it holds the GIL (85-160 ms each at 100 PoPs x 50 groups, docs/benchmarks.md).
During a reload the collector makes young collections only (the loop's full collections are
held), in small pieces on whichever thread allocates; most of what a 100 x 50 reload allocates
(120,000 objects) are tuples of strings that a young collection untracks. After it the young
generations are collected once (they are small) and what is alive is frozen: the new output
lives until the next reload, and is freed by reference counting then.

Freeing is work too: a tick's plan for 2,000 pairs and the output a change replaced are handed
to a worker thread to be freed (`ads/off_loop.py`'s `free_later`), not dropped on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

# the oldest generation's threshold when the collector must not make full collections itself
NO_FULL_COLLECTION = 2**31 - 1
# a full collection after this many collections of the middle generation (CPython: 10, and
# only once a quarter more objects than it found alive at the last one reached the oldest)
YOUNG_PER_FULL = 1
YOUNG_EVERY_S = 0.05  # a young collection at least this often, however few objects were made


class _Collections:
    """The collector's schedule while a server runs on the event loop:

    - a young collection every `YOUNG_EVERY_S` on the loop, besides CPython's own: CPython
      counts objects made *less objects freed*, and a stream that reads its next request frees
      the ~14 objects of its last read (frozen, old) as it makes 14 new ones, so during a
      global change the young generation grew to 140,000 objects uncounted and its one
      collection took 140 ms;
    - a full collection made on the loop after every `YOUNG_PER_FULL` collections of the middle
      generation (CPython's own are out of reach), and what each finds alive frozen: it walks
      only what reached the oldest generation since the last one. `held` (a reload) puts them
      off.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due = False
        self.held = 0
        self.thresholds = gc.get_threshold()
        gc.set_threshold(self.thresholds[0], self.thresholds[1], NO_FULL_COLLECTION)
        self._timer = loop.call_later(YOUNG_EVERY_S, self.young)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop":
            return
        if info["generation"] == 2:
            gc.freeze()
        elif info["generation"] == 1 and not self.due and not self.held \
                and gc.get_count()[2] >= YOUNG_PER_FULL:
            self.due = True  # (on whichever thread allocated: the loop collects)
            self.loop.call_soon_threadsafe(self.full)

    def young(self) -> None:
        gc.collect(1 if gc.get_count()[1] >= self.thresholds[1] else 0)
        self._timer = self.loop.call_later(YOUNG_EVERY_S, self.young)

    def full(self) -> None:
        self.due = False
        if not self.held:
            gc.collect()

    def stop(self) -> None:
        self._timer.cancel()
        gc.set_threshold(*self.thresholds)


_collections: _Collections | None = None


def settle_heap() -> None:
    """Collect once and freeze what exists now; then, if an event loop runs, collect on its
    schedule (`_Collections`) until `release_heap`."""
    global _collections
    gc.collect()
    gc.freeze()
    if _collections is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        _collections = _Collections(loop)
        gc.callbacks.append(_collections)


@contextlib.contextmanager
def reload_heap() -> Iterator[None]:
    """No full collection while the body (a reload) runs: the oldest generation's threshold is
    out of reach meanwhile and the loop's full collections are held, the young generations are
    collected as usual (in small pieces, on whichever thread allocates). After it the young
    garbage is collected and what is alive is frozen (what the reload built lives until the
    next one)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    collections = _collections
    if collections is not None:
        collections.held += 1
    try:
        yield
    finally:
        if collections is not None:
            collections.held -= 1
        gc.set_threshold(*thresholds)
        gc.collect(1)
        gc.freeze()


def release_heap() -> None:
    """Undo `settle_heap` (a process that goes on without the server: tests)."""
    global _collections
    if _collections is not None:
        gc.callbacks.remove(_collections)
        _collections.stop()
        _collections = None
    gc.unfreeze()
