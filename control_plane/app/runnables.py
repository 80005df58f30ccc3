"""`Runnables`: the parts of a running service, started in order and stopped in reverse order
under one exit stack (controller-runtime's manager is the model).

Each part is registered as it starts, with what undoes it: a resource held (`hold`: the state
directory's lock, the decision log, the store), a component started and stopped (`start`: the
xDS server, the admin API, the replicas' election), a loop run as a task until it is cancelled
(`spawn`: the reconcile loop, the desired-state watcher, the probes). A start-up that fails
half-way and `stop` unwind the same way: whatever was started is stopped, newest first, and
nothing else — there is no second list of what to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Runnables:
    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()

    def hold(self, release: Callable[[], object]) -> None:
        """Something held until the stop (`release` undoes it)."""
        self._stack.callback(release)

    def hold_async(self, release: Callable[[], Awaitable[object]]) -> None:
        """Something held until the stop, released by awaiting `release()`."""
        self._stack.push_async_callback(release)

    async def start(self, start: Callable[[], Awaitable[object]],
                    stop: Callable[[], Awaitable[object]]) -> None:
        """`await start()`; from then on, `await stop()` at the stop (not if `start` raised:
        a start that fails cleans up after itself)."""
        await start()
        self._stack.push_async_callback(stop)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A loop run as a task until the stop cancels it (and waits for it to end)."""
        task = asyncio.create_task(coroutine)
        self._stack.push_async_callback(_cancel, task)
        return task

    async def stop(self) -> None:
        """Everything undone, newest first; every undo runs even if an earlier one raised
        (the first error is raised afterwards)."""
        await self._stack.aclose()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:  # a loop that had died: said where it mattered (/readyz), not a stop's
        log.exception("a background task had failed")
