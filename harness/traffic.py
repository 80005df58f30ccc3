"""Steady request traffic through an edge listener, for the demo (`make run`) and the end-to-end
tests: one GET at a time, cycling over a few paths, until told to stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence

import aiohttp


async def steady_traffic(
    base_url: str,
    paths: Sequence[str],
    rps: float,
    stop: asyncio.Event,
    on_status: Callable[[int], None] | None = None,
) -> None:
    """GET `base_url` + each of `paths` in turn, about `rps` a second, until `stop` is set. Each
    answer's status goes to `on_status`; a request that fails (connection error, timeout) as 0."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        sent = 0
        while not stop.is_set():
            try:
                async with session.get(base_url + paths[sent % len(paths)]) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            if on_status is not None:
                on_status(status)
            sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1 / rps)


async def stop_tasks(stop: asyncio.Event, tasks: Iterable[asyncio.Task[None]]) -> None:
    """Set `stop` and wait for each task (traffic, watchers) to end; their errors are dropped."""
    stop.set()
    for task in tasks:
        with contextlib.suppress(Exception):
            await task
