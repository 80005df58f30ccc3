"""How fast clients may fill the decision log: a rate limit in bytes for routine records.

Records a client can cause (a node connecting, disconnecting, NACKing, falling back to FIFO)
are routine; a fleet or one misbehaving client can cause any number of them, and enough of
them would rotate the decisions on-call needs out of the log. They are written only while a
token bucket of bytes allows (`burst_bytes` at once, refilled at `bytes_per_s`); what does not
fit is counted by kind, and the counts are written as one `records_suppressed` record as soon
as the limit allows again. Decisions (weights, tier actions, config, start-up) are never
limited: they are always written.

Pure apart from the injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_BURST_BYTES = 8 * 1024 * 1024
DEFAULT_BYTES_PER_S = 32 * 1024


@dataclass(frozen=True)
class RateLimit:
    burst_bytes: int = DEFAULT_BURST_BYTES
    bytes_per_s: int = DEFAULT_BYTES_PER_S

    def __post_init__(self) -> None:
        if self.burst_bytes < 1 or self.bytes_per_s < 1:
            raise ValueError("the routine records' rate limit needs burst and rate of at least 1 "
                             "byte")


DEFAULT_RATE_LIMIT = RateLimit()


class RecordLimiter:
    def __init__(
        self, config: RateLimit = DEFAULT_RATE_LIMIT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._tokens = float(config.burst_bytes)
        self._at = clock()
        self.suppressed: dict[str, int] = {}  # kind -> records not written since the last note
        self.suppressed_total = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(
            float(self.config.burst_bytes),
            self._tokens + (now - self._at) * self.config.bytes_per_s,
        )
        self._at = now

    def take(self, kind: str, size: int) -> bool:
        """Whether a routine record of `size` bytes may be written now (and pay for it)."""
        self._refill()
        if size <= self._tokens:
            self._tokens -= size
            return True
        self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
        self.suppressed_total += 1
        return False

    def pending_note(self) -> dict[str, int] | None:
        """The counts to write as a `records_suppressed` record, once; None if nothing is due."""
        if not self.suppressed:
            return None
        counts, self.suppressed = self.suppressed, {}
        return counts
