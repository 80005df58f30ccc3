"""`calls_ended`: a stopped server's call tasks (grpc.aio's `_schedule_rpc_coro`) end before the
process ends its loop, which would cancel them and make grpc log an error (the soak's errors at
the stop, issue 39). grpc runs them; here tasks of the same name stand for them."""

from __future__ import annotations

import asyncio
import time

from control_plane.ads.server import calls_ended


async def _schedule_rpc_coro(finished: asyncio.Event) -> None:  # named as grpc's call task
    await finished.wait()


async def test_waits_for_call_tasks_to_end() -> None:
    finished = asyncio.Event()
    call = asyncio.create_task(_schedule_rpc_coro(finished))
    asyncio.get_running_loop().call_later(0.05, finished.set)
    await calls_ended(5)
    assert call.done() and not call.cancelled()


async def test_gives_up_after_its_timeout_and_ignores_other_tasks() -> None:
    other = asyncio.create_task(asyncio.sleep(30))  # not a call: not waited for
    finished = asyncio.Event()
    call = asyncio.create_task(_schedule_rpc_coro(finished))
    started = time.monotonic()
    await calls_ended(0.1)
    assert 0.1 <= time.monotonic() - started < 5 and not call.done()
    finished.set()
    await call
    started = time.monotonic()
    await calls_ended(5)  # only `other` left
    assert time.monotonic() - started < 1
    other.cancel()
