"""The cold-standby ramp of one (PoP, origin group): a pure step after the weight controller.

The failover source's binary-failover incident was a *cold* secondary that fell over when it
suddenly got the traffic. A standby that has sat at its warm pool for ``cold_after_ms`` or longer
(or for as long as this state knows) is cold. When the controller moves weight towards a cold
standby, its share grows along ``schedule`` (5 -> 10 -> 20 -> 40 %), one stage per interval, then
the normal controller takes over. ``ramp_step`` takes the controller's proposed weights and returns
the weights in force:

1. **Start.** A cold standby the controller gives weight to starts ramping at the first stage
   of the schedule above its current share; its share is capped there.
2. **Advance.** A ramping standby that holds its current stage's share and whose window is
   *healthy* (``decide/evidence.py``: enough samples, within the failover thresholds, p50 under
   the return bar: it stayed healthy under the new load) moves one stage on; past the last stage
   the ramp is complete and the cap goes. A window that does not breach but is no evidence of
   health (too few samples, or over a threshold without the evidence to breach) advances it only
   when it is the better place by the margin (as in 3); otherwise the ramp holds it within its
   stage (``ramp_hold``): an absence of evidence is not health.
3. **Degrade.** A ramping standby whose window breaches is compared with where its traffic
   would otherwise go (the origins the ramp gives weight back to: those that gave it this tick,
   else the most preferred origin not ramping). Worse than that by the failover's
   ``compare_margin``: the ramp stops, ``back_off`` lowers its cap by one stage (weight goes back
   to the origins it came from), ``hold`` keeps it where it is. Better by the margin: it advances
   as a healthy one does (backing off would send the traffic somewhere worse). Within the
   margin: the ramp holds. Without fresh signals the ramp holds silently, as the controller does
   (fail static). Never pour load into a falling standby that is not the better place.
4. **End.** When the controller takes weight off a ramping standby (the shift reverses), the ramp
   ends and the controller rules again.
5. **Cap.** Weight proposed above a standby's cap stays with the origins that gave it, most
   preferred first: the primary never leaves faster than the standby can take, and every origin
   keeps at least ``min_warm_pool``.

Every tick that starts, advances, holds, backs off, completes, ends or caps a ramp returns a record
(``kind``) with its inputs, so it can be replayed (``replay_ramp_record``).

What follows from the ramp's state for the routes: the cache-warming mirror while a standby
ramps (``active_mirror``), and the share of a hedged tier's requests that may hedge while a
standby is cold or ramping (``hedge_share``: hedges respect the ramp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from control_plane.decide.controller import signals_from_dict, signals_to_dict
from control_plane.decide.evidence import WindowEvidence, judge
from control_plane.decide.health import score_origin
from control_plane.decide.inputs import LazyInputs
from control_plane.decide.signals import GroupSignals
from control_plane.desired.model import (
    FailoverPolicy,
    GroupWeights,
    Mirror,
    OriginGroup,
    StandbyRampPolicy,
)

RAMP_KINDS: tuple[str, ...] = (
    "ramp_start", "ramp_advance", "ramp_hold", "ramp_back_off", "ramp_complete", "ramp_end",
    "ramp_capped",
)
# when several origins ramp at once, the record is named after the most pressing event
_PRIORITY = ("ramp_back_off", "ramp_hold", "ramp_start", "ramp_advance", "ramp_complete",
             "ramp_end", "ramp_capped")


def _ms_map(value: Any, what: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()
    ):
        raise ValueError(f"{what} must map origin -> integer >= 0, got {value!r}")
    return dict(value)


@dataclass(frozen=True)
class RampState:
    """What the ramp remembers between ticks."""

    ramps: dict[str, int] = field(default_factory=dict)  # ramping origin -> stage index
    # origin -> when it came down to its warm pool (0: before this state knew)
    warm_pool_since_ms: dict[str, int] = field(default_factory=dict)

    @property
    def ramping(self) -> tuple[str, ...]:
        return tuple(sorted(self.ramps))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ramps": dict(sorted(self.ramps.items())),
            "warm_pool_since_ms": dict(sorted(self.warm_pool_since_ms.items())),
        }

    @classmethod
    def from_dict(cls, data: Any) -> RampState:
        """Inverse of ``to_dict``; raises ValueError on anything else."""
        if not isinstance(data, dict) or set(data) != {"ramps", "warm_pool_since_ms"}:
            raise ValueError(f"ramp state must have ramps and warm_pool_since_ms, got {data!r}")
        return cls(_ms_map(data["ramps"], "ramps"),
                   _ms_map(data["warm_pool_since_ms"], "warm_pool_since_ms"))


@dataclass(frozen=True)
class RampResult:
    weights_after: GroupWeights
    state: RampState
    kind: str | None  # None: nothing about a ramp to record this tick
    rule: str
    next: str
    inputs: LazyInputs
    ceilings: dict[str, int]  # the cap of each ramping origin this tick

    def record_fields(self, weights_before: GroupWeights) -> dict[str, Any]:
        """Fields of the ramp's decision record (``weights_before``: the tick's, not proposed)."""
        return {
            "weights_before": dict(weights_before),
            "weights_after": dict(self.weights_after),
            "inputs": self.inputs.json(),
            "rule": self.rule,
            "detail": {"next": self.next, "state": self.state.to_dict(),
                       "ceilings": dict(self.ceilings)},
        }


def _inputs_json(now_ms: int, preference: tuple[str, ...], proposed: Mapping[str, int],
                 state: RampState, signals: GroupSignals | None) -> dict[str, Any]:
    """A ramp step's inputs as its record holds them (what `replay_ramp_record` reads)."""
    return {
        "now_ms": now_ms,
        "preference": list(preference),
        "proposed": dict(proposed),
        "state_before": state.to_dict(),
        "signals": (None if signals is None
                    else {name: signals_to_dict(sig) for name, sig in sorted(signals.items())}),
    }


def _cold(policy: StandbyRampPolicy, since: int | None, now_ms: int) -> bool:
    return since is not None and now_ms - since >= policy.cold_after_ms


def _first_stage_above(schedule: tuple[int, ...], share: int) -> int | None:
    return next((i for i, ceiling in enumerate(schedule) if ceiling > share), None)


def _give_back(
    after: dict[str, int], excess: int, before: Mapping[str, int], proposed: Mapping[str, int],
    preference: tuple[str, ...], capped: set[str],
) -> None:
    """Excess weight goes back to the origins that gave it this tick (most preferred first), the
    rest to the most preferred origin without a cap."""
    for name in preference:
        if name in capped or excess == 0:
            continue
        gave = max(0, before[name] - proposed[name])
        back = min(gave, excess)
        after[name] += back
        excess -= back
    if excess:
        target = next(name for name in preference if name not in capped)
        after[target] += excess


def ramp_step(
    policy: StandbyRampPolicy,
    failover: FailoverPolicy,
    preference: tuple[str, ...],
    before: Mapping[str, int],
    proposed: Mapping[str, int],
    state: RampState,
    signals: GroupSignals | None,
    now_ms: int,
) -> RampResult:
    """The weights in force after the ramp (from the controller's ``proposed``). Pure."""
    warm = failover.min_warm_pool
    standbys = preference[1:]
    inputs = LazyInputs(_inputs_json, now_ms, preference, proposed, state, signals)
    tick = _RampTick(policy, failover, preference, before, proposed, signals, now_ms)
    tick.since = {name: state.warm_pool_since_ms.get(name, 0)
                  for name in standbys if before[name] <= warm}
    tick.ramps = {name: index for name, index in state.ramps.items()
                  if name in standbys and 0 <= index < len(policy.schedule)}
    for name in standbys:
        tick.decide(name)
    after = tick.capped()
    new_since = {  # 0 (since before this state knew) is what an absent entry means already
        name: tick.since.get(name, now_ms) for name in standbys if after[name] <= warm
    }
    new_since = {name: ms for name, ms in new_since.items() if ms}
    new_state = RampState(tick.ramps, new_since)
    kind = None
    if tick.events:
        kind = min((k for _, k, _ in tick.events), key=_PRIORITY.index)
    rule = "; ".join(words for _, _, words in tick.events)
    if after != dict(proposed):
        moves = ", ".join(f"{name} {proposed[name]}→{after[name]}" for name in preference
                          if after[name] != proposed[name])
        rule += f"; controller proposed {_weights(proposed)}, ramp made it {moves}"
    return RampResult(after, new_state, kind, rule, _next(policy, tick.ramps, after), inputs,
                      tick.ceilings)


@dataclass
class _RampTick:
    """One tick of the ramp over a group's standbys: what each one's stage and cap become
    (`decide`, one standby at a time), then the caps laid over the proposal (`capped`)."""

    policy: StandbyRampPolicy
    failover: FailoverPolicy
    preference: tuple[str, ...]
    before: Mapping[str, int]
    proposed: Mapping[str, int]
    signals: GroupSignals | None
    now_ms: int
    since: dict[str, int] = field(default_factory=dict)  # at its warm pool since
    ramps: dict[str, int] = field(default_factory=dict)  # ramping origin -> stage index
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (origin, kind, words)
    ceilings: dict[str, int] = field(default_factory=dict)

    def event(self, name: str, kind: str, words: str) -> None:
        self.events.append((name, kind, words))

    def decide(self, name: str) -> None:
        """Rules 1 to 4 of the module docstring for one standby."""
        index = self.ramps.get(name)
        if not self.policy.enabled:
            if index is not None:
                del self.ramps[name]
                self.event(name, "ramp_end", f"{name}: ramp switched off in the desired state")
        elif index is None:
            self._start(name)
        elif self.proposed[name] < self.before[name]:
            del self.ramps[name]
            self.event(name, "ramp_end", (
                f"{name}: the shift reverses (controller moves it {self.before[name]}→"
                f"{self.proposed[name]}): ramp ends{_mirror_words(self.policy, name, stop=True)}"))
        elif (self.signals is None or name not in self.signals or self.now_ms
              - self.signals[name].observed_at_ms > self.failover.stale_after_ms):
            # fail static, as the controller does
            self.ceilings[name] = min(self.policy.schedule[index], self.before[name])
        else:
            self._judge(name, index, self.signals)

    def _start(self, name: str) -> None:
        """Rule 1: a cold standby the controller gives weight to starts ramping."""
        policy, before, schedule = self.policy, self.before, self.policy.schedule
        if not (self.proposed[name] > before[name]
                and _cold(policy, self.since.get(name), self.now_ms)):
            return
        start = _first_stage_above(schedule, before[name])
        if start is None:
            return
        self.ramps[name] = start
        self.ceilings[name] = schedule[start]
        since = self.since[name]
        how_long = f"{(self.now_ms - since) / 1000:g} s" if since else "as long as known"
        self.event(name, "ramp_start", (
            f"{name} is cold (at its warm pool {self.failover.min_warm_pool} % for {how_long}, "
            f"cold after {policy.cold_after_ms / 1000:g} s): ramp starts, stage {start + 1} of "
            f"{len(schedule)} allows {schedule[start]} %{_mirror_words(policy, name)}"))

    def _judge(self, name: str, index: int, signals: GroupSignals) -> None:
        """Rules 2 and 3: a ramping standby with fresh signals advances, holds or backs off."""
        failover, before, schedule = self.failover, self.before, self.policy.schedule
        ceiling, stages = schedule[index], len(schedule)
        evidence = judge(signals[name], failover)
        breach = evidence.breaches
        verdict, compared = (("", "") if evidence.verdict in ("healthy", "inconclusive") else
                             _compare(failover, self.preference, before, self.proposed,
                                      signals, name, set(self.ramps), self.now_ms))
        if not breach and evidence.verdict != "healthy" and verdict != "better":
            self.ceilings[name] = ceiling  # no evidence of health: it stays within its stage
            if before[name] >= ceiling:
                self.event(name, "ramp_hold", (
                    f"{name} at {before[name]} % {_not_healthy(evidence, failover)}{compared}: "
                    f"ramp holds at stage {index + 1} of {stages} ({ceiling} %)"))
        elif breach and verdict != "better":
            self._degraded(name, index, ", ".join(breach) + compared, verdict == "within")
        elif before[name] < ceiling:
            self.ceilings[name] = ceiling  # still growing into its current stage
        elif index + 1 == stages:
            del self.ramps[name]
            self.event(name, "ramp_complete", (
                f"{name} {'the better place' if verdict else 'healthy'} at {before[name]} %, "
                f"the last stage: ramp complete, the controller moves it from now on"
                f"{_mirror_words(self.policy, name, stop=True)}"))
        else:
            self.ramps[name] = index + 1
            self.ceilings[name] = schedule[index + 1]
            how = (f"breaches ({', '.join(breach)}) but is the better place{compared}" if breach
                   else f"{_not_healthy(evidence, failover)}, but is the better place{compared}"
                   if verdict
                   else f"healthy at {before[name]} % (within 5xx "
                        f"{failover.error_rate_threshold * 100:g} % and p95 "
                        f"{failover.p95_threshold_ms} ms)")
            self.event(name, "ramp_advance", (
                f"{name} {how}: stage {index + 2} of {stages} allows "
                f"{schedule[index + 1]} %"))

    def _degraded(self, name: str, index: int, why: str, within: bool) -> None:
        """Rule 3: a breaching standby that is not the better place holds or backs off."""
        schedule, before = self.policy.schedule, self.before
        if within:
            self.ceilings[name] = min(schedule[index], before[name])
            self.event(name, "ramp_hold", (
                f"{name} breaches under the ramp ({why}): ramp holds at "
                f"{self.ceilings[name]} % (stage {index + 1} of {len(schedule)})"))
        elif self.policy.on_degrade == "back_off":
            index = max(0, index - 1)
            self.ramps[name] = index
            self.ceilings[name] = min(schedule[index], before[name])
            self.event(name, "ramp_back_off", (
                f"{name} degrades under the ramp ({why}): backs off to stage {index + 1} of "
                f"{len(schedule)}, at most {self.ceilings[name]} %"))
        else:
            self.ceilings[name] = min(schedule[index], before[name])
            self.event(name, "ramp_hold", (
                f"{name} degrades under the ramp ({why}): ramp holds at "
                f"{self.ceilings[name]} % (stage {index + 1} of {len(schedule)})"))

    def capped(self) -> dict[str, int]:
        """Rule 5: the proposal with each cap laid over it (never below the warm pool)."""
        noted = {name for name, _, _ in self.events}
        warm = self.failover.min_warm_pool
        self.ceilings = {name: max(warm, ceiling) for name, ceiling in self.ceilings.items()}
        after = dict(self.proposed)
        for name, ceiling in self.ceilings.items():
            if after[name] > ceiling:
                excess = after[name] - ceiling
                after[name] = ceiling
                _give_back(after, excess, self.before, self.proposed, self.preference,
                           set(self.ceilings))
                if name not in noted:
                    self.event(name, "ramp_capped", (
                        f"{name} ramping at stage {self.ramps[name] + 1} of "
                        f"{len(self.policy.schedule)}: capped at {ceiling} %"))
        return after


def _compare(
    failover: FailoverPolicy, preference: tuple[str, ...], before: Mapping[str, int],
    proposed: Mapping[str, int], signals: GroupSignals, name: str, ramping: set[str],
    now_ms: int,
) -> tuple[str, str]:
    """How ramping ``name`` compares with where its traffic would otherwise go (the origins the
    cap gives weight back to: those that gave it this tick, else the most preferred one not
    ramping), by composite score: "worse", "better" (by the margin) or "within"; and words."""
    gave = [other for other in preference
            if other not in ramping and before[other] > proposed[other]]
    if not gave:
        gave = [other for other in preference if other not in ramping][:1]
    fresh = [other for other in gave if other in signals
             and now_ms - signals[other].observed_at_ms <= failover.stale_after_ms]
    if not fresh:
        return "worse", ""
    mine = score_origin(signals[name], failover).composite
    best_name = max(fresh, key=lambda other: score_origin(signals[other], failover).composite)
    best = score_origin(signals[best_name], failover).composite
    margin = failover.compare_margin - 1e-9
    verdict = ("better" if mine - best >= margin else "worse" if best - mine >= margin
               else "within")
    words = (f"; scores {mine:.2f} against {best:.2f} for {best_name}, where its traffic would "
             f"otherwise go (margin {failover.compare_margin:g})")
    return verdict, words


def _not_healthy(evidence: WindowEvidence, failover: FailoverPolicy) -> str:
    """Why a window that does not breach is no evidence of health (``decide/evidence.py``)."""
    if evidence.verdict == "inconclusive":
        return "has too few samples to count as healthy (" + "; ".join(evidence.notes) + ")"
    return (f"does not breach but is not healthy (over a threshold without the evidence to "
            f"breach, or p50 not below {failover.return_p50_ms} ms)")


def _mirror_words(policy: StandbyRampPolicy, name: str, *, stop: bool = False) -> str:
    if policy.mirror_percent <= 0:
        return ""
    if stop:
        return "; its cache-warming mirror stops"
    routes = ("every route" if policy.cacheable_routes is None
              else "routes " + ", ".join(policy.cacheable_routes))
    return (f"; mirroring {policy.mirror_percent:g} % of cacheable GET/HEAD requests "
            f"({routes}) to {name} to warm its cache")


def _weights(weights: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in weights.items())


def _next(policy: StandbyRampPolicy, ramps: Mapping[str, int], after: Mapping[str, int]) -> str:
    if not ramps:
        return "no ramp: a cold standby starts one when weight moves towards it"
    schedule = policy.schedule
    parts = []
    for name, index in sorted(ramps.items()):
        if index + 1 < len(schedule):
            parts.append(f"{name} moves to {schedule[index + 1]} % after an interval healthy at "
                         f"{schedule[index]} % (now {after[name]} %)")
        else:
            parts.append(f"{name} completes its ramp after an interval healthy at "
                         f"{schedule[index]} % (now {after[name]} %)")
    return "; ".join(parts)


def replay_ramp_record(
    policy: StandbyRampPolicy, failover: FailoverPolicy, record: Mapping[str, Any]
) -> RampResult:
    """Run ``ramp_step`` again on the inputs a ramp record holds."""
    inputs = record["inputs"]
    signals = inputs["signals"]
    return ramp_step(
        policy,
        failover,
        tuple(inputs["preference"]),
        record["weights_before"],
        inputs["proposed"],
        RampState.from_dict(inputs["state_before"]),
        None if signals is None
        else {name: signals_from_dict(data) for name, data in signals.items()},
        inputs["now_ms"],
    )


def active_mirror(group: OriginGroup, state: RampState) -> Mirror | None:
    """The cache-warming mirror while standbys ramp: ``mirror_percent`` of the cacheable
    requests to each ramping standby; None when none ramps or the mirror is off."""
    policy = group.standby_ramp
    if not state.ramps or not policy.enabled or policy.mirror_percent <= 0:
        return None
    return Mirror(state.ramping, policy.mirror_percent, policy.cacheable_routes)


HEDGE_SHARE_UNIT = 1_000_000  # `hedge_share` is per million of a hedged tier's requests


def hedge_share(group: OriginGroup, preference: tuple[str, ...], weights: Mapping[str, int],
                state: RampState | None) -> int | None:
    """The share (per million) of a hedged tier's requests that may hedge in one (PoP, group)
    while a standby is guarded by the ramp; None when every request may (no guard).

    A hedge goes to another origin than the request's first attempt, so a slow or failing
    primary sends a hedged tier's whole load to the standby, past its ramp (issue 33: a standby
    at its 5 % warm pool answered nearly every checkout request). A standby is guarded while it
    ramps (its allowed share is its stage's ceiling) or sits at its warm pool (it is cold; its
    allowed share is the schedule's first stage above its weight, the ramp's first stage): at
    most its headroom, the allowed share minus its weight, may reach it through hedges. With a
    share X of the requests hedging, a standby at weight w gets at most X (1 - w) of them as
    hedges (the requests first sent elsewhere), so X = headroom / (100 - w), the smallest over
    the guarded standbys. Not guarded: the ramp off, no tier of the group hedges, or every
    standby warm (above its warm pool, not ramping)."""
    policy = group.standby_ramp
    if not policy.enabled or not any(tier.hedge_delay_ms for tier in group.tiers):
        return None
    warm = group.failover.min_warm_pool
    ramps = {} if state is None else state.ramps
    shares = []
    for name in preference[1:]:
        weight = weights.get(name, 0)
        index = ramps.get(name)
        if index is not None and 0 <= index < len(policy.schedule):
            allowed = max(policy.schedule[index], warm)
        elif weight <= warm:
            first = _first_stage_above(policy.schedule, weight)
            allowed = 100 if first is None else policy.schedule[first]
        else:
            continue
        if weight < 100:
            shares.append(max(0, allowed - weight) * HEDGE_SHARE_UNIT // (100 - weight))
    share = min(shares, default=HEDGE_SHARE_UNIT)
    return None if share >= HEDGE_SHARE_UNIT else share
