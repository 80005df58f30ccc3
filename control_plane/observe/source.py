"""The one interface `decide` reads through: rolling windows of per-origin signals.

Every source (the embedded metrics_service sink, Prometheus, either merged with active probes)
answers the same question: over the window ending at `now_ms`, what did each PoP see of each
origin of each origin group? Times are milliseconds on the wall clock (epoch), the clock the sink
stamps arrivals with and Prometheus stores samples with.
"""

from __future__ import annotations

import time
from typing import Protocol

from control_plane.decide.signals import GroupSignals, GroupTierPending

PopGroup = tuple[str, str]  # (PoP, origin group)
Signals = dict[PopGroup, GroupSignals]
TierSignals = dict[PopGroup, GroupTierPending]


class MetricSource(Protocol):
    async def window(self, now_ms: int, window_ms: int) -> Signals:
        """Signals per (PoP, group) -> origin over (now_ms - window_ms, now_ms].

        A (PoP, group) or origin with no sample in the window is absent: the caller holds.
        """
        ...


class TierSource(Protocol):
    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        """Per (PoP, group) -> tier: the highest `upstream_rq_pending_active` of the tier's
        cluster over (now_ms - window_ms, now_ms], the PoP's Envoys summed.

        A tier cluster with no sample in the window is absent: the caller holds.
        """
        ...


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
