"""Settling the heap: what start-up built is frozen out of full collections, garbage made
afterwards (cycles included) is still collected, and releasing undoes it."""

from __future__ import annotations

import gc
import weakref

from control_plane.app.heap import release_heap, settle_heap


class Node:
    """A cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected() -> None:
    early = Node()
    kept = weakref.ref(early)
    settle_heap()
    try:
        assert gc.get_freeze_count() > 0
        del early
        gc.collect()
        assert kept() is not None  # frozen: the collector does not walk it
        later = Node()
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None  # made after start-up: collected as ever
    finally:
        release_heap()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert kept() is None
