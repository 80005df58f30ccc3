"""`Manager`: the parts of a running service, started in order and stopped in reverse order under
one exit stack, and the ones only the leader runs started and stopped with the lead
(controller-runtime's manager is the model).

Each part is registered as it starts, with what undoes it: a resource held (`hold`: the state
directory's lock, the decision log, the store), a component started and stopped (`start`: the
xDS server, the admin API), a loop run as a task until it is cancelled (`spawn`: the desired-state
watcher, the probes, the replicas' election and mirror). A start-up that fails half-way and
`stop` unwind the same way: whatever was started is stopped, newest first, and nothing else.

Some runnables run only where this process leads (`leader_only`: the reconcile loop, the rollout
driver's looks). Alone, the process leads once it is started (`lead()`). With replicas, the
election tells the manager (`leadership_changed`): on election it runs the leader's preparations
(`on_elected`, in order: the intent read back from etcd, the schedule deferred, the file read
again) and then starts the leader-only runnables; on loss it stops them first and then runs
`on_lost` (records, the intent adopted from etcd). Nothing else starts, stops or checks them:
the parts ask `leading` where they must know (the faces, the mirror's adoption).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

log = logging.getLogger(__name__)

Loop = Callable[[], Coroutine[Any, Any, None]]


class Lead(Protocol):
    """What an election hands over: the term this process leads (`etcd_store.Leadership`)."""

    term: int


class Manager:
    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._leader_only: list[Loop] = []
        self._elected: list[Callable[[int], Awaitable[None]]] = []
        self._lost: list[Callable[[str], Awaitable[None]]] = []
        self._running: list[asyncio.Task[None]] = []  # the leader-only runnables, while leading
        self.leading = False  # from an election (or, alone, `lead()`) to the loss of the lead

    # -- what runs everywhere ----------------------------------------------------------------

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

    # -- what runs where this process leads ---------------------------------------------------

    def leader_only(self, loop: Loop) -> None:
        """A loop that runs only while this process leads: started on each election (alone:
        at `lead()`), cancelled on each loss and at the stop."""
        self._leader_only.append(loop)

    def on_elected(self, hook: Callable[[int], Awaitable[None]]) -> None:
        """Called with the term on each election, in the order given, before the leader-only
        runnables start; one that raises drops the lead (the election starts over)."""
        self._elected.append(hook)

    def on_lost(self, hook: Callable[[str], Awaitable[None]]) -> None:
        """Called with why on each loss of the lead, after the leader-only runnables stopped."""
        self._lost.append(hook)

    async def lead(self, term: int | None = None) -> None:
        """This process leads: with an election's `term`, its hooks first; then every
        leader-only runnable started."""
        self.leading = True
        if term is not None:
            for hook in self._elected:
                await hook(term)
        self._running = [asyncio.create_task(loop()) for loop in self._leader_only]

    async def lose(self, why: str) -> None:
        """The lead is lost: the leader-only runnables stopped, then the loss's hooks."""
        self.leading = False
        await _cancel_all(self._running)
        for hook in self._lost:
            await hook(why)

    async def leadership_changed(self, lead: Lead | None, why: str) -> None:
        """The election's listener (`leadership.LeaderElection`)."""
        if lead is None:
            await self.lose(why)
        else:
            await self.lead(lead.term)

    async def stop(self) -> None:
        """The leader-only runnables stopped (no loss is told: the process stops), then
        everything undone, newest first; every undo runs even if an earlier one raised (the
        first error is raised afterwards)."""
        self.leading = False
        await _cancel_all(self._running)
        await self._stack.aclose()


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every task, wait until each has ended, and empty the list."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        await _cancel(task)
    tasks.clear()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:  # a loop that had died: said where it mattered (/readyz), not a stop's
        log.exception("a background task had failed")
