"""Settling the heap: what start-up built is frozen out of full collections, garbage made
afterwards (cycles included) is still collected, and releasing undoes it; a reload runs with
the collector off and what it built is frozen after it."""

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


def test_a_reload_runs_without_collections_and_keeps_no_garbage_after() -> None:
    collections: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(counted)
    try:
        with pytest.raises(RuntimeError), reload_heap():
            assert not gc.isenabled()
            built = [Node() for _ in range(50_000)]  # would set off collections otherwise
            kept = weakref.ref(built[0])
            assert collections == []
            raise RuntimeError("a reload that fails still turns the collector back on")
        assert gc.isenabled()
        del built
        gc.collect()
        assert kept() is None  # a cycle that died during the reload is not kept
    finally:
        gc.callbacks.remove(counted)
        release_heap()
    gc.collect()
    assert kept() is None
