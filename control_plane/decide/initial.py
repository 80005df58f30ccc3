"""Starting weights for a (PoP, origin group) that has no history yet."""

from __future__ import annotations

from control_plane.decide.controller import home_weights
from control_plane.desired.model import GroupWeights, OriginGroup


def initial_weights(group: OriginGroup, pop: str) -> GroupWeights:
    """The PoP's preferred origin takes everything but the standby origins' warm pools."""
    return home_weights(group.preference[pop], group.failover.min_warm_pool)
