"""The one way tests and the harness wait for a condition: poll it until it holds.

`await eventually(check, timeout, what)` calls `check` every `interval` seconds until it
returns something truthy, and returns that value; after `timeout` seconds it fails with an
AssertionError naming `what` and the last value (or error) seen. `check` may be a plain callable,
one returning an awaitable (an async check), or a blocking one run in a worker thread
(`in_thread=True`: admin HTTP calls, `subprocess`). Errors listed in `ignore` count as "not
yet". `eventually_blocking` is the same for code without an event loop (sync tests, worker
threads).

A test waits for the thing, not for a while. A sleep stays only where the time itself is the
subject (a rate, a window's length, "nothing happens for N seconds" when no event can show it).
`tests/test_waits.py` finds hand-written deadline loops in tests, the harness and the bench.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.05


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    timeout: float = 10.0,
    what: str = "the condition",
    *,
    interval: float = DEFAULT_INTERVAL_S,
    in_thread: bool = False,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """The first truthy value of `check()`, polled every `interval` s for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = await asyncio.to_thread(check) if in_thread else check()
            if inspect.isawaitable(value):
                value = await value
        except ignore as err:
            last = err
        else:
            if value:
                return value  # type: ignore[return-value]
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what} (last: {last!r})")
        await asyncio.sleep(interval)


def eventually_blocking(
    check: Callable[[], T],
    timeout: float = 10.0,
    what: str = "the condition",
    *,
    interval: float = DEFAULT_INTERVAL_S,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`eventually` for code without an event loop: the same polling, in this thread."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
        except ignore as err:
            last = err
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what} (last: {last!r})")
        time.sleep(interval)
