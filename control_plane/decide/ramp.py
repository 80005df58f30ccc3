"""The cold-standby ramp of one (PoP, origin group): a pure step after the weight controller.

Seed 002's binary-failover incident was a *cold* secondary that fell over when it suddenly got the
traffic. A standby that has sat at its warm pool for ``cold_after_ms`` or longer (or for as long as
this state knows) is cold. When the controller moves weight towards a cold standby, its share grows
along ``schedule`` (5 -> 10 -> 20 -> 40 %), one schedule step per interval, then the normal
controller takes over. ``ramp_step`` takes the controller's proposed weights and returns the
weights in force:

1. **Start.** A cold standby the controller gives weight to starts ramping at the first schedule
   step above its current share; its share is capped there.
2. **Step.** A ramping standby that holds its current step's share and whose window is
   *healthy* (``decide/evidence.py``: enough samples, within the failover thresholds, p50 under
   the return bar: it stayed healthy under the new load) moves one step on; past the last step
   the ramp is complete and the cap goes. A window that does not breach but is no evidence of
   health (too few samples, or over a threshold without the evidence to breach) steps it on only
   when it is the better place by the margin (as in 3); otherwise the ramp holds it within its
   step (``ramp_hold``): an absence of evidence is not health.
3. **Degrade.** A ramping standby whose window breaches is compared with where its traffic
   would otherwise go (the origins the ramp gives weight back to: those that gave it this tick,
   else the most preferred origin not ramping). Worse than that by the failover's
   ``compare_margin``: the ramp stops, ``back_off`` lowers its cap by one step (weight goes back
   to the origins it came from), ``hold`` keeps it where it is. Better by the margin: it steps
   on as a healthy one does (backing off would send the traffic somewhere worse). Within the
   margin: the ramp holds. Without fresh signals the ramp holds silently, as the controller does
   (fail static). Never pour load into a falling standby that is not the better place.
4. **End.** When the controller takes weight off a ramping standby (the shift reverses), the ramp
   ends and the controller rules again.
5. **Cap.** Weight proposed above a standby's cap stays with the origins that gave it, most
   preferred first: the primary never leaves faster than the standby can take, and every origin
   keeps at least ``min_warm_pool``.

Every tick that starts, steps, holds, backs off, completes, ends or caps a ramp returns a record
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
    "ramp_start", "ramp_step", "ramp_hold", "ramp_back_off", "ramp_complete", "ramp_end",
    "ramp_capped",
)
# when several origins ramp at once, the record is named after the most pressing event
_PRIORITY = ("ramp_back_off", "ramp_hold", "ramp_start", "ramp_step", "ramp_complete",
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

    ramps: dict[str, int] = field(default_factory=dict)  # ramping origin -> schedule step index
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


def _first_step_above(schedule: tuple[int, ...], share: int) -> int | None:
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
    schedule = policy.schedule
    standbys = preference[1:]
    inputs = LazyInputs(_inputs_json, now_ms, preference, proposed, state, signals)
    since = {name: state.warm_pool_since_ms.get(name, 0)
             for name in standbys if before[name] <= warm}
    ramps = {name: index for name, index in state.ramps.items()
             if name in standbys and 0 <= index < len(schedule)}
    events: list[tuple[str, str, str]] = []  # (origin, kind, words)
    ceilings: dict[str, int] = {}
    for name in standbys:
        index = ramps.get(name)
        if not policy.enabled:
            if index is not None:
                del ramps[name]
                events.append((name, "ramp_end",
                               f"{name}: ramp switched off in the desired state"))
            continue
        if index is None:
            if proposed[name] > before[name] and _cold(policy, since.get(name), now_ms):
                start = _first_step_above(schedule, before[name])
                if start is None:
                    continue
                ramps[name] = start
                ceilings[name] = schedule[start]
                cold_for = (now_ms - since[name]) / 1000 if since[name] else None
                how_long = f"{cold_for:g} s" if cold_for is not None else "as long as known"
                events.append((name, "ramp_start", (
                    f"{name} is cold (at its warm pool {warm} % for {how_long}, cold after "
                    f"{policy.cold_after_ms / 1000:g} s): ramp starts, step {start + 1} of "
                    f"{len(schedule)} allows {schedule[start]} %{_mirror_words(policy, name)}")))
            continue
        if proposed[name] < before[name]:
            del ramps[name]
            events.append((name, "ramp_end", f"{name}: the shift reverses (controller moves it "
                                             f"{before[name]}→{proposed[name]}): ramp ends"
                                             f"{_mirror_words(policy, name, stop=True)}"))
            continue
        ceiling = schedule[index]
        if (signals is None or name not in signals
                or now_ms - signals[name].observed_at_ms > failover.stale_after_ms):
            ceilings[name] = min(ceiling, before[name])  # fail static, as the controller does
            continue
        evidence = judge(signals[name], failover)
        breach = evidence.breaches
        verdict, compared = (("", "") if evidence.verdict in ("healthy", "inconclusive") else
                             _compare(failover, preference, before, proposed, signals, name,
                                      set(ramps), now_ms))
        if not breach and evidence.verdict != "healthy" and verdict != "better":
            ceilings[name] = ceiling  # no evidence of health: it stays within its step
            if before[name] >= ceiling:
                events.append((name, "ramp_hold", (
                    f"{name} at {before[name]} % {_not_healthy(evidence, failover)}{compared}: "
                    f"ramp holds at step {index + 1} of {len(schedule)} ({ceiling} %)")))
            continue
        if breach and verdict != "better":
            why = ", ".join(breach) + compared
            if verdict == "within":
                ceilings[name] = min(ceiling, before[name])
                events.append((name, "ramp_hold", (
                    f"{name} breaches under the ramp ({why}): ramp holds at "
                    f"{ceilings[name]} % (step {index + 1} of {len(schedule)})")))
            elif policy.on_degrade == "back_off":
                index = max(0, index - 1)
                ramps[name] = index
                ceilings[name] = min(schedule[index], before[name])
                events.append((name, "ramp_back_off", (
                    f"{name} degrades under the ramp ({why}): backs off to step {index + 1} of "
                    f"{len(schedule)}, at most {ceilings[name]} %")))
            else:
                ceilings[name] = min(ceiling, before[name])
                events.append((name, "ramp_hold", (
                    f"{name} degrades under the ramp ({why}): ramp holds at {ceilings[name]} % "
                    f"(step {index + 1} of {len(schedule)})")))
            continue
        if before[name] < ceiling:
            ceilings[name] = ceiling
            continue  # still growing into its current step
        if index + 1 == len(schedule):
            del ramps[name]
            events.append((name, "ramp_complete", (
                f"{name} {'the better place' if verdict else 'healthy'} at {before[name]} %, "
                f"the last step: ramp complete, the "
                f"controller moves it from now on{_mirror_words(policy, name, stop=True)}")))
            continue
        ramps[name] = index + 1
        ceilings[name] = schedule[index + 1]
        how = (f"breaches ({', '.join(breach)}) but is the better place{compared}" if breach
               else f"{_not_healthy(evidence, failover)}, but is the better place{compared}"
               if verdict
               else f"healthy at {before[name]} % (within 5xx "
                    f"{failover.error_rate_threshold * 100:g} % and p95 "
                    f"{failover.p95_threshold_ms} ms)")
        events.append((name, "ramp_step", (
            f"{name} {how}: step {index + 2} of {len(schedule)} allows "
            f"{schedule[index + 1]} %")))
    noted = {name for name, _, _ in events}
    ceilings = {name: max(warm, ceiling) for name, ceiling in ceilings.items()}
    after = dict(proposed)
    for name, ceiling in ceilings.items():
        if after[name] > ceiling:
            excess = after[name] - ceiling
            after[name] = ceiling
            _give_back(after, excess, before, proposed, preference, set(ceilings))
            if name not in noted:
                events.append((name, "ramp_capped", (
                    f"{name} ramping at step {ramps[name] + 1} of {len(schedule)}: capped at "
                    f"{ceiling} %")))
    new_since = {  # 0 (since before this state knew) is what an absent entry means already
        name: since.get(name, now_ms) for name in standbys if after[name] <= warm
    }
    new_since = {name: ms for name, ms in new_since.items() if ms}
    new_state = RampState(ramps, new_since)
    kind = None
    if events:
        kind = min((k for _, k, _ in events), key=_PRIORITY.index)
    rule = "; ".join(words for _, _, words in events)
    if after != dict(proposed):
        moves = ", ".join(f"{name} {proposed[name]}→{after[name]}" for name in preference
                          if after[name] != proposed[name])
        rule += f"; controller proposed {_weights(proposed)}, ramp made it {moves}"
    return RampResult(after, new_state, kind, rule, _next(policy, ramps, after), inputs,
                      ceilings)


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
    ramps (its allowed share is its step's ceiling) or sits at its warm pool (it is cold; its
    allowed share is the schedule's first step above its weight, the ramp's first step): at
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
            first = _first_step_above(policy.schedule, weight)
            allowed = 100 if first is None else policy.schedule[first]
        else:
            continue
        if weight < 100:
            shares.append(max(0, allowed - weight) * HEDGE_SHARE_UNIT // (100 - weight))
    share = min(shares, default=HEDGE_SHARE_UNIT)
    return None if share >= HEDGE_SHARE_UNIT else share
