"""The heap keeper: what survives is frozen out of full collections, cycles frozen meanwhile are
freed by its periodic full collection, and a cancelled keeper leaves nothing frozen. On a fake
clock."""

from __future__ import annotations

import asyncio
import gc
import weakref

from control_plane.app.heap import HeapKeeper
from tests.support.fake_clock import FakeClock


class Node:
    """A cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_survivors_are_frozen_and_frozen_cycles_are_freed_by_the_full_collection() -> None:
    clock = FakeClock()
    keeper = HeapKeeper(freeze_every_s=5, full_every_s=60, clock=clock.time, sleep=clock.sleep)
    task = asyncio.create_task(keeper.run())
    try:
        await clock.idle()
        assert gc.get_freeze_count() > 0
        cycle = Node()
        gone = weakref.ref(cycle)
        await clock.advance(5)  # frozen with the next freeze
        del cycle
        gc.collect()  # a collection does not walk the frozen generation
        assert gone() is not None and keeper.full_collections == 0
        await clock.advance(55)  # the keeper's full collection
        assert keeper.full_collections == 1
        assert gone() is None
        assert gc.get_freeze_count() > 0  # and frozen again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0
