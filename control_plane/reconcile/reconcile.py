"""The reconcile loop: observe -> decide -> persist -> log -> push, per (PoP, origin group).

Level-triggered and safe to run any number of times: each tick reads the desired state, the
current weights and streaks from the intent owner, the signals of the last window from the
metric source, and asks the pure controller for the next weights. Order per tick: state is saved
(one store write) before weights reach Envoys, so a crash never leaves Envoys on weights the
restarted server would not restore. Jitter comes from a seeded RNG per PoP, so PoPs never tick
in lockstep and a run is reproducible.

The same tick runs the tier step (`decide/tiers.py`) per (PoP, group) on the per-tier pending
maxima of the same window from `tier_source`: its state is saved under "<pop>/<group>" when it
changes, a record is written for each change of mind, and then the actions of the current
policy (or none) are set on the intent owner, which pushes RDS and the runtime layer when they
change. Without a tier source, or when it fails, the tier actions hold. Between two ticks of a
pair, its tier step also runs alone every `tier_actions.interval` (the tiers source's 5 s export
interval; a tier tick: preemption acts within one), with the weights, streaks and ramp held.

Each (PoP, group) is reconciled on its own (controller-runtime's per-key reconcile): an
exception while deciding or pushing one pair (its translation raises) is written as a
`reconcile_error` record for that pair, whose weights and actions hold, and every other pair
steps in the same tick. A log that cannot be written (a full disk) stops nothing: the decision
recorder keeps the records until it can.

The event loop does only what costs what changed. On a worker thread: every pair's steps, the
quiet-run bookkeeping and the records to write (`PairDecision`), what changes in the running
intent (`intent/pair_changes.changes_of`: in a steady fleet, nothing). Then the change transaction
(`IntentOwner.change`, `intent/change.py`) publishes it: the output of the PoPs that changed
(an incremental translation, on a worker thread), one store write of the changed pairs, the
records (only decisions and the ends of quiet runs) with one fsync (on a thread, awaited), and
the swap that pushes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from control_plane.ads.off_loop import free_later
from control_plane.decide.controller import ControllerState, StepResult, step
from control_plane.decide.health import HealthScore
from control_plane.decide.ramp import RampResult, RampState, ramp_step
from control_plane.decide.runs import END_KINDS, QuietRun, follow_run
from control_plane.decide.signals import GroupSignals
from control_plane.decide.tiers import TierState, TierStepResult, service_time_ms, tier_step
from control_plane.decisions.log import Draft, draft
from control_plane.desired.model import Desired, OriginGroup
from control_plane.intent.change import Change, StaleChange, SwapFailed
from control_plane.intent.owner import IntentOwner
from control_plane.intent.pair_changes import PairChange, TickChanges, changes_of
from control_plane.intent.running import RunningIntent
from control_plane.observe.source import (
    MetricSource,
    Signals,
    TierSignals,
    TierSource,
    silent_fix,
    silent_nodes,
    wall_ms,
)
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate.routes import check_tier_actions
from control_plane.translate.weights import check_group_weights

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]  # (PoP, origin group)
SILENT_REASONS = frozenset({"fail_static", "no_evidence"})  # holds a silent node may cause
PHASES = {"decide": "deciding", "push": "pushing"}


@dataclass(frozen=True)
class Reading:
    """What one pair's last tick read and scored, for the faces."""

    at_ms: int
    signals: GroupSignals  # origin -> its window (absent: no signal of it)
    scores: dict[str, HealthScore]  # empty when the signals were missing or stale


@dataclass(frozen=True)
class PairFailure:
    """Reconciling one (PoP, group) raised: in which phase, and what."""

    pop: str
    group: str
    phase: str  # decide or push
    error: str


@dataclass(frozen=True)
class TickOutcome:
    pop: str
    group: str
    result: StepResult
    tiers: TierStepResult | None = None
    ramp: RampResult | None = None

    @property
    def weights(self) -> dict[str, int]:
        """The weights in force after the tick: the ramp's when it ran, else the controller's."""
        return dict(self.ramp.weights_after if self.ramp else self.result.weights_after)


@dataclass(frozen=True)
class PairDecision:
    """Everything a tick decided for one (PoP, group), made off the event loop."""

    outcome: TickOutcome | None  # None: a tier tick (the tier step alone)
    pair: PairChange  # what the intent owner is given
    records: tuple[Draft, ...]  # what the decision log gets, in order
    run: QuietRun | None  # the pair's quiet run after this tick
    signals: GroupSignals  # what the step read (the faces show it)


@dataclass(frozen=True)
class TickPlan:
    """A tick's decisions and what they change in the running intent."""

    decided: list[PairDecision]
    failed: list[PairFailure]
    changes: TickChanges
    runs: dict[GroupKey, QuietRun | None]  # every pair's quiet run after the tick
    drafts: list[Draft]  # the tick's records, in order
    schedule: dict[GroupKey, int]  # every pair's next step (a failed pair's too: retried then)
    tier_schedule: dict[GroupKey, int]  # every pair's next tier step
    readings: dict[GroupKey, Reading]  # what each decided pair read and scored (for the faces)
    outcomes: list[TickOutcome]  # the decided pairs' weight steps (a tier tick has none)


class Reconciler:
    def __init__(
        self,
        intent: IntentOwner,
        source: MetricSource,
        *,
        tier_source: TierSource | None = None,
        metrics: BallastMetrics | None = None,
        interval_ms: int | None = None,
        seed: int = 0,
        clock: Callable[[], int] = wall_ms,
        connected: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
        reporting: Callable[[int, int], set[str] | None] | None = None,
        source_kind: str = "sink",
    ) -> None:
        if intent.recorder is None:
            raise ValueError("the reconcile loop records its decisions: give the intent owner "
                             "a decision recorder")
        self.intent = intent
        self.recorder = intent.recorder
        self.source = source
        self.tier_source = tier_source
        self.metrics = metrics
        self.interval_override_ms = interval_ms
        self.seed = seed
        self.clock = clock
        # who should report (PoP -> node id -> connected at, ms) and who did (node ids; None:
        # the source cannot tell per node): a hold for lack of metrics names the nodes
        # connected for a whole window that sent nothing, and the fix
        self._connected = connected
        self._reporting = reporting
        self.source_kind = source_kind
        self.silent: dict[str, tuple[str, ...]] = {}  # PoP -> nodes heard nothing from (last tick)
        self._rngs: dict[str, random.Random] = {}
        self._runs: dict[GroupKey, QuietRun | None] = {}  # absent: not ticked yet
        self._due: dict[GroupKey, int] = {}
        self._tier_due: dict[GroupKey, int] = {}
        self._next_due = 0  # no pair is due before this (a tick before it has nothing to do)
        # each pair's last tick: when, the signals it read and the health scores it gave (the
        # faces show them: `lifecycle/status.py`); dropped with the pair
        self.readings: dict[GroupKey, Reading] = {}

    def interval_ms(self, group: OriginGroup) -> int:
        return self.interval_override_ms or group.failover.interval_ms

    def tier_interval_ms(self, group: OriginGroup) -> int:
        """A pair's tier tick: `tier_actions.interval`, never longer than its full tick."""
        return min(group.tier_actions.interval_ms, self.interval_ms(group))

    def _earliest(self) -> int:
        return min([*self._due.values(), *self._tier_due.values()], default=0)

    def _jitter(self, pop: str, limit: int) -> int:
        rng = self._rngs.setdefault(pop, random.Random(f"{self.seed}:{pop}"))
        return rng.randint(-limit, limit)

    async def tick(self, now_ms: int | None = None, *, only_due: bool = False) -> list[TickOutcome]:
        """One pass over every (PoP, group) that is due (or all of them)."""
        now = self.clock() if now_ms is None else now_ms
        if only_due and now < self._next_due:
            return []
        started = time.perf_counter()
        running = self.intent.intent
        # O(PoPs x groups) from here on, so on worker threads while the loop keeps serving
        due, tiers_only, windows = await asyncio.to_thread(self._due_pairs, running, now,
                                                           only_due)
        if not due and not tiers_only:  # every pair is scheduled later: sleep till then
            self._next_due = self._earliest()
            return []
        signals_by_window: dict[int, Signals] = {}
        for window in windows:
            try:
                signals_by_window[window] = await self.source.window(now, window)
            except Exception as err:  # a broken source must hold weights, not kill the loop
                log.warning("metric source failed, holding weights: %s", err)
                signals_by_window[window] = {}
        tiers_by_window = {window: await self._tier_signals(now, window) for window in windows}
        if self._connected is not None:
            widest = max(windows)
            self.silent = silent_nodes(
                self._connected(), signals_by_window[widest],
                None if self._reporting is None else self._reporting(now, widest),
                now - widest)
        # every due pair's steps, its records and what changes, from the running intent as it
        # is now; only this reconciler changes streaks and states, and a reload (a new desired
        # state since `desired` was read) makes the tick's change stale: it is dropped
        plan = await asyncio.to_thread(self._plan_due, running, due, tiers_only,
                                       signals_by_window, tiers_by_window, now)
        try:
            async with self.intent.change() as change:
                plan = await self._prepared(change, running, plan, now)
                change.record([*(self._failure(f, running.desired_of(f.pop))
                                 for f in plan.failed),
                               *plan.drafts])
        except StaleChange:  # a reload landed since `desired` was read: the tick is void
            return []
        except SwapFailed as err:  # saved, logged, not pushed: the store was put back
            log.exception("pushing the tick's changes failed")
            changes = plan.changes
            self.recorder.write([self._failure(PairFailure(pop, group, "push", str(err)),
                                               running.desired_of(pop))
                                 for pop, group in sorted({*changes.weights,
                                                           *changes.tier_actions})])
            await self.recorder.sync()
        else:
            if self.metrics is not None:
                for (pop, group), weights in plan.changes.weights.items():
                    for origin, weight in weights.items():
                        self.metrics.weight.labels(pop, group, origin).set(weight)
        self.readings.update(plan.readings)
        self._runs = plan.runs
        self._due = plan.schedule
        self._tier_due = plan.tier_schedule
        self._next_due = self._earliest()
        if self.metrics is not None:
            self.metrics.reconcile_tick.observe(time.perf_counter() - started)
        outcomes = plan.outcomes
        # what the tick made for every pair (and the intent it replaced) is freed off the loop
        made = [plan, change, running, signals_by_window, tiers_by_window, due, tiers_only]
        del plan, change, running, signals_by_window, tiers_by_window, due, tiers_only
        free_later(made)
        return outcomes

    def _due_pairs(self, running: RunningIntent, now: int, only_due: bool
                   ) -> tuple[list[tuple[str, OriginGroup]], list[tuple[str, OriginGroup]],
                              set[int]]:
        """The pairs whose step is due (every pair unless `only_due`), those only whose tier
        step is, and the windows they read (on a worker thread). Each PoP's groups are of the
        desired state it serves (during a rollout, maybe not the target): weight shifts and
        tier actions run in every PoP throughout."""
        pairs = [(pop, group) for pop in running.pop_names
                 for group in running.desired_of(pop).origin_groups]
        due = [(pop, group) for pop, group in pairs
               if not only_due or self._due.get((pop, group.name), 0) <= now]
        stepped = {(pop, group.name) for pop, group in due}
        tiers_only = [(pop, group) for pop, group in pairs
                      if (pop, group.name) not in stepped
                      and self._tier_due.get((pop, group.name), 0) <= now]
        return due, tiers_only, {group.failover.window_ms for _, group in (*due, *tiers_only)}

    def _plan_due(self, running: RunningIntent, due: list[tuple[str, OriginGroup]],
                  tiers_only: list[tuple[str, OriginGroup]], signals: dict[int, Signals],
                  tiers: dict[int, TierSignals | None], now: int) -> TickPlan:
        """Every due pair's steps and records (a tier tick's pairs: their tier step alone), and
        what they change (on a worker thread)."""
        return self._plan([
            *(self._decide_one(running, pop, group, signals[group.failover.window_ms],
                               tiers[group.failover.window_ms], now, running.desired_of(pop))
              for pop, group in due),
            *(self._decide_tiers(running, pop, group, signals[group.failover.window_ms],
                                 tiers[group.failover.window_ms], now, running.desired_of(pop))
              for pop, group in tiers_only),
        ], running, *self._schedule(due, tiers_only, now), now)

    def _schedule(self, due: list[tuple[str, OriginGroup]],
                  tiers_only: list[tuple[str, OriginGroup]], now: int
                  ) -> tuple[dict[GroupKey, int], dict[GroupKey, int]]:
        """Every pair's next step and next tier step after this tick's (a failing pair's too:
        retried then)."""
        return ({**self._due, **{(pop, group.name): now + self.interval_ms(group)
                                 for pop, group in due}},
                {**self._tier_due, **{(pop, group.name): now + self.tier_interval_ms(group)
                                      for pop, group in (*due, *tiers_only)}})

    def _plan(self, results: list[PairDecision | PairFailure], running: RunningIntent,
              schedule: dict[GroupKey, int], tier_schedule: dict[GroupKey, int], now: int
              ) -> TickPlan:
        decided = [r for r in results if isinstance(r, PairDecision)]
        failed = [r for r in results if isinstance(r, PairFailure)]
        runs = {**self._runs, **{d.pair.key: d.run for d in decided if d.outcome is not None}}
        drafts = [made for decision in decided for made in decision.records]
        outcomes = [d.outcome for d in decided if d.outcome is not None]
        readings = {(o.pop, o.group): Reading(now, d.signals, o.result.scores)
                    for d in decided if (o := d.outcome) is not None}
        return TickPlan(decided, failed, changes_of(running, [d.pair for d in decided]), runs,
                        drafts, schedule, tier_schedule, readings, outcomes)

    async def _prepared(self, change: Change, running: RunningIntent, plan: TickPlan, now: int
                        ) -> TickPlan:
        """The tick's changes stated on `change` and their output built (on a worker thread).
        A PoP whose translation raises fails its pairs (phase push: nothing of them saved or
        pushed) and the others go on."""
        change.tick(plan.changes, planned_for=running.desired, serving=running.serving)
        try:
            await change.prepare()
            return plan
        except StaleChange:  # a reload landed: the whole tick is void, not one PoP
            raise
        except Exception:
            log.exception("building the output of the tick's PoPs failed; trying each PoP")
        broken: dict[str, str] = {}
        for pop in sorted(plan.changes.pops):
            alone = [d for d in plan.decided if d.pair.key[0] == pop]
            change.tick(changes_of(running, [d.pair for d in alone]),
                        planned_for=running.desired, serving=running.serving)
            try:
                await change.prepare()
            except StaleChange:
                raise
            except Exception as err:
                broken[pop] = f"{type(err).__name__}: {err}"
        kept = [d for d in plan.decided if d.pair.key[0] not in broken]
        failed = [*plan.failed, *(PairFailure(*d.pair.key, "push", broken[d.pair.key[0]])
                                  for d in plan.decided if d.pair.key[0] in broken)]
        plan = await asyncio.to_thread(lambda: self._plan([*kept, *failed], running,
                                                          plan.schedule, plan.tier_schedule, now))
        change.tick(plan.changes, planned_for=running.desired, serving=running.serving)
        return plan

    async def _tier_signals(self, now: int, window: int) -> TierSignals | None:
        """None (tier actions hold) without a tier source or when it fails."""
        if self.tier_source is None:
            return None
        try:
            return await self.tier_source.tier_pending(now, window)
        except Exception as err:  # a broken source must hold tier actions, not kill the loop
            log.warning("tier pending source failed, holding tier actions: %s", err)
            return None

    def _decide_one(
        self, running: RunningIntent, pop: str, group: OriginGroup, signals: Signals,
        tier_signals: TierSignals | None, now: int, desired: Desired,
    ) -> PairDecision | PairFailure:
        """One pair's steps, checked, with its records; what it raises is that pair's failure
        only (its weights, streaks and actions hold)."""
        try:
            outcome = self._decide(running, pop, group, signals, tier_signals, now)
            weights = outcome.weights
            if weights != outcome.result.weights_before:
                check_group_weights(group, weights)
            actions = None if outcome.tiers is None else outcome.tiers.actions
            if actions is not None:
                check_tier_actions(group, actions)
            key = (pop, group.name)
            if self.metrics is not None and key not in self._runs:  # first tick: gauges set
                for origin, weight in running.weights_of(pop, group.name).items():
                    self.metrics.weight.labels(pop, group.name, origin).set(weight)
            decided = PairChange(key, weights, outcome.result.state,
                                 None if outcome.tiers is None else outcome.tiers.state,
                                 None if outcome.ramp is None else outcome.ramp.state, actions)
            records, run = self._records(outcome, desired, now)
            return PairDecision(outcome, decided, records, run, signals.get(key) or {})
        except Exception as err:
            log.exception("deciding %s/%s failed", pop, group.name)
            return PairFailure(pop, group.name, "decide", f"{type(err).__name__}: {err}")

    def _decide(
        self, running: RunningIntent, pop: str, group: OriginGroup, signals: Signals,
        tier_signals: TierSignals | None, now: int,
    ) -> TickOutcome:
        key = (pop, group.name)
        group_signals = signals.get(key)
        result = step(
            group.failover,
            group.preference[pop],
            running.weights_of(pop, group.name),
            running.controllers.get(key, ControllerState()),
            group_signals,
            now,
            self._jitter(pop, group.failover.jitter),
        )
        silent = self.silent.get(pop)
        if silent and result.reason in SILENT_REASONS:  # the cause, named, with the fix
            fix = silent_fix(pop, silent, self.source_kind)
            result = replace(result, rule=f"{result.rule}; {fix}", next=f"{result.next}; {fix}",
                             silent=silent)
        if self.metrics is not None and group_signals:
            newest = max(s.observed_at_ms for s in group_signals.values())
            self.metrics.source_staleness.labels(pop, group.name).set(max(0, now - newest) / 1000)
        tiers = self._tier_step(running, key, group, group_signals, tier_signals, now,
                                result.weights_before)
        ramp = ramp_step(
            group.standby_ramp,
            group.failover,
            group.preference[pop],
            result.weights_before,
            result.weights_after,
            running.ramps.get(key, RampState()),
            group_signals,
            now,
        )
        return TickOutcome(pop, group.name, result, tiers, ramp)

    @staticmethod
    def _tier_step(running: RunningIntent, key: GroupKey, group: OriginGroup,
                   group_signals: GroupSignals | None, tier_signals: TierSignals | None,
                   now: int, weights: Mapping[str, int]) -> TierStepResult:
        return tier_step(
            group,
            running.tier_states.get(key, TierState()),
            None if tier_signals is None else tier_signals.get(key),
            now,
            None if not group_signals else service_time_ms(
                {name: s.p50_ms for name, s in group_signals.items()}, weights),
        )

    def _decide_tiers(
        self, running: RunningIntent, pop: str, group: OriginGroup, signals: Signals,
        tier_signals: TierSignals | None, now: int, desired: Desired,
    ) -> PairDecision | PairFailure:
        """A tier tick of one pair: its tier step alone (weights, streaks and ramp held)."""
        key = (pop, group.name)
        try:
            weights = running.weights_of(pop, group.name)
            tiers = self._tier_step(running, key, group, signals.get(key), tier_signals, now,
                                    weights)
            if tiers.actions is not None:
                check_tier_actions(group, tiers.actions)
            decided = PairChange(key, weights, running.controllers.get(key, ControllerState()),
                                 tiers.state, None, tiers.actions)
            return PairDecision(None, decided, _tier_drafts(pop, group.name, tiers, desired),
                                None, signals.get(key) or {})
        except Exception as err:
            log.exception("deciding the tiers of %s/%s failed", pop, group.name)
            return PairFailure(pop, group.name, "decide", f"{type(err).__name__}: {err}")

    def _failure(self, failure: PairFailure, desired: Desired) -> Draft:
        """The `reconcile_error` record of a pair that failed."""
        held = {"decide": "its weights and tier actions hold",
                "push": "what it decided is not pushed; its next tick decides again"}[
                    failure.phase]
        return draft(
            "reconcile_error",
            pop=failure.pop,
            group=failure.group,
            config_version=desired.digest[:16],
            rule=f"reconciling {failure.pop}/{failure.group} failed while "
            f"{PHASES[failure.phase]}: {failure.error}; {held}; the other pairs went on",
            detail={"phase": failure.phase, "error": failure.error},
        )

    def _records(self, outcome: TickOutcome, desired: Desired, now: int,
                 ) -> tuple[tuple[Draft, ...], QuietRun | None]:
        """The tick's records of one pair, made ready to write, and its quiet run after the
        tick: a run of quiet ticks is written when it starts and when it ends
        (`decide/runs.py`), every other decision each time."""
        result = outcome.result
        key = (outcome.pop, outcome.group)
        run = follow_run(self._runs.get(key), result, now, first_tick=key not in self._runs)
        records: list[tuple[str, dict[str, Any]]] = []
        if run.ended is not None:
            records.append((END_KINDS[run.ended.kind], {
                "weights_before": dict(result.weights_before),
                "weights_after": dict(result.weights_before),
                **run.ended.end_fields(result.kind)}))
        ramp = outcome.ramp
        if run.write_tick:  # the weights pushed, with the proposal the ramp changed (if it did)
            records.append((result.kind, result.record_fields(
                outcome.weights, "" if ramp is None else f"{ramp.kind}: {ramp.rule}")))
        if ramp is not None and ramp.kind is not None:
            records.append((ramp.kind, ramp.record_fields(result.weights_before)))
        version = desired.digest[:16]
        made = tuple(draft(kind, pop=outcome.pop, group=outcome.group, config_version=version,
                           **fields) for kind, fields in records)
        if outcome.tiers is not None:
            made += _tier_drafts(outcome.pop, outcome.group, outcome.tiers, desired)
        return made, run.run

    def quiet_run(self, pop: str, group: str) -> QuietRun | None:
        """The pair's run of quiet ticks now (a hold or steady run), if any."""
        return self._runs.get((pop, group))

    def defer_all(self, now_ms: int) -> None:
        """Every pair's next step one interval from `now_ms` (a new leader: the last one may
        have ticked just before it went, so no tick comes early)."""
        running = self.intent.intent
        for pop in running.pop_names:
            for group in running.desired_of(pop).origin_groups:
                self._due[(pop, group.name)] = now_ms + self.interval_ms(group)
                self._tier_due[(pop, group.name)] = now_ms + self.tier_interval_ms(group)
        self._next_due = self._earliest()

    def forget_missing(self, running: RunningIntent) -> None:
        """Drop the schedule and quiet runs of (PoP, group) pairs the running intent no longer
        has (a new desired state, or a rollout wave: their intent is dropped by the intent
        owner's carry-over)."""
        keep = set(running.pairs())
        self._next_due = 0  # pairs it adds are due at once
        for key in [*self._due, *self._tier_due, *self._runs, *self.readings]:
            if key not in keep:
                self._due.pop(key, None)
                self._tier_due.pop(key, None)
                self._runs.pop(key, None)
                self.readings.pop(key, None)

    async def run(self, poll_ms: int = 250) -> None:
        """Tick each (PoP, group) on its own interval until cancelled."""
        while True:
            try:
                await self.tick(only_due=True)
            except Exception:  # keep reconciling; the next tick starts from persisted state
                log.exception("reconcile tick failed")
            await asyncio.sleep(poll_ms / 1000)


def _tier_drafts(pop: str, group: str, tiers: TierStepResult, desired: Desired
                 ) -> tuple[Draft, ...]:
    """A tier step's records, one per change of mind."""
    version = desired.digest[:16]
    return tuple(draft(decision.kind, pop=pop, group=group, config_version=version,
                       **tiers.record_fields(decision)) for decision in tiers.decisions)
