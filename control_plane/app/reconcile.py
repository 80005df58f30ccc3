"""The reconcile loop: observe -> decide -> persist -> log -> push, per (PoP, origin group).

Level-triggered and safe to run any number of times: each tick reads the desired state, the
current weights and streaks from the intent owner, the signals of the last window from the
metric source, and asks the pure controller for the next weights. Order per tick: state is saved
(one store write) before weights reach Envoys, so a crash never leaves Envoys on weights the
restarted server would not restore. Jitter comes from a seeded RNG per PoP, so PoPs never step
in lockstep and a run is reproducible.

The same tick runs the tier step (`decide/tiers.py`) per (PoP, group) on the per-tier pending
maxima of the same window from `tier_source`: its state is saved under "<pop>/<group>" when it
changes, a `tier_action` record is written when the actions go on or off, and then the actions
of the current policy (or none) are set on the intent owner, which pushes RDS when the routes
change. Without a tier source, or when it fails, the tier actions hold.

Each (PoP, group) is reconciled on its own (controller-runtime's per-key reconcile): an
exception while deciding, logging or pushing one pair is written as a `reconcile_error` record
for that pair, whose weights and actions hold, and every other pair steps in the same tick.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from control_plane.decide.controller import ControllerState, StepResult, step
from control_plane.decide.ramp import RampResult, RampState, ramp_step
from control_plane.decide.runs import END_KINDS, QuietRun, follow_run
from control_plane.decide.tiers import TierState, TierStepResult, tier_step
from control_plane.decisions.log import DecisionLog
from control_plane.desired.model import Desired, OriginGroup
from control_plane.intent.owner import IntentOwner, PairStep
from control_plane.intent.running import RunningIntent
from control_plane.observe.source import (
    MetricSource,
    Signals,
    TierSignals,
    TierSource,
    wall_ms,
)
from control_plane.own_metrics.registry import BallastMetrics

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]  # (PoP, origin group)
PHASES = {"decide": "deciding", "log": "logging", "push": "pushing"}


@dataclass(frozen=True)
class PairFailure:
    """Reconciling one (PoP, group) raised: in which phase, and what."""

    pop: str
    group: str
    phase: str  # decide, log or push
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


class Reconciler:
    def __init__(
        self,
        intent: IntentOwner,
        source: MetricSource,
        decisions: DecisionLog,
        *,
        tier_source: TierSource | None = None,
        metrics: BallastMetrics | None = None,
        interval_ms: int | None = None,
        seed: int = 0,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.intent = intent
        self.source = source
        self.decisions = decisions
        self.tier_source = tier_source
        self.metrics = metrics
        self.interval_override_ms = interval_ms
        self.seed = seed
        self.clock = clock
        self._rngs: dict[str, random.Random] = {}
        self._runs: dict[GroupKey, QuietRun | None] = {}  # absent: not ticked yet
        self._due: dict[GroupKey, int] = {}

    def interval_ms(self, group: OriginGroup) -> int:
        return self.interval_override_ms or group.failover.interval_ms

    def _jitter(self, pop: str, limit: int) -> int:
        rng = self._rngs.setdefault(pop, random.Random(f"{self.seed}:{pop}"))
        return rng.randint(-limit, limit)

    async def tick(self, now_ms: int | None = None, *, only_due: bool = False) -> list[TickOutcome]:
        """One pass over every (PoP, group) that is due (or all of them)."""
        now = self.clock() if now_ms is None else now_ms
        started = time.perf_counter()
        desired = self.intent.desired
        due = [
            (pop.name, group)
            for pop in desired.pops
            for group in desired.origin_groups
            if not only_due or self._due.get((pop.name, group.name), 0) <= now
        ]
        if not due:
            return []
        windows = {group.failover.window_ms for _, group in due}
        signals_by_window: dict[int, Signals] = {}
        for window in windows:
            try:
                signals_by_window[window] = await self.source.window(now, window)
            except Exception as err:  # a broken source must hold weights, not kill the loop
                log.warning("metric source failed, holding weights: %s", err)
                signals_by_window[window] = {}
        tiers_by_window = {window: await self._tier_signals(now, window) for window in windows}
        if self.intent.desired is not desired:  # a reload landed while we were reading metrics
            return []
        # pure steps over every due pair: O(PoPs x groups), so on a worker thread while the loop
        # keeps serving, from the running intent as it is now; only this reconciler changes
        # weights and states, and a reload that lands meanwhile voids the tick
        running = self.intent.intent
        decided = await asyncio.to_thread(lambda: [
            self._decide_one(running, pop, group, signals_by_window[group.failover.window_ms],
                             tiers_by_window[group.failover.window_ms], now)
            for pop, group in due
        ])
        if self.intent.desired is not desired:
            return []
        outcomes = [d for d in decided if isinstance(d, TickOutcome)]
        failed = [d for d in decided if isinstance(d, PairFailure)]
        await self._persist_and_push(desired, outcomes, failed)
        for pop, group in due:  # a failing pair too: it is retried at its next interval
            self._due[(pop, group.name)] = now + self.interval_ms(group)
        if self.metrics is not None:
            self.metrics.reconcile_tick.observe(time.perf_counter() - started)
        return outcomes

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
        tier_signals: TierSignals | None, now: int,
    ) -> TickOutcome | PairFailure:
        """`_decide` for one pair; what it raises is that pair's failure only."""
        try:
            return self._decide(running, pop, group, signals, tier_signals, now)
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
        if self.metrics is not None and group_signals:
            newest = max(s.observed_at_ms for s in group_signals.values())
            self.metrics.source_staleness.labels(pop, group.name).set(max(0, now - newest) / 1000)
        tiers = tier_step(
            group,
            running.tier_states.get(key, TierState()),
            None if tier_signals is None else tier_signals.get(key),
            now,
        )
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

    async def _persist_and_push(
        self, desired: Desired, outcomes: list[TickOutcome], failed: list[PairFailure]
    ) -> None:
        """State saved, then every record of the tick written and fsync'd once, then pushed;
        a pair whose logging or push raises is recorded as failed and the others go on."""
        await self.intent.save_steps(
            [
                PairStep((o.pop, o.group), o.weights, o.result.state,
                         None if o.tiers is None else o.tiers.state,
                         None if o.ramp is None else o.ramp.state)
                for o in outcomes
            ],
            desired,
        )
        for failure in failed:
            self._record_failure(failure, desired)
        for outcome in outcomes:
            try:
                self._log(outcome, desired)
            except Exception as err:
                log.exception("logging %s/%s failed", outcome.pop, outcome.group)
                self._record_failure(PairFailure(outcome.pop, outcome.group, "log",
                                                 f"{type(err).__name__}: {err}"), desired)
        self.decisions.sync()  # one fsync for the tick's records, before anything is pushed
        pushed_failed = False
        for outcome in outcomes:
            try:
                self._push(outcome)
            except Exception as err:
                log.exception("pushing %s/%s failed", outcome.pop, outcome.group)
                self._record_failure(PairFailure(outcome.pop, outcome.group, "push",
                                                 f"{type(err).__name__}: {err}"), desired)
                pushed_failed = True
        if pushed_failed:
            self.decisions.sync()

    def _push(self, outcome: TickOutcome) -> None:
        result = outcome.result
        if outcome.weights != result.weights_before:
            self.intent.update_weights(outcome.pop, outcome.group, outcome.weights)
        if outcome.tiers is not None:
            self.intent.set_tier_actions(outcome.pop, outcome.group, outcome.tiers.actions)
        if self.metrics is not None:
            for origin, weight in outcome.weights.items():
                self.metrics.weight.labels(outcome.pop, outcome.group, origin).set(weight)

    def _record_failure(self, failure: PairFailure, desired: Desired) -> None:
        held = {"decide": "its weights and tier actions hold",
                "log": "what it decided is saved and pushed, not logged",
                "push": "what it decided is saved, not pushed; its next tick decides again"}[
                    failure.phase]
        self.decisions.record(
            "reconcile_error",
            durable=False,  # made durable by the tick's sync
            pop=failure.pop,
            group=failure.group,
            config_version=desired.digest[:16],
            rule=f"reconciling {failure.pop}/{failure.group} failed while "
            f"{PHASES[failure.phase]}: {failure.error}; {held}; the other pairs went on",
            detail={"phase": failure.phase, "error": failure.error},
        )
        if self.metrics is not None:
            self.metrics.decisions.labels("reconcile_error").inc()

    def _log(self, outcome: TickOutcome, desired: Desired) -> None:
        """The tick's records: a run of quiet ticks is written when it starts and when it ends
        (`decide/runs.py`), every other decision each time."""
        result = outcome.result
        key = (outcome.pop, outcome.group)
        run = follow_run(self._runs.get(key), result, result.inputs["now_ms"],
                         first_tick=key not in self._runs)
        self._runs[key] = run.run
        if run.ended is not None:
            fields = {"weights_before": dict(result.weights_before),
                      "weights_after": dict(result.weights_before), **run.ended.end_fields(
                          result.kind)}
            self._record(outcome, END_KINDS[run.ended.kind], fields, desired)
        if run.write_tick:
            self._record(outcome, result.kind, result.record_fields(), desired)
        if outcome.ramp is not None and outcome.ramp.kind is not None:
            self._record(outcome, outcome.ramp.kind,
                         outcome.ramp.record_fields(result.weights_before), desired)
        if outcome.tiers is not None:
            for decision in outcome.tiers.decisions:
                self._record(outcome, decision.kind, outcome.tiers.record_fields(decision),
                             desired)

    def _record(
        self, outcome: TickOutcome, kind: str, fields: dict[str, object], desired: Desired
    ) -> None:
        self.decisions.record(
            kind,
            durable=False,  # made durable by the tick's one sync, before the push
            pop=outcome.pop,
            group=outcome.group,
            config_version=desired.digest[:16],
            **fields,
        )
        if self.metrics is not None:
            self.metrics.decisions.labels(kind).inc()

    def defer_all(self, now_ms: int) -> None:
        """Every pair's next step one interval from `now_ms` (a new leader: the last one may
        have stepped just before it went, so no step comes early)."""
        desired = self.intent.desired
        for pop in desired.pop_names:
            for group in desired.origin_groups:
                self._due[(pop, group.name)] = now_ms + self.interval_ms(group)

    def forget_missing(self, desired: Desired) -> None:
        """Drop the schedule and quiet runs of (PoP, group) pairs the new desired state no
        longer has (their intent is dropped by the intent owner's carry-over)."""
        keep = {(p.name, g.name) for p in desired.pops for g in desired.origin_groups}
        for key in [*self._due, *self._runs]:
            if key not in keep:
                self._due.pop(key, None)
                self._runs.pop(key, None)

    async def run(self, poll_ms: int = 250) -> None:
        """Tick each (PoP, group) on its own interval until cancelled."""
        while True:
            try:
                await self.tick(only_due=True)
            except Exception:  # keep reconciling; the next tick starts from persisted state
                log.exception("reconcile tick failed")
            await asyncio.sleep(poll_ms / 1000)
