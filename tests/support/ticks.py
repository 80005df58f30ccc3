"""What a reconcile tick does to the intent owner for a few pairs, on the spot: the changes its
steps make, through the change transaction (prepared, saved, swapped; no records)."""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.intent.owner import IntentOwner
from control_plane.intent.steps import PairStep, changes_of


async def apply_steps(owner: IntentOwner, steps: Sequence[PairStep]) -> frozenset[str]:
    """The PoPs whose output changed."""
    async with owner.change() as change:
        change.steps(changes_of(change.base, steps), planned_for=change.base.desired)
    return change.pushed
