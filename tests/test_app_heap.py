"""Settling the heap: what start-up built is frozen out of full collections, what a later full
collection finds alive is frozen too, garbage made afterwards (cycles included) is still
collected, and releasing undoes it; a reload runs with young collections only, its young
garbage is collected and what it built is frozen after it; large structures handed over are
freed on a worker thread."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from control_plane.ads.off_loop import free_later
from control_plane.lifecycle.heap import (
    NO_FULL_COLLECTION,
    YOUNG_PER_FULL,
    release_heap,
    reload_heap,
    settle_heap,
)
from harness.eventually import eventually


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


async def test_on_a_loop_full_collections_come_from_it_and_freeze_what_they_find_alive(
) -> None:
    collections: list[tuple[int, bool]] = []  # (generation, on the loop's thread)
    loop_thread = threading.get_ident()

    def noted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append((info["generation"], threading.get_ident() == loop_thread))

    thresholds = gc.get_threshold()
    settle_heap()
    gc.callbacks.append(noted)
    try:
        assert gc.get_threshold()[2] == NO_FULL_COLLECTION  # CPython makes none itself
        alive = Node()  # made after start-up: walked by the next full collection, found alive
        kept = weakref.ref(alive)
        young = Node()
        gone = weakref.ref(young)
        del young
        frozen = gc.get_freeze_count()
        # nothing allocated: the loop's own young collections (every YOUNG_EVERY_S) lead to
        # a middle one and then a full one, on the loop
        await eventually(lambda: (2, True) in collections, 10, "a full collection")
        assert (0, True) in collections and (1, True) in collections
        assert gone() is None  # garbage by then: collected
        assert gc.get_freeze_count() > frozen  # the survivors: frozen
        del alive
        gc.collect()
        assert kept() is not None  # a cycle once frozen stays (streams end without cycles)
        with reload_heap():  # a reload holds the full collections off
            collections.clear()
            threading.Thread(target=lambda: [Node() for _ in range(100_000)]).start()
            await eventually(lambda: collections.count((1, True)) >= 2 * YOUNG_PER_FULL, 10,
                             "young collections during the reload")
            assert not any(generation == 2 for generation, _ in collections)
    finally:
        gc.callbacks.remove(noted)
        release_heap()
    assert gc.get_threshold() == thresholds
    gc.collect()
    assert kept() is None
    later = Node()
    frozen = gc.get_freeze_count()
    gc.collect()
    assert gc.get_freeze_count() == frozen == 0  # released: full collections freeze nothing
    del later


class Freed:
    def __init__(self, threads: list[int]) -> None:
        self.threads = threads

    def __del__(self) -> None:
        self.threads.append(threading.get_ident())


async def test_what_is_handed_over_is_freed_on_a_worker_thread() -> None:
    threads: list[int] = []
    made = [Freed(threads) for _ in range(3)]
    free_later(made)
    del made
    assert threads == []  # not on the caller's turn of the loop
    await eventually(lambda: len(threads) == 3, 5, "the objects freed")
    assert threading.get_ident() not in threads
