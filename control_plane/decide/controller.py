"""The weight controller of one (PoP, origin group): one pure call per reconcile tick.

``step`` is a pure function of its inputs (policy, preference, current weights, streaks, one window
of signals, the tick's time and the PoP's jitter draw), so a decision record holds everything needed
to replay it (``replay_record``). The rules, with seed 002's numbers as defaults:

1. **Fail static.** No signals, an origin without signals, or a newest sample older than
   ``stale_after_ms``: the weights and the streaks are held and the reason is given.
2. **Streaks.** A window *breaches* when 5xx + connect failures > ``error_rate_threshold`` or
   p95 > ``p95_threshold_ms`` with enough evidence (``decide/evidence.py``: ``min_samples`` and
   a confidence bound); it is *healthy* when it has enough samples, does not breach and
   p50 < ``return_p50_ms``; a window without enough samples is *inconclusive* and leaves both
   streaks as they were.
   Each origin counts consecutive breached and consecutive healthy windows, up to the thresholds
   that read them (``breach_windows`` + 1, so a rule can say "more than N";
   ``return_healthy_windows``): a pair that stays healthy, or stays sick, changes no state and
   costs the store nothing. (A threshold raised by a reload is met by counting on from there.)
3. **Leave.** An origin breaching for ``breach_windows`` consecutive windows is *sick*. Its target
   comes from the mode: ``health_proportional`` (the composite score x 100), ``linear`` (minus
   ``shift_step``) or ``exponential`` (half its weight; each receiving standby at most doubles:
   5 -> 10 -> 20 -> 40). A target never rises while an origin is sick, never goes below
   ``min_warm_pool``, and a target closer than ``hysteresis`` to the current weight is ignored.
   Weight goes to the origins not breaching this window, in preference order.
4. **Return.** When no origin is sick, weight moves back toward the home split (the preferred
   origin takes all but the standbys' warm pools) only to an origin with ``return_healthy_windows``
   consecutive healthy windows, taken from the origins above home (least preferred first), at
   ``return_speed`` x ``shift_step`` per tick. Fast to leave, slow to return.
5. **Step.** The step is ``shift_step`` (``max_step`` in exponential mode, half ``shift_step`` on
   return) plus the jitter, at least 1 and never more than ``max_step`` nor past the target.
   Moves are whole points between origins, so the weights stay integers that sum to 100, and
   every origin keeps at least ``min_warm_pool`` (a drained primary keeps carrying the traffic that
   proves its recovery).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from control_plane.decide.evidence import WindowEvidence, judge
from control_plane.decide.health import HealthScore, score_origin
from control_plane.decide.inputs import LazyInputs
from control_plane.decide.signals import GroupSignals, OriginSignals
from control_plane.desired.model import FailoverPolicy, GroupWeights, home_weights

StepKind = Literal["weight_shift", "return", "hold", "threshold_breach", "steady"]
STEP_KINDS: tuple[str, ...] = ("weight_shift", "return", "hold", "threshold_breach", "steady")


def _count_map(value: Any, what: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a mapping of origin -> count, got {value!r}")
    out: dict[str, int] = {}
    for key, count in value.items():
        if not isinstance(key, str) or type(count) is not int or count < 0:
            raise ValueError(f"{what}: bad entry {key!r}: {count!r} (want origin -> count >= 0)")
        out[key] = count
    return out


@dataclass(frozen=True)
class ControllerState:
    """What the controller remembers between ticks: consecutive windows per origin."""

    unhealthy_windows: dict[str, int] = field(default_factory=dict)
    healthy_windows: dict[str, int] = field(default_factory=dict)

    def unhealthy(self, origin: str) -> int:
        return self.unhealthy_windows.get(origin, 0)

    def healthy(self, origin: str) -> int:
        return self.healthy_windows.get(origin, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "unhealthy_windows": dict(sorted(self.unhealthy_windows.items())),
            "healthy_windows": dict(sorted(self.healthy_windows.items())),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ControllerState:
        """Inverse of ``to_dict``; raises ValueError on anything else."""
        if not isinstance(data, dict) or set(data) != {"unhealthy_windows", "healthy_windows"}:
            raise ValueError(f"controller state must have unhealthy_windows and healthy_windows, "
                             f"got {data!r}")
        return cls(
            unhealthy_windows=_count_map(data["unhealthy_windows"], "unhealthy_windows"),
            healthy_windows=_count_map(data["healthy_windows"], "healthy_windows"),
        )


@dataclass(frozen=True)
class StepResult:
    """What one tick decided, with everything needed to log and to replay it."""

    kind: StepKind
    rule: str  # the rule that fired, in words, with the numbers
    next: str  # what would make the weights move next
    weights_before: GroupWeights
    weights_after: GroupWeights
    scores: dict[str, HealthScore]  # empty when the signals were missing or stale
    state: ControllerState  # the new state
    inputs: LazyInputs  # signals, scores, jitter, time, preference, state before (JSON-ready)
    # why the weights did not move, for runs of quiet ticks (`decide/runs.py`): "fail_static",
    # "sick_held", "return_wait" or "steady"; the kind itself when they moved
    reason: str = ""

    @property
    def changed(self) -> bool:
        return self.weights_after != self.weights_before

    def record_fields(self) -> dict[str, Any]:
        """Fields for ``DecisionLog.record(result.kind, pop=..., group=..., **these)``."""
        return {
            "weights_before": dict(self.weights_before),
            "weights_after": dict(self.weights_after),
            "inputs": self.inputs.json(),
            "rule": self.rule,
            "detail": {"next": self.next, "state": self.state.to_dict()},
        }


_SIGNAL_FIELDS = tuple(f.name for f in fields(OriginSignals))


def signals_to_dict(signals: OriginSignals) -> dict[str, Any]:
    """The fields as a dict (all plain values: `asdict`'s deep copy is 10x the cost, per origin
    per pair per tick)."""
    return {name: getattr(signals, name) for name in _SIGNAL_FIELDS}


def signals_from_dict(data: Mapping[str, Any]) -> OriginSignals:
    return OriginSignals(**data)


def _check(
    policy: FailoverPolicy, preference: tuple[str, ...], current: Mapping[str, int], jitter: int
) -> None:
    if not preference or len(set(preference)) != len(preference):
        raise ValueError(f"preference must name distinct origins, got {preference!r}")
    if set(current) != set(preference):
        raise ValueError(
            f"weights {dict(current)!r} do not cover exactly the origins {list(preference)!r}"
        )
    if any(type(w) is not int or w < 0 for w in current.values()) or sum(current.values()) != 100:
        raise ValueError(f"weights must be integers >= 0 summing to 100, got {dict(current)!r}")
    if abs(jitter) > policy.jitter:
        raise ValueError(f"jitter {jitter} is outside ±{policy.jitter}")


def _fail_static_reason(
    policy: FailoverPolicy,
    preference: tuple[str, ...],
    signals: GroupSignals | None,
    now_ms: int,
) -> str | None:
    if signals is None:
        return "no metrics for this group"
    missing = [name for name in preference if name not in signals]
    if missing:
        return f"no metrics for {', '.join(missing)}"
    stale = [
        (name, now_ms - signals[name].observed_at_ms)
        for name in preference
        if now_ms - signals[name].observed_at_ms > policy.stale_after_ms
    ]
    if stale:
        return "metrics stale " + ", ".join(f"{age / 1000:.0f} s ({name})" for name, age in stale)
    return None


@dataclass(frozen=True)
class _Tick:
    """The evaluated window, shared by the leave and return rules."""

    policy: FailoverPolicy
    preference: tuple[str, ...]
    current: Mapping[str, int]
    home: GroupWeights
    scores: dict[str, HealthScore]
    breaches: dict[str, tuple[str, ...]]
    state: ControllerState
    jitter: int

    def sick(self) -> list[str]:
        return [
            name for name in self.preference
            if self.state.unhealthy(name) >= self.policy.breach_windows
        ]

    def receivers(self) -> list[str]:
        """Origins that may take weight: not breaching this window and not sick (a sick origin
        stays sick through an inconclusive window, `decide/evidence.py`)."""
        sick = set(self.sick())
        return [name for name in self.preference if not self.breaches[name] and name not in sick]

    def pending(self) -> list[str]:
        return [
            name for name in self.preference
            if 0 < self.state.unhealthy(name) < self.policy.breach_windows
        ]

    def why(self, name: str) -> str:
        count, need = self.state.unhealthy(name), self.policy.breach_windows
        windows = (f"window {count} of {need}" if count <= need
                   else f"more than {need} windows in a row")
        # a sick origin stays sick through a window too thin to judge (decide/evidence.py)
        reasons = ", ".join(self.breaches[name]) or "too few samples this window"
        return f"{name} {reasons} ({windows}); score {self.scores[name].describe()}"


def _sized(base: int, jitter: int, limit: int) -> int:
    """The step: base plus jitter, at least 1, at most limit (limit >= 1)."""
    return max(1, min(limit, base + jitter))


def _transfer(
    weights: dict[str, int], takes: list[tuple[str, int]], gives: list[tuple[str, int]], amount: int
) -> None:
    """Move ``amount`` points: take from ``takes`` in order, give to ``gives`` in order."""
    for pairs, sign in ((takes, -1), (gives, 1)):
        left = amount
        for name, room in pairs:
            moved = min(room, left)
            weights[name] += sign * moved
            left -= moved


def _leave_target(policy: FailoverPolicy, weight: int, score: float) -> int:
    if policy.mode == "health_proportional":
        raw = round(score * 100)
    elif policy.mode == "linear":
        raw = weight - policy.shift_step
    else:
        raw = weight // 2
    return max(policy.min_warm_pool, min(weight, raw))


def _leave(tick: _Tick) -> tuple[dict[str, int], str, str] | None:
    """Move weight off sick origins; None when nothing can move."""
    policy = tick.policy
    sick = tick.sick()
    receivers = tick.receivers()
    targets = {name: _leave_target(policy, tick.current[name], tick.scores[name].composite)
               for name in sick}
    gaps = {name: tick.current[name] - targets[name] for name in sick}
    movable = {name: gap for name, gap in gaps.items() if gap > 0 and gap >= policy.hysteresis}
    if not receivers or not movable:
        return None
    exponential = policy.mode == "exponential"
    rooms = [
        (name, max(tick.current[name], policy.min_warm_pool) if exponential else 100)
        for name in receivers
    ]
    limit = min(sum(movable.values()), policy.max_step, sum(room for _, room in rooms))
    if limit < 1:
        return None
    base = policy.max_step if exponential else policy.shift_step
    amount = _sized(base, tick.jitter, limit)
    worst_first = sorted(movable, key=lambda name: tick.scores[name].composite)
    weights = dict(tick.current)
    _transfer(weights, [(name, movable[name]) for name in worst_first], rooms, amount)
    cap = f"step cap {base}, jitter {tick.jitter:+d}"
    target_text = ", ".join(f"{name} {targets[name]}" for name in sick)
    rule = (
        f"{'; '.join(tick.why(name) for name in sick)}; {policy.mode} target {target_text}; "
        f"{cap} → moved {amount}"
    )
    still = {name: weights[name] - targets[name] for name in sick}
    if any(gap >= policy.hysteresis for gap in still.values()):
        nxt = (f"{policy.mode}: keeps moving up to {base} per interval off {', '.join(sick)} "
               f"while it breaches (target {target_text})")
    else:
        nxt = (f"at target for now; moves again if {', '.join(sick)} gets worse, or returns after "
               f"{policy.return_healthy_windows} healthy windows with p50 < "
               f"{policy.return_p50_ms} ms")
    return weights, rule, nxt


def _return_step(tick: _Tick) -> int:
    return max(1, round(tick.policy.shift_step * tick.policy.return_speed))


def _return(tick: _Tick) -> tuple[dict[str, int], str, str] | None:
    """Move weight back toward home to an origin that has been healthy long enough."""
    policy = tick.policy
    need = policy.return_healthy_windows
    below = [name for name in tick.preference if tick.current[name] < tick.home[name]]
    ready = [name for name in below if tick.state.healthy(name) >= need]
    if not ready:
        return None
    to = ready[0]
    donors = [
        (name, tick.current[name] - tick.home[name])
        for name in reversed(tick.preference)
        if tick.current[name] > tick.home[name]
    ]
    limit = min(tick.home[to] - tick.current[to], policy.max_step, sum(r for _, r in donors))
    base = _return_step(tick)
    amount = _sized(base, tick.jitter, limit)
    weights = dict(tick.current)
    _transfer(weights, donors, [(to, amount)], amount)
    rule = (
        f"{to} healthy {need} or more windows in a row (need {need}, p50 < "
        f"{policy.return_p50_ms} ms); return step {base} (return speed {policy.return_speed:g}), "
        f"jitter {tick.jitter:+d} → moved {amount}; score {tick.scores[to].describe()}"
    )
    if weights[to] < tick.home[to]:
        nxt = (f"return continues by about {base} per interval while {to} stays healthy, "
               f"until {to} is back at {tick.home[to]}")
    else:
        nxt = f"{to} is back at its home weight {tick.home[to]}"
    return weights, rule, nxt


def _no_move(tick: _Tick) -> tuple[StepKind, str, str, str]:
    policy = tick.policy
    pending = tick.pending()
    sick = tick.sick()
    below = [name for name in tick.preference if tick.current[name] < tick.home[name]]
    if pending:
        name = pending[0]
        left = policy.breach_windows - tick.state.unhealthy(name)
        return (
            "threshold_breach",
            "threshold_breach",
            "; ".join(tick.why(name) for name in pending),
            f"weight leaves {name} if the breach lasts {left} more window"
            + ("s" if left > 1 else ""),
        )
    if sick:
        receivers = tick.receivers()
        if receivers:
            where = ", ".join(
                f"{name} at {tick.current[name]}, target "
                f"{_leave_target(policy, tick.current[name], tick.scores[name].composite)} "
                f"(hysteresis {policy.hysteresis}, warm pool {policy.min_warm_pool})"
                for name in sick
            )
        else:
            where = "every origin breaches: nowhere better to send traffic"
        return (
            "hold",
            "sick_held",
            f"{'; '.join(tick.why(name) for name in sick)}; held: {where}",
            f"moves when {', '.join(sick)} gets worse or another origin gets healthier",
        )
    if below:
        name = below[0]
        need = policy.return_healthy_windows
        return (
            "hold",
            "return_wait",
            f"held away from home: return waits for {need} healthy windows with p50 < "
            f"{policy.return_p50_ms} ms; {name} has {tick.state.healthy(name)}",
            f"return to {name} starts after {need} healthy windows; "
            f"{min(tick.state.healthy(name), need)} of {need} so far",
        )
    return (
        "steady",
        "steady",
        "all origins within thresholds; weights at the preferred split",
        f"weights leave an origin after {policy.breach_windows} consecutive windows with 5xx > "
        f"{policy.error_rate_threshold * 100:g}% or p95 > {policy.p95_threshold_ms} ms",
    )


def step(
    policy: FailoverPolicy,
    preference: tuple[str, ...],
    current: Mapping[str, int],
    state: ControllerState,
    signals: GroupSignals | None,
    now_ms: int,
    jitter: int,
) -> StepResult:
    """One tick of the controller of one (PoP, origin group). Pure.

    ``preference`` is the PoP's origin order (most preferred first); ``current`` the weights in
    force; ``jitter`` this tick's draw in ``-policy.jitter..policy.jitter`` (the caller draws it per
    PoP from a seeded RNG). Raises ValueError when the weights, preference or jitter are invalid.
    """
    _check(policy, preference, current, jitter)
    before = {name: current[name] for name in preference}
    home = home_weights(preference, policy.min_warm_pool)
    static = _fail_static_reason(policy, preference, signals, now_ms)
    if static is not None or signals is None:
        return StepResult(
            kind="hold",
            rule=f"fail static: {static}; weights held",
            next=f"weights stay until every origin reports metrics newer than "
                 f"{policy.stale_after_ms / 1000:g} s",
            weights_before=before,
            weights_after=dict(before),
            scores={},
            state=state,
            inputs=LazyInputs(_inputs_json, now_ms, jitter, preference, home, state, signals,
                              {}),
            reason="fail_static",
        )
    scores = {name: score_origin(signals[name], policy) for name in preference}
    evidence = {name: judge(signals[name], policy) for name in preference}
    breaches = {name: evidence[name].breaches for name in preference}
    new_state = _streaks(policy, state, evidence)
    tick = _Tick(policy, preference, before, home, scores, breaches, new_state, jitter)
    kind: StepKind
    reason: str
    moved = _leave(tick) if tick.sick() else None
    if moved is not None:
        kind = "weight_shift"
    else:
        moved = _return(tick)
        kind = "return"
    if moved is not None:
        after, rule, nxt = moved
        reason = kind
    else:
        after = dict(before)
        kind, reason, rule, nxt = _no_move(tick)
    inputs = LazyInputs(_inputs_json, now_ms, jitter, preference, home, state, signals, scores,
                        evidence)
    return StepResult(kind, rule, nxt, before, after, scores, new_state, inputs, reason)


def _streaks(
    policy: FailoverPolicy, state: ControllerState, evidence: Mapping[str, WindowEvidence]
) -> ControllerState:
    """The streaks after this window. They count up to the thresholds that read them (one
    past, for the breach, so a rule can say "more than N"), then stay: a pair that stays
    healthy or sick changes no state. An inconclusive window (too few samples,
    `decide/evidence.py`) neither breaches nor counts as healthy: both streaks stay."""
    unhealthy_cap = policy.breach_windows + 1
    healthy_cap = policy.return_healthy_windows
    unhealthy: dict[str, int] = {}
    healthy: dict[str, int] = {}
    for name, judged in evidence.items():
        if judged.verdict == "inconclusive":
            unhealthy[name], healthy[name] = state.unhealthy(name), state.healthy(name)
            continue
        unhealthy[name] = min(state.unhealthy(name) + 1, unhealthy_cap) if judged.breaches else 0
        healthy[name] = (min(state.healthy(name) + 1, healthy_cap)
                         if judged.verdict == "healthy" else 0)
    return ControllerState(unhealthy_windows=unhealthy, healthy_windows=healthy)


def _inputs_json(
    now_ms: int, jitter: int, preference: tuple[str, ...], home: GroupWeights,
    state: ControllerState, signals: GroupSignals | None, scores: Mapping[str, HealthScore],
    evidence: Mapping[str, WindowEvidence] | None = None,
) -> dict[str, Any]:
    """A step's inputs as its record holds them (what `replay_record` reads)."""
    return {
        "now_ms": now_ms,
        "jitter": jitter,
        "preference": list(preference),
        "home": dict(home),
        "state_before": state.to_dict(),
        "signals": (
            None if signals is None
            else {name: signals_to_dict(sig) for name, sig in sorted(signals.items())}
        ),
        "scores": {name: score.to_dict() for name, score in scores.items()},
        # each origin's window judged on its evidence (decide/evidence.py); derived from the
        # signals, so a replay recomputes it
        "evidence": {name: judged.to_dict() for name, judged in (evidence or {}).items()},
    }


def replay_record(policy: FailoverPolicy, record: Mapping[str, Any]) -> StepResult:
    """Run ``step`` again on the inputs a decision record holds (for audits and tests)."""
    inputs = record["inputs"]
    signals = inputs["signals"]
    return step(
        policy,
        tuple(inputs["preference"]),
        record["weights_before"],
        ControllerState.from_dict(inputs["state_before"]),
        None if signals is None
        else {name: signals_from_dict(data) for name, data in signals.items()},
        inputs["now_ms"],
        inputs["jitter"],
    )
