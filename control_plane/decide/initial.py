"""Starting weights for a (PoP, origin group) that has no history yet."""

from __future__ import annotations

from control_plane.desired.model import GroupWeights, OriginGroup


def initial_weights(group: OriginGroup, pop: str) -> GroupWeights:
    """The PoP's preferred origin takes everything but the standby origins' warm pools."""
    order = group.preference[pop]
    warm = group.failover.min_warm_pool
    weights = {name: warm for name in order[1:]}
    weights[order[0]] = 100 - warm * (len(order) - 1)
    return weights
