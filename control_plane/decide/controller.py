"""The weight controller of one (PoP, origin group): one pure call per reconcile tick.

``step`` is a pure function of its inputs (policy, preference, current weights, streaks, one window
of signals, the tick's time and the PoP's jitter draw), so a decision record holds everything needed
to replay it (``replay_record``). The rules, with the failover source's numbers as defaults:

1. **Fail static.** No signals, an origin without signals, or a newest sample older than
   ``stale_after_ms``: the weights and the streaks are held and the reason is given.
   **No evidence.** Signals, but no origin's window is conclusive (``decide/evidence.py``
   ``no_evidence``: too few attempts and latency observations everywhere, even none at all):
   a hold of its own (``no_evidence``), weights and streaks held, never "steady".
2. **Streaks.** A window *breaches* when 5xx + connect failures > ``error_rate_threshold`` or
   p95 > ``p95_threshold_ms`` with enough evidence (``decide/evidence.py``: ``min_samples`` and
   a confidence bound); it is *healthy* when it has enough samples, does not breach and
   p50 < ``return_p50_ms``; a window without enough samples is *inconclusive* and leaves both
   streaks as they were.
   Each origin counts consecutive breached and consecutive healthy windows, up to the thresholds
   that read them (``breach_windows`` + 1, so a rule can say "more than N"; the healthy windows a
   return to that origin needs now): a pair that stays healthy, or stays sick, changes no state
   and costs the store nothing. (A threshold raised by a reload is met by counting on from there.)
   An origin whose breach streak reaches ``breach_windows`` (a healthy -> sick onset) adds to its
   flap penalty (``damping.py``).
3. **Leave.** An origin breaching for ``breach_windows`` consecutive windows is *sick*. Its target
   comes from the mode: ``health_proportional`` (the composite score x 100), ``linear`` (minus
   ``shift_step``) or ``exponential`` (half its weight; each receiving standby at most doubles:
   5 -> 10 -> 20 -> 40). A target never rises while an origin is sick, never goes below
   ``min_warm_pool``, and a target closer than ``hysteresis`` to the current weight is ignored.
   Compare, don't only threshold: weight goes to the origins not breaching this window (in
   preference order), then to origins that breach too but whose composite score is higher by at
   least ``compare_margin`` (best first). An origin that takes weight from a worse one this tick
   gives none. The hold "nowhere better to send traffic" comes only when no origin is.
4. **Return.** When no origin is sick, weight moves back toward the home split (the preferred
   origin takes all but the standbys' warm pools) only to an origin with ``return_healthy_windows``
   consecutive healthy windows (``damping_return_windows`` while its flap penalty is at or above
   ``damping_suppress``), taken from the origins above home (least preferred first), at
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

from control_plane.decide import damping
from control_plane.decide.damping import Flap
from control_plane.decide.evidence import WindowEvidence, judge, no_evidence
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
    """What the controller remembers between ticks: consecutive windows per origin, and the
    flap penalty of each origin that flapped recently (`damping.py`)."""

    unhealthy_windows: dict[str, int] = field(default_factory=dict)
    healthy_windows: dict[str, int] = field(default_factory=dict)
    flaps: dict[str, Flap] = field(default_factory=dict)

    def unhealthy(self, origin: str) -> int:
        return self.unhealthy_windows.get(origin, 0)

    def healthy(self, origin: str) -> int:
        return self.healthy_windows.get(origin, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "unhealthy_windows": dict(sorted(self.unhealthy_windows.items())),
            "healthy_windows": dict(sorted(self.healthy_windows.items())),
            "flaps": {name: flap.to_dict() for name, flap in sorted(self.flaps.items())},
        }

    @classmethod
    def from_dict(cls, data: Any) -> ControllerState:
        """Inverse of ``to_dict``; raises ValueError on anything else. A state saved before
        flap damping (no ``flaps``) reads as one without flaps."""
        streaks = {"unhealthy_windows", "healthy_windows"}
        if not isinstance(data, dict) or not streaks <= set(data) <= streaks | {"flaps"}:
            raise ValueError(f"controller state must have unhealthy_windows and healthy_windows "
                             f"(and flaps), got {data!r}")
        flaps = data.get("flaps", {})
        if not isinstance(flaps, dict) or not all(isinstance(k, str) for k in flaps):
            raise ValueError(f"flaps must map origin -> flap, got {flaps!r}")
        return cls(
            unhealthy_windows=_count_map(data["unhealthy_windows"], "unhealthy_windows"),
            healthy_windows=_count_map(data["healthy_windows"], "healthy_windows"),
            flaps={name: Flap.from_dict(flap) for name, flap in flaps.items()},
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
    # "no_evidence", "sick_held" (at its target or warm pool), "nowhere_better" (no origin
    # better by the margin), "return_wait" or "steady"; the kind itself when they moved
    reason: str = ""
    # origin -> its flap penalty now and whether it is suppressed (origins that flapped only)
    damping: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the PoP's connected nodes the metric source heard nothing from, when the shell names them
    # as the cause of a hold (`reconcile/reconcile.py`): a run of holds changes with them
    silent: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.weights_after != self.weights_before

    def record_fields(self, pushed: Mapping[str, int] | None = None,
                      changed_by: str = "") -> dict[str, Any]:
        """Fields of its decision record (``draft(result.kind, pop=..., group=..., **these)``,
        handed to the decision recorder).

        ``pushed``: the weights the tick gives Envoy when a later step of the tick (the standby
        ramp) changed this step's proposal; the record's ``weights_after`` is then ``pushed``,
        its rule starts with what was pushed and which step changed the proposal, and
        ``detail`` says what was proposed (``proposed``) and why it changed (``changed_by``):
        a record never shows, or reads as, weights that were not pushed.
        """
        detail: dict[str, Any] = {"next": self.next, "state": self.state.to_dict()}
        if self.damping:
            detail["damping"] = self.damping
        after = dict(self.weights_after)
        rule = self.rule
        if pushed is not None and dict(pushed) != after:
            detail["proposed"] = after
            detail["changed_by"] = changed_by
            moves = ", ".join(f"{name} {self.weights_before[name]}→{weight}"
                              for name, weight in pushed.items()
                              if weight != self.weights_before.get(name))
            proposal = ", ".join(f"{name} {weight}" for name, weight in after.items())
            step = changed_by.partition(":")[0] or "a later step of the tick"
            rule = (f"pushed {moves or 'no change'} ({step} changed the controller's proposal "
                    f"{proposal}, which was not pushed); the controller's step: {self.rule}")
            after = dict(pushed)
        return {
            "weights_before": dict(self.weights_before),
            "weights_after": after,
            "inputs": self.inputs.json(),
            "rule": rule,
            "detail": detail,
        }


def proposed_weights(record: Mapping[str, Any]) -> dict[str, int]:
    """What the controller proposed in a record: ``weights_after`` unless a later step of the
    tick changed it (then ``detail.proposed``); what ``replay_record`` reproduces."""
    return dict((record.get("detail") or {}).get("proposed") or record["weights_after"])


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
    now_ms: int

    def sick(self) -> list[str]:
        return [
            name for name in self.preference
            if self.state.unhealthy(name) >= self.policy.breach_windows
        ]

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


def _better(tick: _Tick, name: str, than: str) -> bool:
    """``name`` may take weight from ``than``: it breaches nothing this window, or its composite
    score is higher by at least the compare margin (compare, don't only threshold)."""
    if not tick.breaches[name]:
        return True
    scores = tick.scores
    return scores[name].composite - scores[than].composite >= tick.policy.compare_margin - 1e-9


def _receivers_of(tick: _Tick, giver: str) -> list[str]:
    """Where weight leaving ``giver`` may go: origins breaching nothing (preference order), then
    origins better by the margin (best score first)."""
    others = [name for name in tick.preference if name != giver and _better(tick, name, giver)]
    clean = [name for name in others if not tick.breaches[name]]
    scored = sorted((name for name in others if tick.breaches[name]),
                    key=lambda name: -tick.scores[name].composite)
    return clean + scored


def _givers_and_receivers(tick: _Tick, movable: Mapping[str, int]
                          ) -> tuple[list[str], list[str]]:
    """The sick origins that give this tick (worst first) and the origins that take: an origin
    that is itself a receiver of a worse giver does not give, and the receivers are those every
    giver may give to (the worst giver's alone when they share none)."""
    givers: list[str] = []
    receivers: list[str] | None = None
    for name in sorted(movable, key=lambda name: tick.scores[name].composite):
        if receivers is not None and name in receivers:
            continue  # it takes from a worse origin this tick
        mine = [r for r in _receivers_of(tick, name) if r not in givers]
        shared = mine if receivers is None else [r for r in receivers if r in mine]
        if not shared:
            continue
        givers.append(name)
        receivers = shared
    return (givers, receivers) if receivers else ([], [])


def _leave(tick: _Tick) -> tuple[dict[str, int], str, str] | None:
    """Move weight off sick origins to origins better than them; None when nothing can move."""
    policy = tick.policy
    sick = tick.sick()
    targets = {name: _leave_target(policy, tick.current[name], tick.scores[name].composite)
               for name in sick}
    gaps = {name: tick.current[name] - targets[name] for name in sick}
    movable = {name: gap for name, gap in gaps.items() if gap > 0 and gap >= policy.hysteresis}
    givers, receivers = _givers_and_receivers(tick, movable)
    if not givers:
        return None
    movable = {name: movable[name] for name in givers}
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
        f"{cap} → moved {amount}{_compared(tick, givers, receivers)}"
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


def _compared(tick: _Tick, givers: list[str], receivers: list[str]) -> str:
    """Words for receivers that breach too (weight went there on the comparison of scores)."""
    breaching = [name for name in receivers if tick.breaches[name]]
    if not breaching:
        return ""
    worst = max(tick.scores[name].composite for name in givers)
    return "; " + ", ".join(
        f"{name} breaches too ({', '.join(tick.breaches[name])}) but scores "
        f"{tick.scores[name].composite:.2f}, better than {worst:.2f} by "
        f"{tick.scores[name].composite - worst:.2f} >= margin {tick.policy.compare_margin:g}"
        for name in breaching)


def _return_step(tick: _Tick) -> int:
    return max(1, round(tick.policy.shift_step * tick.policy.return_speed))


def _return(tick: _Tick) -> tuple[dict[str, int], str, str] | None:
    """Move weight back toward home to an origin that has been healthy long enough."""
    policy = tick.policy
    below = [name for name in tick.preference if tick.current[name] < tick.home[name]]
    ready = [name for name in below if tick.state.healthy(name) >= _need(tick, name)]
    if not ready:
        return None
    to = ready[0]
    need = _need(tick, to)
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
        f"{policy.return_p50_ms} ms{_damped(tick, to)}); return step {base} "
        f"(return speed {policy.return_speed:g}), "
        f"jitter {tick.jitter:+d} → moved {amount}; score {tick.scores[to].describe()}"
    )
    if weights[to] < tick.home[to]:
        nxt = (f"return continues by about {base} per interval while {to} stays healthy, "
               f"until {to} is back at {tick.home[to]}")
    else:
        nxt = f"{to} is back at its home weight {tick.home[to]}"
    return weights, rule, nxt


def _need(tick: _Tick, name: str) -> int:
    """Healthy windows a return to ``name`` needs now (more while its flaps are suppressed)."""
    return damping.return_windows(tick.state.flaps.get(name), tick.policy, tick.now_ms)


def _damped(tick: _Tick, name: str) -> str:
    flap = tick.state.flaps.get(name)
    if flap is None:
        return ""
    return "; " + damping.describe(name, flap, tick.policy, tick.now_ms)


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
        somewhere = any(_receivers_of(tick, name) for name in sick)
        if somewhere:
            where = ", ".join(
                f"{name} at {tick.current[name]}, target "
                f"{_leave_target(policy, tick.current[name], tick.scores[name].composite)} "
                f"(hysteresis {policy.hysteresis}, warm pool {policy.min_warm_pool})"
                for name in sick
            )
        else:
            where = (f"every origin breaches and none scores better by the margin "
                     f"{policy.compare_margin:g}: nowhere better to send traffic")
        return (
            "hold",
            "sick_held" if somewhere else "nowhere_better",
            f"{'; '.join(tick.why(name) for name in sick)}; held: {where}",
            f"moves when {', '.join(sick)} gets worse or another origin gets healthier",
        )
    if below:
        name = below[0]
        need = _need(tick, name)
        return (
            "hold",
            "return_wait",
            f"held away from home: return waits for {need} healthy windows with p50 < "
            f"{policy.return_p50_ms} ms; {name} has {tick.state.healthy(name)}"
            f"{_damped(tick, name)}",
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
    if no_evidence(evidence):
        return StepResult(
            kind="hold",
            rule="no evidence: no origin has a conclusive window ("
                 + "; ".join(f"{name}: {', '.join(evidence[name].notes)}"
                             for name in preference) + "); weights and streaks held",
            next=f"weights move once an origin's window holds {policy.min_samples} attempts "
                 "(probes filling in) and as many latency observations",
            weights_before=before,
            weights_after=dict(before),
            scores=scores,
            state=state,
            inputs=LazyInputs(_inputs_json, now_ms, jitter, preference, home, state, signals,
                              scores, evidence),
            reason="no_evidence",
            damping=damping.shown(state.flaps, policy, now_ms),
        )
    breaches = {name: evidence[name].breaches for name in preference}
    new_state = _counted(policy, preference, state, evidence, now_ms)
    tick = _Tick(policy, preference, before, home, scores, breaches, new_state, jitter, now_ms)
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
    return StepResult(kind, rule, nxt, before, after, scores, new_state, inputs, reason,
                      damping.shown(new_state.flaps, policy, now_ms))


def _counted(policy: FailoverPolicy, preference: tuple[str, ...], state: ControllerState,
             evidence: Mapping[str, WindowEvidence], now_ms: int) -> ControllerState:
    """The streaks and flaps after this window.

    Streaks count up to the thresholds that read them (one past, for the breach, so a rule can
    say "more than N"), then stay: a pair that stays healthy or sick changes no state (the
    healthy streak counts up to what a return to that origin needs now: more while its flaps are
    suppressed). An inconclusive window (too few samples, `decide/evidence.py`) neither breaches
    nor counts as healthy: both streaks stay as they were."""
    thin = {name for name in preference if evidence[name].verdict == "inconclusive"}
    unhealthy_cap = policy.breach_windows + 1
    unhealthy = {
        name: state.unhealthy(name) if name in thin
        else min(state.unhealthy(name) + 1, unhealthy_cap) if evidence[name].breaches else 0
        for name in preference
    }
    flaps = _flaps(policy, state, unhealthy, now_ms)
    return ControllerState(
        unhealthy_windows=unhealthy,
        healthy_windows={
            name: state.healthy(name) if name in thin
            else min(state.healthy(name) + 1,
                     damping.return_windows(flaps.get(name), policy, now_ms))
            if evidence[name].verdict == "healthy" else 0
            for name in preference
        },
        flaps=flaps,
    )


def _flaps(policy: FailoverPolicy, state: ControllerState, unhealthy: Mapping[str, int],
           now_ms: int) -> dict[str, Flap]:
    """The flap penalties after this window: an origin that becomes sick now (its breach streak
    reaches ``breach_windows``) adds a penalty; a penalty decayed below the reuse level is
    forgotten. Unchanged (the same dict) when nothing flapped or was forgotten."""
    onsets = [name for name, count in unhealthy.items()
              if count == policy.breach_windows and state.unhealthy(name) < count]
    flaps = dict(state.flaps)
    for name in onsets:
        flaps[name] = damping.onset(flaps.get(name), policy, now_ms)
    return {name: flap for name, flap in flaps.items()
            if name in onsets or damping.remembered(flap, policy, now_ms)}


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
