"""What one reconcile tick changes in the running intent, pair by pair. Pure.

A tick decides something for every (PoP, origin group) it steps (`PairChange`: the pair's
weights, streaks, tier and ramp states after the tick's steps), but in a steady fleet almost
nothing changes: streaks stop counting at their thresholds, weights and tier actions hold.
`changes_of` keeps only what differs from the running intent (`TickChanges`), so everything
done with a tick afterwards — the store write, the swap of the running intent, the PoPs
re-translated and pushed — costs what changed, not what was stepped. `applied` lays the changes
onto a running intent (the one they were computed from, or a newer one: each change is per pair
and replaces that pair's value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState
from control_plane.desired.model import GroupWeights, TierActions
from control_plane.intent.running import RunningIntent, ramp_key, tier_key
from control_plane.intent.store import RAMP_KIND, TIER_KIND, IntentBatch, PairKey


@dataclass(frozen=True)
class PairChange:
    """What one reconcile tick decided for a (PoP, group)."""

    key: PairKey
    weights: GroupWeights
    controller: ControllerState
    tier_state: TierState | None = None  # None: the tier step did not run
    ramp: RampState | None = None  # None: the ramp step did not run
    tier_actions: TierActions | None = None  # the actions in force; read only with a tier_state


@dataclass(frozen=True)
class TickChanges:
    """The pairs whose intent a tick changes, and to what (None: back to the default, removed)."""

    weights: Mapping[PairKey, GroupWeights] = field(default_factory=dict)
    controllers: Mapping[PairKey, ControllerState] = field(default_factory=dict)
    tier_states: Mapping[PairKey, TierState | None] = field(default_factory=dict)
    ramps: Mapping[PairKey, RampState | None] = field(default_factory=dict)
    tier_actions: Mapping[PairKey, TierActions | None] = field(default_factory=dict)
    # (PoP, group, weights, streaks) of each pair whose weights or streaks changed: its row
    rows: tuple[tuple[str, str, GroupWeights, ControllerState], ...] = ()
    pops: frozenset[str] = frozenset()  # PoPs whose output (what Envoys get) may change

    def __bool__(self) -> bool:
        return bool(self.rows or self.tier_states or self.ramps or self.tier_actions)

    def batch(self, desired_digest: str) -> IntentBatch:
        """The store write that saves these changes (empty when nothing is stored)."""
        records: tuple[tuple[str, str, Any], ...] = (
            *((TIER_KIND, tier_key(*key), None if state is None else state.to_dict())
              for key, state in self.tier_states.items()),
            *((RAMP_KIND, ramp_key(*key), None if ramp is None else ramp.to_dict())
              for key, ramp in self.ramps.items()),
        )
        if not self.rows and not records:
            return IntentBatch()
        return IntentBatch(groups=self.rows, records=records, desired_digest=desired_digest)


def changes_of(running: RunningIntent, decided: Sequence[PairChange]) -> TickChanges:
    """What `decided` changes in `running`: only the pairs, and the parts, that differ."""
    weights: dict[PairKey, GroupWeights] = {}
    controllers: dict[PairKey, ControllerState] = {}
    tiers: dict[PairKey, TierState | None] = {}
    ramps: dict[PairKey, RampState | None] = {}
    actions: dict[PairKey, TierActions | None] = {}
    rows: list[tuple[str, str, GroupWeights, ControllerState]] = []
    pops: set[str] = set()
    for pair in decided:
        key = pair.key
        held = running.weights_of(*key)
        moved = pair.weights != held
        if moved:
            weights[key] = dict(pair.weights)
            pops.add(key[0])
        if pair.controller != running.controllers.get(key, ControllerState()):
            controllers[key] = pair.controller
        if moved or key in controllers:
            rows.append((*key, dict(pair.weights), pair.controller))
        if pair.tier_state is not None:
            if pair.tier_state != running.tier_states.get(key, TierState()):
                tiers[key] = None if pair.tier_state.idle else pair.tier_state
            if pair.tier_actions != running.tier_actions.get(key):
                actions[key] = pair.tier_actions
                pops.add(key[0])
        if pair.ramp is not None and pair.ramp != running.ramps.get(key, RampState()):
            ramps[key] = None if pair.ramp == RampState() else pair.ramp
    after = applied(running, TickChanges(ramps=ramps, controllers=controllers))
    pops.update(key[0] for key in ramps if running.mirror(*key) != after.mirror(*key)
                or running.hedge_share(*key) != after.hedge_share(*key))
    pops.update(key[0] for key in controllers if running.sick(*key) != after.sick(*key))
    return TickChanges(weights, controllers, tiers, ramps, actions, tuple(rows), frozenset(pops))


def applied(running: RunningIntent, changes: TickChanges) -> RunningIntent:
    """`running` with `changes` laid over it, pair by pair (maps without changes are shared)."""
    if not (changes.weights or changes.controllers or changes.tier_states or changes.ramps
            or changes.tier_actions):
        return running
    return replace(
        running,
        weights=_merged(running.weights, changes.weights),
        controllers=_merged(running.controllers, changes.controllers),
        tier_states=_merged(running.tier_states, changes.tier_states),
        ramps=_merged(running.ramps, changes.ramps),
        tier_actions=_merged(running.tier_actions, changes.tier_actions),
    )


def _merged(held: Mapping[PairKey, Any], changes: Mapping[PairKey, Any | None]
            ) -> Mapping[PairKey, Any]:
    """`held` with `changes` applied (None: removed); `held` itself when nothing changes."""
    if not changes:
        return held
    merged = dict(held)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
