"""The running intent: everything Ballast has decided on top of the desired state, as one value.

A `RunningIntent` is immutable and plain: the desired state it runs under, and per (PoP, origin
group) the weights the controller set (pairs without are at their home weights), the tier
actions active, the controller's streaks, the tier controller's state and the standby ramp's
state (which also says whether a cache-warming mirror runs: `mirror`). The owner
(`owner.py`) swaps whole values; the pure carry-over rule (`carry_over.py`) maps one to the next
across a desired-state change.

During a rollout PoPs serve different desired states at once: `desired` is the rollout's target,
and `serving` holds, per PoP not (yet, or no longer) on the target, the desired state that PoP
serves (`desired_of(pop)`). Everything per PoP — its translation (`for_pop` with
`desired_of`), its pairs, home weights, tier policies and mirrors — reads that PoP's own desired
state, so a PoP outside the rollout's waves gets byte-identical resources.

A new kind of intent (say, a ramp per (PoP, group)) is a new field here, its line in
`carry_over`, and a record kind in the store (`IntentBatch.records`: kind -> key -> JSON value,
saved and read back by every store without a schema change).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState, active_mirror, hedge_share
from control_plane.decide.tiers import TierState
from control_plane.desired.model import Desired, GroupWeights, Mirror, TierActions
from control_plane.intent.store import PairKey
from control_plane.translate.pop import PopIntent


@dataclass(frozen=True)
class RunningIntent:
    desired: Desired
    weights: Mapping[PairKey, GroupWeights] = field(default_factory=dict)
    tier_actions: Mapping[PairKey, TierActions] = field(default_factory=dict)
    controllers: Mapping[PairKey, ControllerState] = field(default_factory=dict)
    tier_states: Mapping[PairKey, TierState] = field(default_factory=dict)
    ramps: Mapping[PairKey, RampState] = field(default_factory=dict)
    # PoP -> the desired state it serves while that is not `desired` (a rollout in progress)
    serving: Mapping[str, Desired] = field(default_factory=dict)

    def desired_of(self, pop: str) -> Desired:
        """The desired state `pop` serves: its own during a rollout, else `desired`."""
        return self.serving.get(pop, self.desired)

    @property
    def pop_names(self) -> tuple[str, ...]:
        """Every PoP served: the target's, then those only an older desired state still has."""
        if not self.serving:
            return self.desired.pop_names
        extra = [p for p in self.serving if p not in self.desired.pop_names]
        return (*self.desired.pop_names, *sorted(extra))

    def versions(self) -> dict[str, str]:
        """PoP -> the digest of the desired state it serves."""
        return {pop: self.desired_of(pop).digest for pop in self.pop_names}

    def pairs(self) -> list[PairKey]:
        """Every (PoP, group) served, PoPs in order, each PoP's groups (of the desired state it
        serves) in order."""
        return [(p, g.name) for p in self.pop_names
                for g in self.desired_of(p).origin_groups]

    def pops_on(self, desired: Desired) -> list[str]:
        """The PoPs serving `desired` (by digest)."""
        return [p for p in self.pop_names if self.desired_of(p).digest == desired.digest]

    def weights_of(self, pop: str, group: str) -> GroupWeights:
        """The weights in force: the controller's, else the group's home weights in `pop`."""
        held = self.weights.get((pop, group))
        if held is not None:
            return dict(held)
        return self.desired_of(pop).group(group).home_weights(pop)

    def pop_weights(self, pop: str) -> dict[str, GroupWeights]:
        """group -> weights the controller set in `pop` (the others are at home)."""
        return {g: dict(w) for (p, g), w in self.weights.items() if p == pop}

    def pop_tier_actions(self, pop: str) -> dict[str, TierActions]:
        """group -> the tier actions active in `pop`."""
        return {g: a for (p, g), a in self.tier_actions.items() if p == pop}

    def mirror(self, pop: str, group: str) -> Mirror | None:
        """The cache-warming mirror of (PoP, group): on while a standby ramps there (it follows
        from the ramp state and the group's policy, so it is persisted and restored with it)."""
        state = self.ramps.get((pop, group))
        if state is None:
            return None
        return active_mirror(self.desired_of(pop).group(group), state)

    def sick(self, pop: str, group: str) -> frozenset[str]:
        """The origins of a group with session affinity that the controller holds sick in
        `pop` (a session may not stay on them); empty for a group without affinity."""
        state = self.controllers.get((pop, group))
        found = self.desired_of(pop).group(group)
        if state is None or found.affinity is None:
            return frozenset()
        need = found.failover.breach_windows
        return frozenset(name for name, count in state.unhealthy_windows.items()
                         if count >= need)

    def pop_sick(self, pop: str) -> dict[str, frozenset[str]]:
        """group -> its sick origins in `pop` (groups with session affinity and a sick one)."""
        return {g: sick for (p, g) in self.controllers if p == pop
                for sick in (self.sick(p, g),) if sick}

    def pop_mirrors(self, pop: str) -> dict[str, Mirror]:
        """group -> the cache-warming mirror active in `pop`."""
        return {g: m for (p, g) in self.ramps if p == pop
                for m in (self.mirror(p, g),) if m is not None}

    def hedge_share(self, pop: str, group: str) -> int | None:
        """Per million of the group's hedged-tier requests that may hedge in `pop` while a
        standby is guarded by its ramp (`decide/ramp.py` `hedge_share`); None: every one. It
        follows from the weights, the ramp state and the group's policy."""
        found = self.desired_of(pop).group(group)
        return hedge_share(found, found.preference[pop], self.weights_of(pop, group),
                           self.ramps.get((pop, group)))

    def pop_hedges(self, pop: str) -> dict[str, int]:
        """group -> per million of its hedged-tier requests that may hedge (guarded groups)."""
        return {g.name: share for g in self.desired_of(pop).origin_groups
                for share in (self.hedge_share(pop, g.name),) if share is not None}

    def for_pop(self, pop: str) -> PopIntent:
        """Everything `pop`'s translation takes from this intent (`translate_pop`'s input):
        the weights the controller set, the tier actions active, the mirrors on, the sick
        origins of groups with session affinity, the hedging a ramp guards."""
        return PopIntent(weights=self.pop_weights(pop), tier_actions=self.pop_tier_actions(pop),
                         mirrors=self.pop_mirrors(pop), sick=self.pop_sick(pop),
                         hedges=self.pop_hedges(pop))


def tier_key(pop: str, group: str) -> str:
    """The store key of a (PoP, group)'s records (tier state, ramp): "<pop>/<group>"."""
    return f"{pop}/{group}"


ramp_key = tier_key
