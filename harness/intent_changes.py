"""Changes of the running intent for tests and benchmarks, made the product's one way: through
the change transaction (`IntentOwner.change()`, `control_plane/intent/change.py`) — prepared off
the loop, saved when the owner has a store, swapped, the streams told. They record nothing (the
product's callers state their records; these set a state to look at).

- `apply_pair_changes`: what a reconcile tick decided for some pairs, as the tick states it;
- `set_weights`, `set_tier_actions`: one pair's weights or active tier actions (checked first,
  as the tick checks what it decided: a pair or a value that does not fit raises and changes
  nothing; stated again over a desired state a reload swapped in meanwhile);
- `set_desired`: a new desired state under the carry-over rule, as a reload states it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from control_plane.desired.model import Desired, TierActions
from control_plane.intent.change import StaleChange
from control_plane.intent.owner import IntentOwner
from control_plane.intent.pair_changes import PairChange, changes_of
from control_plane.translate.routes import check_tier_actions
from control_plane.translate.weights import check_group_weights


async def apply_pair_changes(owner: IntentOwner, decided: Sequence[PairChange]
                             ) -> frozenset[str]:
    """The PoPs whose output changed."""
    async with owner.change() as change:
        change.tick(changes_of(change.base, decided), planned_for=change.base.desired)
    return change.pushed


async def set_weights(owner: IntentOwner, pop: str, group: str, weights: Mapping[str, int]
                      ) -> bool:
    """Set (PoP, group)'s weights; True if the PoP's output changed. `UnknownPop` /
    `WeightsError` (nothing changed) for a pair or weights that do not fit."""
    key = (pop, group)
    owner.weights(pop, group)  # the pair exists
    check_group_weights(owner.intent.desired_of(pop).group(group), weights)
    return await _set(owner, lambda: PairChange(key, dict(weights), owner.controller(key)))


async def set_tier_actions(owner: IntentOwner, pop: str, group: str,
                           actions: TierActions | None) -> bool:
    """Set (or with None, lift) (PoP, group)'s active tier actions; True if the PoP's output
    changed. `UnknownPop` / `WeightsError` / ValueError (nothing changed) when they do not
    fit."""
    key = (pop, group)
    owner.weights(pop, group)  # the pair exists
    if actions is not None:
        check_tier_actions(owner.intent.desired_of(pop).group(group), actions)
    return await _set(owner, lambda: PairChange(
        key, owner.weights(pop, group), owner.controller(key), owner.tier_state(key),
        tier_actions=actions))


async def _set(owner: IntentOwner, decide: Callable[[], PairChange]) -> bool:
    """One pair's change, decided over the intent running now; decided again if a new desired
    state landed meanwhile (a tick would be dropped: `StaleChange`; a test means "set this")."""
    while True:
        try:
            return bool(await apply_pair_changes(owner, [decide()]))
        except StaleChange:
            continue


async def set_desired(owner: IntentOwner, desired: Desired) -> frozenset[str]:
    """Run `desired` (the running intent carried over); the PoPs whose output changed (PoPs
    that disappeared count as changed)."""
    async with owner.change() as change:
        change.desired(desired)
    return change.pushed
