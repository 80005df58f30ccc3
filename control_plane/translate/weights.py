"""The origin weights a PoP's endpoints are rendered with: given ones, checked, else the start."""

from __future__ import annotations

from collections.abc import Mapping

from control_plane.desired.model import Desired, GroupWeights, OriginGroup, PopWeights


class WeightsError(ValueError):
    """Weights that do not fit the desired state (unknown group or origin, sum not 100)."""


def resolve_weights(desired: Desired, pop: str, weights: Mapping[str, GroupWeights]) -> PopWeights:
    """Weights for every origin group of `desired`; a group missing from `weights` starts out
    with its home weights (the PoP's preferred origin, warm pools for the others)."""
    known = {group.name for group in desired.origin_groups}
    unknown = sorted(set(weights) - known)
    if unknown:
        raise WeightsError(
            f"weights name unknown origin group(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    resolved: PopWeights = {}
    for group in desired.origin_groups:
        if group.name in weights:
            check_group_weights(group, weights[group.name])
            resolved[group.name] = dict(weights[group.name])
        else:
            resolved[group.name] = group.home_weights(pop)
    return resolved


def check_group_weights(group: OriginGroup, weights: Mapping[str, int]) -> None:
    origins = [origin.name for origin in group.origins]
    unknown = sorted(set(weights) - set(origins))
    if unknown:
        raise WeightsError(
            f"origin group {group.name} has no origin(s) {', '.join(unknown)}; "
            f"its origins: {', '.join(origins)}"
        )
    missing = [name for name in origins if name not in weights]
    if missing:
        raise WeightsError(f"origin group {group.name}: no weight for {', '.join(missing)}")
    negative = sorted(name for name, weight in weights.items() if weight < 0)
    if negative:
        raise WeightsError(
            f"origin group {group.name}: negative weight for {', '.join(negative)}"
        )
    total = sum(weights.values())
    if total != 100:
        raise WeightsError(f"origin group {group.name}: weights sum to {total}, not 100")
