"""Two passive sources as one (`--metrics-source sink+lrs`, `prometheus+lrs`): the first's
windows, the second's for the (PoP, group) pairs the first has nothing of.

A pair is taken whole from one source, never origin by origin: an Envoy that streams stats to
the sink and load reports too counts the same requests in both, and mixing them would count an
origin's window from one and its neighbour's from the other. So the sink (or Prometheus) keeps
every pair its Envoys report, and the load reports add what only they see: the gRPC services
proxyless clients call, and the PoPs whose Envoys report load but send no stats. Tier readings
(queues) come from the first only: load reports carry none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from control_plane.desired.model import Desired
from control_plane.observe.source import Signals, TierSignals


class PassiveSource(Protocol):
    async def window(self, now_ms: int, window_ms: int) -> Signals: ...

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals: ...

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None: ...


class FilledIn:
    def __init__(self, first: PassiveSource, then: PassiveSource) -> None:
        self.first = first
        self.then = then

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        signals = dict(await self.then.window(now_ms, window_ms))
        signals.update(await self.first.window(now_ms, window_ms))
        return signals

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        return await self.first.tier_pending(now_ms, window_ms)

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None:
        self.first.update_served(desired, serving)
        self.then.update_served(desired, serving)

    def reporting_nodes(self, now_ms: int, window_ms: int) -> set[str] | None:
        """The nodes either source heard from in the window; None when the first cannot tell
        per node (Prometheus)."""
        heard = [getattr(source, "reporting_nodes", None) for source in (self.first, self.then)]
        if heard[0] is None or heard[1] is None:
            return None
        return heard[0](now_ms, window_ms) | heard[1](now_ms, window_ms)
