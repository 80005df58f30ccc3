"""An accept that fails for want of descriptors, said once per interval.

asyncio's servers (the admin API) meet a full descriptor table in `accept()` (EMFILE, ENFILE,
ENOBUFS, ENOMEM): they stop accepting for a second and try again, and tell the loop's exception
handler — whose default logs a traceback, once for every connection waiting in the backlog
(Python 3.11 goes on calling `accept()` after the first failure): 6,402 tracebacks in one probe.
`QuietAcceptErrors` takes these reports instead: one line when they start, then one summary
every `REPORT_EVERY_S` while they go on; every other report goes to the default handler.

gRPC's own listener (the xDS port) backs off likewise and logs one line a second while it lasts
("File descriptor limit reached. Retrying."); its connections are capped below the descriptor
limit (`ads/limits.py`, `connection_cap`), so it meets a full table only when something else
filled it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

__all__ = ["REPORT_EVERY_S", "QuietAcceptErrors"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 60.0
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ASYNCIO_ACCEPT_MESSAGE = "socket.accept() out of system resource"  # asyncio's words


class QuietAcceptErrors:
    """The loop's exception handler (`install`)."""

    def __init__(self, every_s: float = REPORT_EVERY_S) -> None:
        self.every_s = every_s
        self.failed = 0  # accepts failed since the last line
        self._summary: asyncio.TimerHandle | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if not (context.get("message") == ASYNCIO_ACCEPT_MESSAGE and isinstance(error, OSError)
                and error.errno in OUT_OF_RESOURCES):
            loop.default_exception_handler(context)
            return
        if self._summary is None:
            log.error("accepting connections failed: %s; retrying every second (counted; a "
                      "summary every %g s)", error.strerror, self.every_s)
            self._summary = loop.call_later(self.every_s, self._report, loop)
        else:
            self.failed += 1

    def _report(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.failed:
            self._summary = None  # quiet again: the next failure makes a line at once
            return
        log.error("accepting connections failed %d times in the last %g s (out of descriptors "
                  "or memory)", self.failed, self.every_s)
        self.failed = 0
        self._summary = loop.call_later(self.every_s, self._report, loop)
