"""The change transaction: the one way what is served changes.

Every change of the running intent that Envoys may see — a reconcile tick's pair changes, a hot
reload's new desired state, a replica adopting what another one decided, and anything later
(staged rollouts) — is stated in a `Change` and published by `IntentOwner.change`:

    async with owner.change() as change:
        change.tick(tick_changes, planned_for=desired)  # or .desired(new) / .replace(build)
        change.record(drafts)              # or a function of the PoPs whose output changes

The caller says *what* changes; the transaction does the *how*, always in this order:

1. **prepare**: what is stated is laid over the running intent (for a new desired state, the
   carry-over of every (PoP, group) pair) and the output of the PoPs concerned is built for the
   new intent as the output cache translates it (`served.py`, `Served`: the cache is handed
   what it serves, it never calls back) (`Publisher.prepare`), both on a worker thread,
   touching nothing served (`await change.prepare()` in the body does it early: to learn the
   PoPs that will change, or to handle a translation that raises);
2. **lock**: `owner.changing`, held until the swap, so two changes never interleave between
   their save and their swap. A change that landed while this one was prepared is not lost:
   what is stated is laid again over the intent running now (`Change.stated`, on a worker
   thread while the lock is held; the output cache re-builds, at the swap, the PoPs that
   change touched). Changes that keep landing during the prepare's lays cannot hold it off:
   after `RESTATE_TRIES` the next lay holds the lock. A tick planned for a desired state
   that a reload replaced meanwhile is stale (`StaleChange`) and dropped whole. The long work
   (the build) is done before the lock, so a tick never waits for a reload's translation;
3. **save**: one store write (`IntentBatch`), unless the change is not this process's to save
   (`owner.change(save=False)`: a follower adopting what its leader saved);
4. **record**: the records handed to the decision recorder in one write and made durable with
   one fsync (on a thread). A log that cannot be written (a full disk) does not stop the change:
   the recorder keeps the records until it can (`decisions/recorder.py`);
5. **swap**: the new intent becomes the running one and the prepared output is committed
   (`Publisher.commit`), which tells the ADS streams.

What fails leaves what is served and what is stored agreeing: a body, prepare or save that
raises changes nothing (the error goes to the caller, who records it); a swap that raises puts
the store back (`undo`, one write of the old values of what was saved) and keeps the old intent.
A save that landed in part (`PartlyWritten`: an etcd write split in several transactions, etcd
gone after the first) is put back the same way, at once or, while the store still fails, before
the owner's next save; until then (and for good if the replica loses the lead: a new leader
adopts what etcd holds) the store holds part of a change the leader never served or recorded.
No follower adopts it meanwhile: the write is marked under way (`etcd_store.marked`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from control_plane.decide.controller import ControllerState
from control_plane.decisions.log import Draft
from control_plane.desired.model import Desired
from control_plane.intent.carry_over import carry_over
from control_plane.intent.pair_changes import TickChanges, applied
from control_plane.intent.running import RunningIntent, tier_key
from control_plane.intent.served import served_of
from control_plane.intent.store import (
    RAMP_KIND,
    SERVING_KEY,
    SERVING_KIND,
    TIER_KIND,
    IntentBatch,
    PairKey,
    StoreRecord,
)
from control_plane.translate.resources import Capabilities, PopResources
from control_plane.translate.served import Served

P = TypeVar("P")

Records = Sequence[Draft] | Callable[[frozenset[str]], Sequence[Draft]]


class Publisher(Protocol[P]):
    """Where the running intent becomes what Envoys get (the ADS output cache): the one
    interface every change is published through. `P` is what `prepare` builds."""

    def prepare(self, source: Served, pops: Collection[str] | None = None
                ) -> Callable[[], P]:
        """A call that builds the output of `pops` (None: every PoP) for `source`, touching
        nothing served (a worker thread runs it)."""
        ...

    def changed(self, prepared: P) -> frozenset[str]:
        """The PoPs whose output `prepared` changes."""
        ...

    def cached(self, pop: str, caps: Capabilities) -> PopResources | None:
        """What `pop`'s nodes with `caps` are served now, where it was built (never builds)."""
        ...

    def prepared_entry(self, prepared: P, pop: str, caps: Capabilities) -> PopResources | None:
        """What `pop`'s nodes with `caps` get once `prepared` is committed, where it built
        that (None: it did not)."""
        ...

    def commit(self, prepared: P, source: Served) -> frozenset[str]:
        """Swap in what `prepared` holds with `source` as what the cache serves from; the PoPs
        whose output changed (announced to the streams)."""
        ...


class SwapFailed(Exception):
    """Publishing a change raised; the intent and the store were kept as they were."""


# How many times a change lays what it states over the running intent, before its turn under the
# lock, while other changes keep landing as it does (`Change.stated`). Each lay of a new desired
# state walks every pair on a worker thread; past these the next lay holds the owner's lock,
# holding ticks off for one lay rather than letting them hold the reload off for ever.
RESTATE_TRIES = 3


class StaleChange(Exception):
    """The change was stated for a desired state that is no longer the running one (a reload
    landed meanwhile); nothing of it was saved, recorded or swapped."""


@dataclass
class _Stated:
    target: RunningIntent
    pops: frozenset[str] | None  # PoPs whose output may change (None: every PoP)
    save: IntentBatch
    undo: IntentBatch
    served: Served | None = None  # `target` as the output cache translates it (`_laid`)


Statement = Callable[[RunningIntent], _Stated]


class Change:
    """One change being made under `IntentOwner.change` (see the module's docstring).

    What is stated is kept as a function of the intent it lays over, so that when another
    change landed between this one's start (`base`) and its turn under the lock, it is stated
    again over the intent running then (`stated`): nothing that landed meanwhile is lost.
    Stating (`tick`, `desired`, `keep`, `replace`) only keeps the function; it runs where the
    change prepares, on a worker thread."""

    def __init__(self, current: Callable[[], tuple[RunningIntent, Served]],
                 publisher: Publisher[Any] | None, changing: asyncio.Lock) -> None:
        self._now = current  # the running intent, and as the output cache translates it
        self._current = lambda: current()[0]
        self._changing = changing  # the owner's lock: only a change holding it changes current
        self.base = current()[0]
        self._publisher = publisher
        self._statement: Statement | None = None
        self._stated: _Stated | None = None
        self.over = self.base  # the intent what is stated now is laid over
        self._records: list[Records] = []
        self._kept: tuple[tuple[StoreRecord, ...], tuple[StoreRecord, ...]] = ((), ())
        self._prepared: tuple[_Stated, Any] | None = None
        self.pushed: frozenset[str] = frozenset()  # after the swap: the PoPs whose output changed

    # -- what changes ----------------------------------------------------------------------

    def tick(self, changes: TickChanges, *, planned_for: Desired,
             serving: Mapping[str, Desired] | None = None) -> None:
        """A reconcile tick's changes, laid pair by pair over the running intent; decided under
        `planned_for` with the PoPs of `serving` on their own desired states (when given), so
        the change is stale (`StaleChange`) once another desired state runs or a rollout moved
        a PoP to another one. Every pair is walked where the change prepares (a worker
        thread), not here."""

        def state(base: RunningIntent) -> _Stated:
            if base.desired is not planned_for or (
                    serving is not None and base.serving is not serving):
                raise StaleChange("a new desired state was applied since the tick planned")
            pairs = sorted({*changes.weights, *changes.controllers, *changes.tier_states,
                            *changes.ramps, *changes.tier_actions})
            return _Stated(applied(base, changes), changes.pops,
                           changes.batch(base.desired.digest),
                           saved_as(base, pairs) if changes else IntentBatch())

        self._state(state)

    def desired(self, desired: Desired, *, serving: Mapping[str, Desired] | None = None
                ) -> None:
        """A new desired state, under the carry-over rule (`carry_over.py`): saved as its
        digest, the pairs it no longer has forgotten. With `serving` (a rollout: PoP -> the
        desired state it keeps serving while that is not `desired`), only the PoPs whose
        desired state changes are re-built, and which PoP serves which version is saved (kind
        `serving`). The carry-over walks every pair: it runs where the change prepares (a
        worker thread), not here."""

        def state(base: RunningIntent) -> _Stated:
            after = carry_over(base, desired, serving).intent
            gone = sorted(set(base.pairs()) - set(after.pairs()))
            every = {*base.pop_names, *after.pop_names}
            moved: frozenset[str] | None = frozenset(
                pop for pop in every
                if pop not in base.pop_names or pop not in after.pop_names
                or base.desired_of(pop) is not after.desired_of(pop))
            if moved == every:
                moved = None  # every PoP
            save = IntentBatch(
                forget_groups=tuple(gone),
                records=(*((kind, tier_key(*key), None)
                           for key in gone for kind in (TIER_KIND, RAMP_KIND)),
                         *serving_record(after, base)),
                desired_digest=desired.digest,
            )
            undo = saved_as(base, gone, base.desired.digest)
            undo = replace(undo, records=(*undo.records, *serving_record(base, after)))
            return _Stated(after, moved, save, undo)

        self._state(state)

    def keep(self, records: Sequence[StoreRecord], undo: Sequence[StoreRecord]) -> None:
        """Store records (kind, key, JSON value or None) saved in the change's one write, with
        what puts them back if the swap fails (`undo`): a rollout's own state and the desired
        states its PoPs serve. Alone, a change that saves them and serves nothing new."""
        self._kept = (tuple(records), tuple(undo))
        if self._statement is None:
            self._state(lambda base: _Stated(base, frozenset(), IntentBatch(), IntentBatch()))
        self._stated = None  # stated again with them when the change prepares

    def replace(self, build: Callable[[RunningIntent], tuple[RunningIntent, Iterable[str] | None]],
                *, digest: str | None = None, undo_digest: str | None = None) -> None:
        """A whole new intent made from the running one by `build` (a replica adopting what
        the store holds, a start-up restoring it): it returns the intent and the PoPs whose
        output may change (None: every PoP). Saves nothing but `digest`, the desired state's
        (a start-up's), put back to `undo_digest` when the swap fails."""

        def state(base: RunningIntent) -> _Stated:
            intent, pops = build(base)
            return _Stated(intent, None if pops is None else frozenset(pops),
                           IntentBatch(desired_digest=digest),
                           IntentBatch(desired_digest=undo_digest))

        self._state(state)

    def record(self, records: Records) -> None:
        """Records to write with the change (before its swap); a function is given the PoPs
        whose output changes."""
        self._records.append(records)

    @property
    def target(self) -> RunningIntent:
        """The intent running after the change, as `prepare` stated it (the base before)."""
        return self.base if self._stated is None else self._stated.target

    # -- how it is published ---------------------------------------------------------------

    async def prepare(self) -> frozenset[str]:
        """Lay what is stated over the intent running now and build its output, both on a
        worker thread (what they raise — a stale tick, a translation that fails — changes
        nothing); the PoPs whose output changes."""
        if self._stated is not None and self._prepared is not None \
                and self._prepared[0] is self._stated:
            return self._changed()  # built already: what lands later is re-stated at the swap
        stated = await self.stated()
        if stated is None or self._publisher is None or stated.pops == frozenset():
            self._prepared = None if stated is None else (stated, None)
            return frozenset()
        # the build reads the cache as it is now: over the intent `stated` was laid over
        assert stated.served is not None
        build = self._publisher.prepare(stated.served, stated.pops)
        self._prepared = (stated, await asyncio.to_thread(build))
        return self._changed()

    def prepared(self) -> Any:
        """The output `prepare` built for what is stated now (None: not built, or nothing to
        build): what the publisher will commit."""
        if self._prepared is None or self._prepared[0] is not self._stated:
            return None
        return self._prepared[1]

    def served(self, pop: str, caps: Capabilities) -> PopResources | None:
        """What `pop`'s nodes with `caps` are served now, where it was built (a reload's diff
        reads it before the change prepares)."""
        return None if self._publisher is None else self._publisher.cached(pop, caps)

    def built(self, pop: str, caps: Capabilities) -> PopResources | None:
        """What `pop`'s nodes with `caps` get once the change is published, where `prepare`
        built it (else None: the caller translates it when it needs it)."""
        prepared = self.prepared()
        if prepared is None or self._publisher is None:
            return None
        return self._publisher.prepared_entry(prepared, pop, caps)

    async def outcome(self) -> tuple[_Stated | None, Any, frozenset[str]]:
        """What is stated, its prepared output and the PoPs it changes (prepared if not yet):
        for the transaction (`IntentOwner.change`)."""
        changed = await self.prepare()
        if self._prepared is None:
            return None, None, frozenset()
        return self._prepared[0], self._prepared[1], changed

    async def stated(self) -> _Stated | None:
        """What is stated, laid over the intent running now (None: nothing is stated). The
        statement runs on a worker thread (a new desired state's carry-over walks every pair);
        if another change landed meanwhile it runs again over that one, so what it returns
        is laid over the intent running when it returns. After `RESTATE_TRIES` lays with
        changes landing during each, the next is made holding the owner's lock, where none
        lands: changes that come without a pause cannot hold a reload off for ever. Under the
        lock (another change landed after the output was prepared), the prepared output still
        holds for every PoP the other change did not touch, and the output cache re-builds the
        others at the swap (`Publisher.commit`)."""
        statement = self._statement
        if statement is None:
            return None
        for _ in range(RESTATE_TRIES):
            if self._stated is not None and self.over is self._current():
                return self._stated
            await self._lay(statement)
        if self._stated is None or self.over is not self._current():
            # never when the caller holds the lock: no change lands then, the first lay held
            async with self._changing:
                await self._lay(statement)
        return self._stated

    async def _lay(self, statement: Statement) -> None:
        base, served = self._now()
        self._stated = await asyncio.to_thread(_laid, statement, self._kept, base, served)
        self.over = base

    def _changed(self) -> frozenset[str]:
        assert self._prepared is not None
        prepared = self._prepared[1]
        if prepared is None or self._publisher is None:
            return frozenset()
        return self._publisher.changed(prepared)

    def _state(self, statement: Statement) -> None:
        self._statement = statement
        self._stated = None  # laid over the running intent when the change prepares

    def drafts(self, changed: frozenset[str]) -> list[Draft]:
        return [made for records in self._records
                for made in (records(changed) if callable(records) else records)]


def _laid(statement: Statement,
          kept: tuple[tuple[StoreRecord, ...], tuple[StoreRecord, ...]],
          base: RunningIntent, served: Served) -> _Stated:
    """`statement` laid over `base` (`served`: as the output cache translates it), with the
    store records kept with it (`Change.keep`) and the target as the cache will translate it
    (made anew for the PoPs the statement touches only)."""
    stated = statement(base)
    stated.served = served_of(stated.target, served, stated.pops)
    records, undo = kept
    if not records:
        return stated
    return replace(stated, save=replace(stated.save, records=(*stated.save.records, *records)),
                   undo=replace(stated.undo, records=(*stated.undo.records, *undo)))


def serving_record(intent: RunningIntent, other: RunningIntent) -> tuple[StoreRecord, ...]:
    """The store record (kind `serving`, key `SERVING_KEY`: PoP -> the digest it serves, for
    the PoPs not on the target; None when every PoP is) that makes the store hold which PoP of
    `intent` serves which desired state; none when neither `intent` nor `other` has such PoPs.
    One record, not one per PoP: a wave of a large fleet stays one small transaction."""
    if not intent.serving and not other.serving:
        return ()
    held = {pop: desired.digest for pop, desired in sorted(intent.serving.items())}
    return ((SERVING_KIND, SERVING_KEY, held or None),)


def saved_as(intent: RunningIntent, pairs: Iterable[PairKey], digest: str | None = None
             ) -> IntentBatch:
    """The store write that makes the store hold `intent`'s values for `pairs` (a row where
    it has one, else the pair forgotten; its tier and ramp records) and `digest`: a change's
    undo."""
    rows: list[tuple[str, str, dict[str, int], ControllerState]] = []
    forget: list[PairKey] = []
    records: list[tuple[str, str, Any]] = []
    for key in pairs:
        if key in intent.weights or key in intent.controllers:
            rows.append((*key, intent.weights_of(*key),
                         intent.controllers.get(key, ControllerState())))
        else:
            forget.append(key)
        tier, ramp = intent.tier_states.get(key), intent.ramps.get(key)
        records.append((TIER_KIND, tier_key(*key), None if tier is None else tier.to_dict()))
        records.append((RAMP_KIND, tier_key(*key), None if ramp is None else ramp.to_dict()))
    return IntentBatch(groups=tuple(rows), forget_groups=tuple(forget), records=tuple(records),
                       desired_digest=digest)
