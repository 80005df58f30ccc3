"""How fast clients may grow the server's log: a rate limit in bytes per logger whose lines
they cause.

A node that reconnects and NACKs in a loop makes the ADS server log a line per connection, per
NACK and per disconnect; a client sending malformed requests to the admin port makes the admin
API log one per request; failed sign-ins are logged. Left alone, that is hundreds of KB/s of log
from one client (480 KB/s measured). Each of those loggers gets its own token bucket of bytes
(`RecordLimiter`, as the decision log's routine records have: `burst_bytes` at once, refilled at
`bytes_per_s`): a line that does not fit is counted, not written, and the next line that fits
says how many were left out since when. Lines of level ERROR and above always pass (they are
the server's own failures, not a client's doing). One logger's flood never takes another's
budget: a NACK storm cannot hide failed sign-ins.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from control_plane.decisions.rate_limit import RateLimit, RecordLimiter

NOTE_BYTES = 80  # " [log rate limit: 1,234 lines of this logger not written since 12:34:56]"
LINE_OVERHEAD = 40  # "2026-01-02 03:04:05,678 WARNING " and the rest of a line's frame
# the loggers whose INFO and WARNING lines clients cause, and each one's budget
CLIENT_LOGGERS: dict[str, RateLimit] = {
    "control_plane.ads.server": RateLimit(burst_bytes=32 * 1024, bytes_per_s=1024),
    "control_plane.admin.requests": RateLimit(burst_bytes=16 * 1024, bytes_per_s=256),
    "control_plane.admin.auth": RateLimit(burst_bytes=16 * 1024, bytes_per_s=256),
}


class LogRateLimit(logging.Filter):
    """A logger's filter: its lines below ERROR pass while the budget allows."""

    def __init__(self, config: RateLimit, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.limiter = RecordLimiter(config, clock)
        self._wall = wall
        self._since: float | None = None  # wall time of the first line left out
        self._lock = threading.Lock()  # handlers may log from worker threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        text = record.getMessage()
        # a line in the log: its time, level and logger's name (`ballast serve`'s format), then
        # the message
        size = LINE_OVERHEAD + len(record.name) + len(text.encode("utf-8", "replace"))
        with self._lock:
            if self.limiter.suppressed:  # the line will say how many were left out
                size += NOTE_BYTES
            if not self.limiter.take("line", size):
                if self._since is None:
                    self._since = self._wall()
                return False
            left_out = self.limiter.pending_note()
            since, self._since = self._since, None
        if left_out:
            stamp = time.strftime("%H:%M:%S", time.localtime(since or self._wall()))
            record.msg = (f"{text} [log rate limit: {left_out['line']:,} lines of this logger "
                          f"not written since {stamp}]")
            record.args = ()
        return True


_installed: dict[str, LogRateLimit] = {}


def limit_client_logs() -> None:
    """Put each client-caused logger (`CLIENT_LOGGERS`) under its budget, once per process."""
    for name, config in CLIENT_LOGGERS.items():
        if name not in _installed:
            _installed[name] = LogRateLimit(config)
            logging.getLogger(name).addFilter(_installed[name])
