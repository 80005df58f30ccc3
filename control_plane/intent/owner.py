"""`IntentOwner`: the one holder of the running intent, and the only writer of its store.

Everything that changes what runs goes through here: the reconcile loop's weights, streaks,
tier states, ramp states and tier actions, a hot reload (`update_desired`, the `carry_over`
rule), the start-up restore (`restore`, the same rule applied to what the store held). The
owner keeps one immutable `RunningIntent` and swaps it whole.

After each change of what Envoys get, the owner tells its `Output` — wired by the app to the
ADS output cache — which rebuilds the output of the PoPs concerned from the new intent and
returns the PoPs whose output really changed. If that raises (a translation failed), the owner
keeps the intent it had and re-raises: a change is never half-applied. Streaks and tier states
change no output and publish nothing; a ramp state publishes its PoP when the cache-warming
mirror it implies starts or stops (routes only).

A reconcile tick's changes (`steps.TickChanges`) go through in three parts, so that the event
loop only does what costs what changed: `prepare_changes` (the output of the PoPs concerned,
built by a call that may run on a worker thread), `save_changes` (one store write) and
`apply_changes` (the swap, and the prepared output committed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState
from control_plane.desired.model import Desired, GroupWeights, OriginGroup, TierActions
from control_plane.intent.carry_over import CarryOver, carry_over
from control_plane.intent.running import RunningIntent, tier_key
from control_plane.intent.steps import TickChanges, applied
from control_plane.intent.store import (
    RAMP_KIND,
    TIER_KIND,
    IntentBatch,
    IntentStore,
    PairKey,
    Snapshot,
    StateCorrupted,
)
from control_plane.translate import UnknownPop
from control_plane.translate.routes import check_tier_actions
from control_plane.translate.weights import WeightsError, check_group_weights


class Output(Protocol):
    """Where the running intent becomes what Envoys get (the app's ADS output cache)."""

    def update(self, source: RunningIntent, pops: Collection[str] | None) -> frozenset[str]:
        """Rebuild the output of `pops` (None: all) from `source`; the PoPs that changed."""
        ...

    def prepare(self, source: RunningIntent, pops: Collection[str] | None = None
                ) -> Callable[[], Any]:
        """A call that builds the output of `pops` for `source` touching nothing (a worker
        thread may run it); `commit` applies what it returns."""
        ...

    def commit(self, prepared: Any, source: RunningIntent) -> frozenset[str]:
        """Swap in what a prepared call built, with `source` (which may be newer)."""
        ...


class IntentOwner:
    def __init__(
        self,
        desired: Desired,
        *,
        store: IntentStore | None = None,
        output: Output | None = None,
    ) -> None:
        self._intent = RunningIntent(desired)
        self.store = store
        self._output = output
        # held by a change that awaits between its parts (a tick's save, log and swap; a
        # reload's save and swap), so two such changes never interleave
        self.changing = asyncio.Lock()

    def connect(self, output: Output) -> None:
        """Where changes of what Envoys get are published (the app's output cache)."""
        self._output = output

    # -- reading ---------------------------------------------------------------------------

    @property
    def intent(self) -> RunningIntent:
        return self._intent

    @property
    def desired(self) -> Desired:
        return self._intent.desired

    def has_pop(self, pop: str) -> bool:
        return pop in self._intent.desired.pop_names

    def weights(self, pop: str, group: str) -> GroupWeights:
        """Current weights of (PoP, origin group): the controller's, else the home weights."""
        self._check_pop(pop)
        self._group(group)
        return self._intent.weights_of(pop, group)

    def tier_actions(self, pop: str, group: str) -> TierActions | None:
        """The tier actions active for (PoP, group); None when none are."""
        self._check_pop(pop)
        return self._intent.tier_actions.get((pop, group))

    def all_weights(self) -> dict[str, dict[str, GroupWeights]]:
        desired = self._intent.desired
        return {
            pop: {g.name: self._intent.weights_of(pop, g.name) for g in desired.origin_groups}
            for pop in desired.pop_names
        }

    def pushed_weights(self) -> dict[str, dict[str, GroupWeights]]:
        """Only the weights the controller set (every other pair is at its home weights): for
        faces of a large fleet that look for pairs away from home."""
        pushed: dict[str, dict[str, GroupWeights]] = {}
        for (pop, group), weights in self._intent.weights.items():
            pushed.setdefault(pop, {})[group] = dict(weights)
        return pushed

    def all_tier_actions(self) -> dict[str, dict[str, TierActions]]:
        """PoP -> group -> active tier actions, only where some are active."""
        active: dict[str, dict[str, TierActions]] = {}
        for (pop, group), actions in self._intent.tier_actions.items():
            active.setdefault(pop, {})[group] = actions
        return active

    def controller(self, key: PairKey) -> ControllerState:
        return self._intent.controllers.get(key, ControllerState())

    def tier_state(self, key: PairKey) -> TierState:
        return self._intent.tier_states.get(key, TierState())

    def ramp_state(self, key: PairKey) -> RampState:
        return self._intent.ramps.get(key, RampState())

    # -- what Envoys get -------------------------------------------------------------------

    def update_weights(self, pop: str, group: str, weights: Mapping[str, int]) -> bool:
        """Set one (PoP, group)'s weights; True if the PoP's output changed.

        Raises `UnknownPop` / `WeightsError` (intent untouched) for weights that do not fit.
        """
        self._check_pop(pop)
        check_group_weights(self._group(group), weights)
        held = {**self._intent.weights, (pop, group): dict(weights)}
        return bool(self._swap(replace(self._intent, weights=held), {pop}))

    def set_tier_actions(self, pop: str, group: str, actions: TierActions | None) -> bool:
        """Set (or with None, lift) one (PoP, group)'s active tier actions; True if the PoP's
        output changed (only its routes can).

        Raises `UnknownPop` / `WeightsError` / ValueError (intent untouched) when they do not fit.
        """
        self._check_pop(pop)
        if actions is not None:
            check_tier_actions(self._group(group), actions)
        if self._intent.tier_actions.get((pop, group)) == actions:
            return False
        active = dict(self._intent.tier_actions)
        if actions is None:
            active.pop((pop, group), None)
        else:
            active[(pop, group)] = actions
        return bool(self._swap(replace(self._intent, tier_actions=active), {pop}))

    def update_desired(self, desired: Desired) -> frozenset[str]:
        """Swap in a new desired state under the carry-over rule; the PoPs whose output changed
        (PoPs that disappeared count as changed, so their streams can be told)."""
        return self.apply(carry_over(self._intent, desired))

    def apply(
        self, carried: CarryOver, commit: Callable[[RunningIntent], frozenset[str]] | None = None
    ) -> frozenset[str]:
        """Make `carried.intent` (a `carry_over` of the current intent) the running intent.
        `commit(intent)` publishes it instead of a rebuild of every PoP (a reload whose
        output was built off the event loop)."""
        if commit is None:
            return self._swap(carried.intent, None)
        old, self._intent = self._intent, carried.intent
        try:
            return commit(carried.intent)
        except BaseException:
            self._intent = old
            raise

    def restore(self, snapshot: Snapshot, *, where: str) -> CarryOver:
        """What the store held, carried over to the current desired state, made the running
        intent. A tier or ramp state that does not parse raises StateCorrupted (naming
        `where`)."""
        carried = carry_over(self._stored(snapshot, where), self._intent.desired)
        self.apply(carried)
        return carried

    def adopt(self, snapshot: Snapshot, *, where: str) -> frozenset[str]:
        """What a shared store holds now (another replica decided it), made the running intent
        under the same rule as `restore`; only the PoPs whose weights or tier actions differ are
        re-built. The PoPs whose output changed."""
        new = carry_over(self._stored(snapshot, where), self._intent.desired).intent
        old = self._intent
        pops = {pop for pop, group in old.pairs()
                if new.weights_of(pop, group) != old.weights_of(pop, group)
                or new.tier_actions.get((pop, group)) != old.tier_actions.get((pop, group))}
        return self._swap(new, pops)

    def _stored(self, snapshot: Snapshot, where: str) -> RunningIntent:
        """A store's snapshot as a running intent under the current desired state (before the
        carry-over rule); StateCorrupted for a tier or ramp state that does not parse."""
        keys = {tier_key(*k): k for k in self._intent.pairs()}
        tier_states = _parsed(snapshot.tier_decisions, TierState.from_dict, keys,
                              f"{where}: tier decision")
        ramps = _parsed(snapshot.ramps, RampState.from_dict, keys, f"{where}: ramp")
        return RunningIntent(
            desired=self._intent.desired,
            weights={k: dict(s.weights) for k, s in sorted(snapshot.groups.items())},
            controllers={k: s.controller for k, s in sorted(snapshot.groups.items())},
            tier_states=tier_states,
            ramps=ramps,
        )

    # -- streaks and persistence -----------------------------------------------------------

    def prepare_changes(
        self, base: RunningIntent, changes: TickChanges
    ) -> Callable[[], Any] | None:
        """A call that builds, for `changes` laid over `base`, the output of the PoPs they
        concern, touching nothing (a worker thread may run it); None when there is nothing to
        build. `apply_changes` commits what it returns."""
        if self._output is None or not changes.pops:
            return None
        return self._output.prepare(applied(base, changes), changes.pops)

    async def save_changes(self, changes: TickChanges, desired: Desired) -> None:
        """A tick's changes saved in one store write (nothing when nothing is stored)."""
        batch = changes.batch(desired.digest)
        if self.store is not None and batch:
            await self.store.write(batch)

    def apply_changes(self, changes: TickChanges, prepared: Any = None) -> frozenset[str]:
        """`changes` laid over the running intent (pair by pair: changes made meanwhile to other
        pairs stay) and published: by committing `prepared` (from `prepare_changes`), else by
        rebuilding the PoPs concerned now. The PoPs whose output changed."""
        new = applied(self._intent, changes)
        if prepared is None:
            return self._swap(new, changes.pops) if changes.pops else self._set(new)
        output = self._output
        if output is None:
            raise RuntimeError("prepared output without an output to commit it to")
        old, self._intent = self._intent, new
        try:
            return output.commit(prepared, new)
        except BaseException:
            self._intent = old
            raise

    async def save_desired(self, before: RunningIntent, after: RunningIntent) -> None:
        """A desired-state change from `before` to `after` (its carry-over) saved: the new
        digest, and the pairs that are gone forgotten; one write, before the change applies."""
        if self.store is None:
            return
        gone = sorted(set(before.pairs()) - set(after.pairs()))
        await self.store.write(IntentBatch(
            forget_groups=tuple(gone),
            records=tuple((kind, tier_key(*key), None)
                          for key in gone for kind in (TIER_KIND, RAMP_KIND)),
            desired_digest=after.desired.digest,
        ))

    async def forget_records(self, kind: str, keys: Iterable[str]) -> None:
        """Delete stored records (e.g. of pairs a restore dropped)."""
        if self.store is not None and keys:
            await self.store.write(IntentBatch(records=tuple((kind, k, None) for k in keys)))

    async def save_digest(self) -> None:
        if self.store is not None:
            await self.store.write(IntentBatch(desired_digest=self._intent.desired.digest))

    # -- internals -------------------------------------------------------------------------

    def _swap(self, new: RunningIntent, pops: Iterable[str] | None) -> frozenset[str]:
        old, self._intent = self._intent, new
        if self._output is None:
            return frozenset()
        try:
            return self._output.update(new, None if pops is None else frozenset(pops))
        except BaseException:
            self._intent = old
            raise

    def _set(self, new: RunningIntent) -> frozenset[str]:
        """A change that alters no output."""
        self._intent = new
        return frozenset()

    def _check_pop(self, pop: str) -> None:
        if not self.has_pop(pop):
            known = ", ".join(self._intent.desired.pop_names)
            raise UnknownPop(f"unknown PoP {pop!r}; known: {known}")

    def _group(self, name: str) -> OriginGroup:
        for group in self._intent.desired.origin_groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in self._intent.desired.origin_groups)
        raise WeightsError(f"unknown origin group {name!r}; known: {known}")


def _parsed(
    stored: Mapping[str, Any], parse: Callable[[Any], Any], keys: Mapping[str, PairKey],
    what: str,
) -> dict[PairKey, Any]:
    """Stored records ("<pop>/<group>" -> JSON) parsed, keyed by the pairs the desired state
    still has; StateCorrupted (naming `what` and the key) for one that does not parse."""
    parsed: dict[PairKey, Any] = {}
    for key, value in sorted(stored.items()):
        try:
            state = parse(value)
        except ValueError as exc:
            raise StateCorrupted(f"{what} {key!r}: {exc}") from exc
        if key in keys:
            parsed[keys[key]] = state
    return parsed

