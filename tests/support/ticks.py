"""What a reconcile tick does to the intent owner for a few pairs, on the spot: the changes its
steps make, saved, then applied and published (the reconcile loop prepares the output on a
worker thread instead)."""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.intent.owner import IntentOwner
from control_plane.intent.steps import PairStep, changes_of


async def apply_steps(owner: IntentOwner, steps: Sequence[PairStep]) -> frozenset[str]:
    """The PoPs whose output changed."""
    changes = changes_of(owner.intent, steps)
    await owner.save_changes(changes, owner.desired)
    return owner.apply_changes(changes)
