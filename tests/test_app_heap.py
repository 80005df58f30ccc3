"""Settling the heap: what start-up built is frozen out of full collections, garbage made
afterwards (cycles included) is still collected, and releasing undoes it; a reload runs with
young collections only, its young garbage is collected and what it built is frozen after it."""

from __future__ import annotations

import gc
import weakref

import pytest

from control_plane.app.heap import release_heap, reload_heap, settle_heap


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


def test_a_reload_makes_young_collections_only_then_freezes_what_it_built() -> None:
    collections: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.callbacks.append(counted)
    try:
        with pytest.raises(RuntimeError), reload_heap():
            dead = Node()  # a cycle the reload made and dropped
            died = weakref.ref(dead)
            del dead
            built = [Node() for _ in range(200_000)]  # would set off full collections
            kept = weakref.ref(built[0])
            assert 0 in collections and 2 not in collections, sorted(set(collections))
            raise RuntimeError("a reload that fails still puts the thresholds back")
        assert gc.get_threshold() == thresholds
        assert died() is None  # young garbage: collected, not frozen
        frozen = gc.get_freeze_count()
        assert frozen >= len(built)
        del built
        gc.collect()
        assert kept() is not None  # frozen with what the reload built: never walked again
    finally:
        gc.callbacks.remove(counted)
        release_heap()
    gc.collect()
    assert kept() is None
