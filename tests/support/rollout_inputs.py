"""What a rollout driver's gates read, made up for tests whose subject is not the gates: one
node per PoP applying whatever its PoP serves, and healthy windows in every PoP.

A wave with no connected node waits (issue 33), and a PoP with nodes needs a passing reading:
tests of how replicas hand a rollout over, or of what a driver publishes, give the driver
these (`with_made_up_inputs`) so its waves pass once baked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from control_plane.decide.gates import Nack, NodeAck
from control_plane.decide.signals import OriginSignals
from control_plane.intent.owner import IntentOwner
from control_plane.observe.source import Signals


class Healthy:
    """Every PoP's origins of group `shop` answer well, before and after (a MetricSource)."""

    def __init__(self, pops: Iterable[str]) -> None:
        self.pops = tuple(pops)

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        def origin() -> OriginSignals:
            return OriginSignals(1000, 0, 0, 20.0, 60.0, 0.0, 0, 1.0, now_ms)

        return {(pop, "shop"): {"primary": origin(), "secondary": origin()}
                for pop in self.pops}


class WithNodes:
    """The ACKs a driver reads (`acks`: its `ConfigAcks`, or None), plus one node per PoP,
    `<pop>-1`, applying whatever its PoP serves."""

    def __init__(self, owner: IntentOwner, acks: Any = None) -> None:
        self.owner = owner
        self.acks = acks

    def nodes(self, pops: Iterable[str]) -> tuple[NodeAck, ...]:
        pops = list(pops)
        made = tuple(NodeAck(pop, f"{pop}-1", self.owner.intent.desired_of(pop).digest)
                     for pop in pops)
        return made if self.acks is None else (*self.acks.nodes(pops), *made)

    def nacks(self, since_ms: int) -> tuple[Nack, ...]:
        return () if self.acks is None else tuple(self.acks.nacks(since_ms))


def with_made_up_inputs(service: Any, pops: Iterable[str]) -> None:
    """`service`'s rollout driver reads `WithNodes` and `Healthy` (its own ACKs kept), its
    nodes' windows starting a flush and a half after a look saw them applying a version."""
    rollouts = service.rollouts
    rollouts.acks = WithNodes(service.server.intent, rollouts.acks)
    rollouts.source = Healthy(pops)
    rollouts._stats_after = None
