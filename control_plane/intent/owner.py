"""`IntentOwner`: the one holder of the running intent, and the only writer of its store.

Everything that changes what runs goes through here. What Envoys may see changes through the
change transaction (`change()`, `change.py`): a reconcile tick's pair changes, a hot reload's new
desired state (the `carry_over` rule), a replica adopting what the store holds — each takes the
lock, prepares the output off the loop, saves, records and swaps, in that order. The start-up
restore (`restore`, the same carry-over rule applied to what the store held) runs before
anything is served. The owner keeps one immutable `RunningIntent` and swaps it whole.

The output is published through a `Publisher` (the app's ADS output cache), which rebuilds the
output of the PoPs concerned from the new intent. If that raises (a translation failed), the
owner keeps the intent it had: a change is never half-applied. There is no other way to change
what is served: tests and benchmarks that set a state use the same transaction
(`harness/intent_changes.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired.model import Desired, GroupWeights, OriginGroup, TierActions
from control_plane.intent.carry_over import CarryOver, carry_over
from control_plane.intent.change import Change, Publisher, Records, SwapFailed
from control_plane.intent.running import RunningIntent, tier_key
from control_plane.intent.served import served_of
from control_plane.intent.store import (
    RAMP_KIND,
    IntentBatch,
    IntentStore,
    PairKey,
    PartlyWritten,
    StateCorrupted,
    StoredIntent,
    StoreRecord,
)
from control_plane.translate import UnknownPop
from control_plane.translate.served import Served
from control_plane.translate.weights import WeightsError

log = logging.getLogger(__name__)

class IntentOwner:
    def __init__(
        self,
        desired: Desired,
        *,
        store: IntentStore | None = None,
        output: Publisher[Any] | None = None,
        recorder: DecisionRecorder | None = None,
        serving: Mapping[str, Desired] | None = None,
    ) -> None:
        self._intent = RunningIntent(desired, serving=dict(serving or {}))
        self._served = served_of(self._intent)  # what the output cache translates from
        self.store = store
        self._output = output
        self.recorder = recorder
        # held by a change from its save to its swap, so two changes never interleave
        self.changing = asyncio.Lock()
        # what puts the store back after a write that landed in part and could not be undone
        # at once (`PartlyWritten`): written before the next save
        self._repair: IntentBatch | None = None

    def connect(self, output: Publisher[Any]) -> None:
        """Where changes of what Envoys get are published (the app's output cache)."""
        self._output = output

    # -- the change transaction ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def change(self, *, save: bool = True) -> AsyncIterator[Change]:
        """The one transaction for everything that changes what is served (`change.py`): what
        the body states is prepared off the loop; then, under the lock, saved (unless `save`
        is False: what a follower adopts is saved by its leader), recorded and swapped. What
        raises in the body, the prepare or the save changes nothing (a save that landed in part,
        `PartlyWritten`, is put back); a swap that raises puts the store back and raises
        `SwapFailed`; a change planned for a desired state replaced
        meanwhile raises `StaleChange`."""
        change = Change(lambda: (self._intent, self._served), self._output, self.changing)
        yield change
        await self._publish(change, save=save)

    async def _publish(self, change: Change, *, save: bool) -> None:
        stated, prepared, changed = await change.outcome()
        async with self.changing:
            if stated is not None and self._intent is not change.over:
                stated = await change.stated()  # over what landed since the prepare
            saved = False
            if stated is not None and save and self.store is not None and stated.save:
                await self._repaired()
                try:
                    await self.store.write(stated.save)
                except PartlyWritten:
                    await self._put_back(stated.undo)  # the store follows what is served
                    raise
                saved = True
            drafts = change.drafts(changed)
            if drafts:
                if self.recorder is None:
                    raise RuntimeError("records without a recorder to write them")
                await self.recorder.write_synced(drafts)  # durable before anything is pushed
            if stated is None:
                return
            old, old_served = self._intent, self._served  # only a change changes them
            try:
                assert stated.served is not None
                self._intent, self._served = stated.target, stated.served
                if prepared is not None and self._output is not None:
                    change.pushed = self._output.commit(prepared, stated.served)
            except Exception as err:
                self._intent, self._served = old, old_served
                if saved and self.store is not None:
                    await self.store.write(stated.undo)  # the store follows what is served
                raise SwapFailed(f"{type(err).__name__}: {err}") from err

    async def _put_back(self, undo: IntentBatch) -> None:
        """After a write that landed in part: the old values of what it was to save, now, or
        (the store still failing) before the next save."""
        assert self.store is not None
        try:
            await self.store.write(undo)
        except Exception as err:
            log.warning("putting the store back after a partial write failed (%s: %s): it is "
                        "put back before the next write", type(err).__name__, err)
            self._repair = undo
        else:
            self._repair = None

    async def _repaired(self) -> None:
        """The store put back (`_put_back`) before anything else is saved; raises (the change
        then saves nothing) while it cannot be."""
        if self._repair is not None and self.store is not None:
            await self.store.write(self._repair)
            self._repair = None

    # -- reading ---------------------------------------------------------------------------

    @property
    def intent(self) -> RunningIntent:
        return self._intent

    @property
    def served(self) -> Served:
        """The running intent as the output cache translates it (`translate/served.py`)."""
        return self._served

    @property
    def desired(self) -> Desired:
        return self._intent.desired

    def has_pop(self, pop: str) -> bool:
        return pop in self._intent.pop_names

    def weights(self, pop: str, group: str) -> GroupWeights:
        """Current weights of (PoP, origin group): the controller's, else the home weights."""
        self._check_pop(pop)
        self._group(group, pop)
        return self._intent.weights_of(pop, group)

    def tier_actions(self, pop: str, group: str) -> TierActions | None:
        """The tier actions active for (PoP, group); None when none are."""
        self._check_pop(pop)
        return self._intent.tier_actions.get((pop, group))

    def all_weights(self) -> dict[str, dict[str, GroupWeights]]:
        intent = self._intent
        return {
            pop: {g.name: intent.weights_of(pop, g.name)
                  for g in intent.desired_of(pop).origin_groups}
            for pop in intent.pop_names
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

    # -- restore and adopt ----------------------------------------------------------------

    def carried(self, stored: StoredIntent, *, where: str,
                desired: Desired | None = None,
                serving: Mapping[str, Desired] | None = None) -> CarryOver:
        """What the store held as the running intent under `desired` (default: the running
        one's) with the PoPs of `serving` on theirs: the carry-over rule a reload applies. Pure;
        StateCorrupted (naming `where`) for a tier or ramp state that does not parse."""
        desired = self._intent.desired if desired is None else desired
        serving = self._intent.serving if serving is None else serving
        return carry_over(self._stored(stored, where, desired, serving), desired, serving)

    async def restore(self, stored: StoredIntent, *, where: str, save: bool = True,
                      keep: tuple[Sequence[StoreRecord], Sequence[StoreRecord]] = ((), ()),
                      records: Callable[[CarryOver], Records] = lambda carried: ()
                      ) -> CarryOver:
        """Start-up: what the store held (`carried`) made the running intent, in one change
        transaction with its bookkeeping: the digest of the desired state it runs under, the
        ramp records of pairs it no longer has deleted, the store records `keep` holds
        (records, undo: a rollout's versions) saved with them (none of it when `save` is False:
        a replica's store is its leader's to write), and `records(carried)` recorded."""
        carried = self.carried(stored, where=where)
        gone = sorted(set(stored.ramps) - {tier_key(*key) for key in carried.intent.ramps})
        forgotten: list[StoreRecord] = [(RAMP_KIND, key, None) for key in gone]
        put_back: list[StoreRecord] = [(RAMP_KIND, key, stored.ramps[key]) for key in gone]
        async with self.change(save=save) as change:
            change.replace(lambda base: (carried.intent, None),
                           digest=carried.intent.desired.digest,
                           undo_digest=stored.desired_digest)
            change.keep([*forgotten, *keep[0]], [*put_back, *keep[1]])
            change.record(records(carried))
        self._repair = None  # what is stored is what runs now
        return carried

    async def adopt(self, stored: StoredIntent, *, where: str,
                    desired: Desired | None = None,
                    serving: Mapping[str, Desired] | None = None,
                    keep: tuple[Sequence[StoreRecord], Sequence[StoreRecord]] = ((), ()),
                    records: Records = ()) -> frozenset[str]:
        """What a shared store holds now (another replica decided it), made the running intent
        under the same rule as `restore`, in one change transaction: with a rollout's
        `desired` state and the PoPs of `serving` on theirs when given (which PoP serves which
        version comes with the intent that goes with it), saving nothing but what `keep`
        holds (records, undo: a new leader's bookkeeping; the rest is saved by the replica
        that decided it), recording `records`. Only the PoPs whose desired state, weights,
        tier actions or mirrors differ are re-built; returns the PoPs whose output changed. A
        store put back after a partial write of this replica's is not any more: what it
        holds is what runs."""
        def adopted(old: RunningIntent) -> tuple[RunningIntent, set[str]]:
            new = self.carried(stored, where=where,
                               desired=old.desired if desired is None else desired,
                               serving=old.serving if serving is None else serving).intent
            return new, {
                pop for pop in {*old.pop_names, *new.pop_names}
                if pop not in old.pop_names or pop not in new.pop_names
                or old.desired_of(pop) is not new.desired_of(pop)} | {
                pop for pop, group in old.pairs()
                if (pop, group) in set(new.pairs()) and (
                    new.weights_of(pop, group) != old.weights_of(pop, group)
                    or new.tier_actions.get((pop, group)) != old.tier_actions.get((pop, group))
                    or new.mirror(pop, group) != old.mirror(pop, group))}

        async with self.change(save=bool(keep[0])) as change:
            change.replace(adopted)
            if keep[0]:
                change.keep(*keep)
            change.record(records)
        self._repair = None
        return change.pushed

    def _stored(self, stored: StoredIntent, where: str, desired: Desired,
                serving: Mapping[str, Desired]) -> RunningIntent:
        """What a store holds as a running intent under `desired` and `serving` (before the
        carry-over rule); StateCorrupted for a tier or ramp state that does not parse."""
        keys = {tier_key(*k): k
                for k in RunningIntent(desired, serving=dict(serving)).pairs()}
        tier_states = _parsed(stored.tier_decisions, TierState.from_dict, keys,
                              f"{where}: tier decision")
        ramps = _parsed(stored.ramps, RampState.from_dict, keys, f"{where}: ramp")
        return RunningIntent(
            desired=desired,
            serving=serving,
            weights={k: dict(s.weights) for k, s in sorted(stored.groups.items())},
            controllers={k: s.controller for k, s in sorted(stored.groups.items())},
            tier_states=tier_states,
            ramps=ramps,
        )

    # -- internals -------------------------------------------------------------------------

    def _check_pop(self, pop: str) -> None:
        if not self.has_pop(pop):
            known = ", ".join(self._intent.pop_names)
            raise UnknownPop(f"unknown PoP {pop!r}; known: {known}")

    def _group(self, name: str, pop: str) -> OriginGroup:
        groups = self._intent.desired_of(pop).origin_groups
        for group in groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in groups)
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

