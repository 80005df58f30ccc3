"""The one rule for what running intent survives a desired-state change.

`carry_over(intent, new)` is pure. Hot reload applies its result, start-up restore applies it to
what the store held, `ballast plan` renders with it, and the `config_applied` diff is computed
from it, so what a reload says it changes is what is pushed. Per (PoP, origin group):

- a pair the new desired state no longer has (PoP or group gone) loses everything;
- the controller's weights survive when they still fit the group (exactly its origins, whole
  numbers >= 0 summing to 100); otherwise the pair starts over at its home weights, and the
  reason is in `notes`;
- the controller's streaks, the tier controller's state and the standby ramp's state survive
  with the pair;
- during a rollout each PoP's pairs are judged against the desired state that PoP serves
  afterwards (`serving`: PoP -> its desired state while that is not `new`);
- tier actions are what the *new* policy makes of the pair's tier state (`actions_in_force`, as
  the next reconcile tick would); actions set without a tier state (by hand) survive while the
  group still has the tiers they name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from control_plane.decide.tiers import actions_in_force
from control_plane.desired.model import Desired, GroupWeights, OriginGroup, TierActions
from control_plane.intent.running import PairKey, RunningIntent
from control_plane.translate.routes import check_tier_actions
from control_plane.translate.weights import WeightsError, check_group_weights


@dataclass(frozen=True)
class CarryOver:
    intent: RunningIntent  # the running intent under the new desired state
    notes: dict[PairKey, str] = field(default_factory=dict)  # why a pair's weights start over

    def dropped(self, before: RunningIntent) -> list[PairKey]:
        """Pairs whose weights did not survive, sorted."""
        return sorted(set(before.weights) - set(self.intent.weights))


def carry_over(intent: RunningIntent, new: Desired,
               serving: Mapping[str, Desired] | None = None) -> CarryOver:
    """`intent` carried over to the target `new`, each PoP of `serving` on its own desired
    state (None: every PoP on `new`)."""
    on_own = {pop: desired for pop, desired in (serving or {}).items()
              if desired.digest != new.digest}
    groups = {d.digest: {group.name: group for group in d.origin_groups}
              for d in (new, *on_own.values())}

    def kept(key: PairKey) -> OriginGroup | None:
        pop, name = key
        desired = on_own.get(pop, new)
        return groups[desired.digest].get(name) if pop in desired.pop_names else None

    weights: dict[PairKey, GroupWeights] = {}
    notes: dict[PairKey, str] = {}
    for key, held in intent.weights.items():
        group = kept(key)
        if group is None:
            continue
        try:
            check_group_weights(group, held)
        except WeightsError as err:
            notes[key] = str(err)
            continue
        weights[key] = dict(held)
    actions: dict[PairKey, TierActions] = {}
    for key, state in intent.tier_states.items():
        group = kept(key)
        in_force = None if group is None else actions_in_force(group, state)
        if in_force is not None:
            actions[key] = in_force
    for key, held_actions in intent.tier_actions.items():
        group = kept(key)
        if group is None or key in intent.tier_states:
            continue
        try:
            check_tier_actions(group, held_actions)
        except ValueError:
            continue
        actions[key] = held_actions
    return CarryOver(
        RunningIntent(
            desired=new,
            weights=weights,
            tier_actions=actions,
            controllers={k: s for k, s in intent.controllers.items() if kept(k) is not None},
            tier_states={k: s for k, s in intent.tier_states.items() if kept(k) is not None},
            ramps={k: s for k, s in intent.ramps.items() if kept(k) is not None},
            serving=on_own,
        ),
        notes,
    )
