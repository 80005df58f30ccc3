"""The change transaction: the one way what is served changes.

Every change of the running intent that Envoys may see — a reconcile tick's steps, a hot
reload's new desired state, a replica adopting what another one decided, and anything later
(staged rollouts) — is stated in a `Change` and published by `IntentOwner.change`:

    async with owner.change() as change:
        change.steps(tick_changes)          # or change.desired(new) / change.replace(...)
        change.record(drafts)               # or a function of the PoPs whose output changes

The caller says *what* changes; the transaction does the *how*, always in this order:

1. **lock**: `owner.changing` is held from the `async with` to the swap, so two changes never
   interleave (`change.base` is the intent running when the lock was taken);
2. **prepare**: the output of the PoPs concerned is built for the new intent on a worker thread
   (`Publisher.prepare`), touching nothing served (`await change.prepare()` does it early, to
   learn the PoPs that will change or to handle a translation that raises);
3. **save**: one store write (`IntentBatch`), unless the change is not this process's to save
   (`owner.change(save=False)`: a follower adopting, a start-up restore);
4. **record**: the records handed to the decision recorder in one write and made durable with
   one fsync (on a thread). A log that cannot be written (a full disk) does not stop the change:
   the recorder keeps the records until it can (`decisions/recorder.py`);
5. **swap**: the new intent becomes the running one and the prepared output is committed
   (`Publisher.commit`), which tells the ADS streams.

What fails leaves what is served and what is stored agreeing: a body, prepare or save that
raises changes nothing (the error goes to the caller, who records it); a swap that raises puts
the store back (`undo`, one write of the old values of what was saved) and keeps the old intent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from control_plane.decide.controller import ControllerState
from control_plane.decisions.log import Draft
from control_plane.desired.model import Desired
from control_plane.intent.carry_over import CarryOver, carry_over
from control_plane.intent.running import RunningIntent, tier_key
from control_plane.intent.steps import TickChanges, applied
from control_plane.intent.store import RAMP_KIND, TIER_KIND, IntentBatch, PairKey

P = TypeVar("P")

Records = Sequence[Draft] | Callable[[frozenset[str]], Sequence[Draft]]


class Publisher(Protocol[P]):
    """Where the running intent becomes what Envoys get (the ADS output cache): the one
    interface every change is published through. `P` is what `prepare` builds."""

    def prepare(self, source: RunningIntent, pops: Collection[str] | None = None
                ) -> Callable[[], P]:
        """A call that builds the output of `pops` (None: every PoP) for `source`, touching
        nothing served (a worker thread runs it)."""
        ...

    def changed(self, prepared: P) -> frozenset[str]:
        """The PoPs whose output `prepared` changes."""
        ...

    def commit(self, prepared: P, source: RunningIntent) -> frozenset[str]:
        """Swap in what `prepared` holds with `source` as the running intent; the PoPs whose
        output changed (announced to the streams)."""
        ...

    def update(self, source: RunningIntent, pops: Collection[str] | None) -> frozenset[str]:
        """Rebuild the output of `pops` (None: all) from `source` at once, on the loop (a
        restore before serving; the owner's setters for tests); the PoPs that changed."""
        ...


class SwapFailed(Exception):
    """Publishing a change raised; the intent and the store were kept as they were."""


@dataclass
class _Stated:
    target: RunningIntent
    pops: frozenset[str] | None  # PoPs whose output may change (None: every PoP)
    save: IntentBatch
    undo: IntentBatch


class Change:
    """One change being made under `IntentOwner.change` (see the module's docstring)."""

    def __init__(self, base: RunningIntent, publisher: Publisher[Any] | None) -> None:
        self.base = base
        self._publisher = publisher
        self._stated: _Stated | None = None
        self._records: list[Records] = []
        self._prepared: tuple[_Stated, Any] | None = None
        self.pushed: frozenset[str] = frozenset()  # after the swap: the PoPs whose output changed

    # -- what changes ----------------------------------------------------------------------

    def steps(self, changes: TickChanges) -> None:
        """A reconcile tick's changes, laid pair by pair over the running intent."""
        pairs = sorted({*changes.weights, *changes.controllers, *changes.tier_states,
                        *changes.ramps, *changes.tier_actions})
        self._state(_Stated(applied(self.base, changes), changes.pops,
                            changes.batch(self.base.desired.digest),
                            saved_as(self.base, pairs) if changes else IntentBatch()))

    def desired(self, desired: Desired) -> CarryOver:
        """A new desired state, under the carry-over rule (`carry_over.py`): saved as its
        digest, the pairs it no longer has forgotten."""
        carried = carry_over(self.base, desired)
        gone = sorted(set(self.base.pairs()) - set(carried.intent.pairs()))
        save = IntentBatch(
            forget_groups=tuple(gone),
            records=tuple((kind, tier_key(*key), None)
                          for key in gone for kind in (TIER_KIND, RAMP_KIND)),
            desired_digest=desired.digest,
        )
        self._state(_Stated(carried.intent, None, save,
                            saved_as(self.base, gone, self.base.desired.digest)))
        return carried

    def replace(self, intent: RunningIntent, pops: Iterable[str] | None) -> None:
        """A whole new intent (a replica adopting what the store holds, a restore); `pops`:
        the PoPs whose output may change (None: every PoP). Saves nothing."""
        self._state(_Stated(intent, None if pops is None else frozenset(pops), IntentBatch(),
                            IntentBatch()))

    def record(self, records: Records) -> None:
        """Records to write with the change (before its swap); a function is given the PoPs
        whose output changes."""
        self._records.append(records)

    @property
    def target(self) -> RunningIntent:
        """The intent running after the change (the base while nothing is stated)."""
        return self.base if self._stated is None else self._stated.target

    # -- how it is published ---------------------------------------------------------------

    async def prepare(self) -> frozenset[str]:
        """Build the output of what is stated now, on a worker thread (what it raises — a
        translation that fails — changes nothing); the PoPs whose output changes."""
        stated = self._stated
        if stated is None or self._publisher is None or stated.pops == frozenset():
            self._prepared = None if stated is None else (stated, None)
            return frozenset()
        if self._prepared is not None and self._prepared[0] is stated:
            return self._changed()
        build = self._publisher.prepare(stated.target, stated.pops)
        self._prepared = (stated, await asyncio.to_thread(build))
        return self._changed()

    async def outcome(self) -> tuple[_Stated | None, Any, frozenset[str]]:
        """What is stated, its prepared output and the PoPs it changes (prepared if not yet):
        for the transaction (`IntentOwner.change`)."""
        changed = await self.prepare()
        if self._prepared is None:
            return None, None, frozenset()
        return self._prepared[0], self._prepared[1], changed

    def _changed(self) -> frozenset[str]:
        assert self._prepared is not None
        prepared = self._prepared[1]
        if prepared is None or self._publisher is None:
            return frozenset()
        return self._publisher.changed(prepared)

    def _state(self, stated: _Stated) -> None:
        self._stated = stated

    def drafts(self, changed: frozenset[str]) -> list[Draft]:
        return [made for records in self._records
                for made in (records(changed) if callable(records) else records)]


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
