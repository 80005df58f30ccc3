"""Background tasks of a running service: started together, stopped together."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel every task, wait until each has ended, and empty the list."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()
