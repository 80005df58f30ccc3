"""Freeing off the event loop: `free_later`, the output cache's `release` in the server and the
reconcile tick's for its plan (`lifecycle/heap.py` says why the heap is kept off the loop's
path)."""

from __future__ import annotations

import asyncio
from typing import Any


def free_later(objects: list[Any]) -> None:
    """Free `objects` on a worker thread: the caller hands over its last references to large
    structures (a tick's plan for every pair, the output a change replaced) in a list it keeps
    no reference to. Freeing is work too, and on the loop it is a stall: 4-8 ms for a tick of
    2,000 pairs, 2-7 ms for the output of 100 PoPs. The list is handed to the thread in the
    loop's next turn, when the caller's frame has let go of what it named."""
    loop = asyncio.get_running_loop()
    loop.call_soon(loop.run_in_executor, None, objects.clear)
