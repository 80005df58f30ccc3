"""The tier controller of one (PoP, origin group): one pure call per reconcile tick.

Three parts, each with its own decision records, decided from the same window of readings
(``TierPending`` per tier: the worst Envoy's pool, since breakers and the LIFO watermarks act per
Envoy) with the defaults of ``TierActionPolicy``:

1. **Re-prioritization** (the tiers source: "If P0 wait time exceeds 35ms for more than 30
   seconds, we automatically demote 50% of P1 to P2 and shed P2 entirely"). Trigger ``wait``: the
   ``trigger_wait_quantile`` of the trigger tier's pool wait (access logs) above
   ``trigger_wait_ms``, over requests that took one attempt (a retried or hedged request's
   wait holds its failed attempts and backoff); a window with fewer such samples than
   ``wait_samples_needed`` uses the ``pending`` trigger instead, and says so. Trigger
   ``pending``: the worst Envoy's pending peak above
   ``trigger_pending``, or a pool queue of the tier reported overloaded
   (``upstream_queue_overloaded`` > 0: past its adaptive LIFO high watermark) where a node
   reports it. Off → on once the trigger held at every tick for ``for_ms``; on → off
   once ``recover_after_ms`` passed without it. Kind ``tier_action``.
2. **Utilization shedding** (the tiers source's ``shed_threshold: 0.85``). The origin
   concurrency in use is each Envoy's active requests of the group's tier pools, each tier
   counted up to its guarantee (borrowed slots are idle capacity of another tier and are
   reclaimed by lending, not by shedding), over ``max_origin_concurrency``; the worst Envoy
   counts. Above ``shed_threshold`` at every tick for ``for_ms``: every sheddable tier (never
   the trigger tier) is shed. Lifted with hysteresis: once it stayed below
   ``shed_lift_threshold`` for ``recover_after_ms``. Kind ``tier_shed``.
3. **Lending** (work-conserving shares). Each tier's guarantee G (``OriginGroup.guarantee``) is
   its own whenever it wants it. Demand D = active + pending peak (worst Envoy). A tier with
   D < G - headroom lends the difference (headroom = ``lend_headroom_percent`` of G, kept
   free for its own arrivals until the next tick); the pooled spare goes to tiers with
   D + headroom > G in priority order (never to a shed tier). A borrower's per-Envoy limit is
   G + lent; no tier's limit is ever below its G (the floor). Growth and voluntary shrinkage
   smaller than ``lend_step_percent`` of ``max_origin_concurrency`` wait (hysteresis), and any
   growth waits until there was more to lend at every tick for ``for_ms`` (so a lender whose
   demand comes and goes does not flap); when a lender's demand returns, the borrowers give
   back at this tick whatever exceeds the new spare (least critical first). Kind ``tier_lend``.

4. **Queues bounded in time** (the tiers source: "800 ms for P2 before we just serve stale or
   a 202"; "the most common misconfiguration we see is setting queue limits in counts instead
   of bytes or time"). Envoy has no timeout for a request waiting in a pool's pending queue, so the
   queue's length is bounded instead: with S slots (the tier's per-Envoy limit, lent slots
   included) each taking the origin's measured service time L (``latency_ms``: the p50 of the
   group's origins this window, weighted by their weights), a queue drains S / L requests per
   ms, so a request behind N others waits about N x L / S. The pending limit is
   floor(S x ``queue_timeout`` / L), at least 1 and at most ``max_queue_depth`` (the count
   stays a ceiling); what overflows gets the tier's ``shed_action`` (translate/overflow.py).
   Only limits below ``max_queue_depth`` are in force (a fast origin changes nothing); a new
   limit within 10 % (at least 1) of the one in force waits. Kind ``tier_queue``.

**Fail static.** A missing reading, or one older than ``stale_after_ms``, holds that part's
state and timers, and the rule says why. ``enabled: false`` lifts everything at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from control_plane.decide.inputs import LazyInputs
from control_plane.decide.signals import TierPending, WaitQuantiles
from control_plane.desired.model import SHED_STATUS, OriginGroup, TierActionPolicy, TierActions

TierKind = Literal["tier_action", "tier_shed", "tier_lend", "tier_queue"]
TIER_KINDS: tuple[TierKind, ...] = ("tier_action", "tier_shed", "tier_lend", "tier_queue")
QUEUE_LIMIT_SLACK = 0.1  # a new pending limit within this share of the one in force waits

_REQUIRED_KEYS = frozenset({"active", "trigger_since_ms", "clear_since_ms", "active_since_ms"})
_SHED_KEYS = frozenset({"shedding", "shed_since_ms", "shed_clear_since_ms", "lend_since_ms"})


def _optional_ms(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"tier state {key} must be null or milliseconds >= 0, got {value!r}")
    return value


def _lent_from(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int and v > 0 for k, v in value.items()
    ):
        raise ValueError(f"tier state lent must map tier names to slots > 0, got {value!r}")
    return tuple(sorted(value.items()))


@dataclass(frozen=True)
class TierState:
    """What the tier controller remembers between ticks (saved as JSON under "<pop>/<group>")."""

    active: bool = False  # re-prioritization (demote/shed) on
    trigger_since_ms: int | None = None  # first tick of the current run with the trigger
    clear_since_ms: int | None = None  # first tick of the current run without it (while active)
    active_since_ms: int | None = None  # when the actions went on
    shedding: bool = False  # utilization shedding on
    shed_since_ms: int | None = None  # off: first tick above the threshold; on: when it went on
    shed_clear_since_ms: int | None = None  # on: first tick of the current run below the lift
    lent: tuple[tuple[str, int], ...] = ()  # tier -> slots borrowed beyond its guarantee
    lend_since_ms: int | None = None  # first tick of the current run with more to lend
    # tier -> its pending limit bounded in time, where below its max_queue_depth
    queue_limits: tuple[tuple[str, int], ...] = ()

    @property
    def idle(self) -> bool:
        return self == TierState()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lent"] = dict(self.lent)
        data["queue_limits"] = dict(self.queue_limits)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> TierState:
        """Inverse of ``to_dict`` (states saved before shedding and lending existed load too);
        raises ValueError on anything else."""
        allowed = _REQUIRED_KEYS | _SHED_KEYS | {"lent", "queue_limits"}
        if not isinstance(data, dict) or not _REQUIRED_KEYS <= set(data) <= allowed:
            raise ValueError(f"tier state must have {sorted(_REQUIRED_KEYS)} and only "
                             f"{sorted(allowed)}, got {data!r}")
        for key in ("active", "shedding"):
            if not isinstance(data.get(key, False), bool):
                raise ValueError(f"tier state {key} must be true or false, got {data[key]!r}")
        return cls(
            active=data["active"],
            trigger_since_ms=_optional_ms(data, "trigger_since_ms"),
            clear_since_ms=_optional_ms(data, "clear_since_ms"),
            active_since_ms=_optional_ms(data, "active_since_ms"),
            shedding=data.get("shedding", False),
            shed_since_ms=_optional_ms(data, "shed_since_ms"),
            shed_clear_since_ms=_optional_ms(data, "shed_clear_since_ms"),
            lend_since_ms=_optional_ms(data, "lend_since_ms"),
            lent=_lent_from(data.get("lent", {})),
            queue_limits=_lent_from(data.get("queue_limits", {})),
        )


@dataclass(frozen=True)
class TierDecision:
    """One change of mind: a decision record of kind ``kind``."""

    kind: TierKind
    rule: str  # in words, with the numbers
    detail: dict[str, Any]  # JSON-ready: what changed


@dataclass(frozen=True)
class TierStepResult:
    """What one tick decided for the tier controller of one (PoP, group)."""

    decisions: tuple[TierDecision, ...]  # empty on a tick that changed nothing
    rule: str  # every part's reasoning on this tick, in words
    state: TierState  # the new state
    actions: TierActions | None  # what is in force after this tick (None: nothing)
    inputs: LazyInputs  # readings, time, state before (JSON-ready)

    @property
    def kind(self) -> TierKind | None:
        """The first decision's kind (None: nothing changed)."""
        return self.decisions[0].kind if self.decisions else None

    def record_fields(self, decision: TierDecision) -> dict[str, Any]:
        """Fields of its decision record (``draft(decision.kind, pop=..., group=..., **these)``)."""
        return {
            "inputs": self.inputs.json(),
            "rule": decision.rule,
            "detail": {
                **decision.detail,
                "active": self.state.active,
                "shedding": self.state.shedding,
                "actions": None if self.actions is None else self.actions.to_dict(),
                "state": self.state.to_dict(),
            },
        }


def describe_actions(actions: TierActions) -> str:
    status = dict(actions.shed_status)
    parts = []
    if actions.demote_tier and actions.demote_to and actions.demote_share:
        parts.append(f"demote {actions.demote_share}% of {actions.demote_tier} to "
                     f"{actions.demote_to}")
    if actions.shed_tier:
        parts.append(f"shed {actions.shed_tier} ({status.get(actions.shed_tier, 503)}, "
                     f"retry-after {actions.retry_after_s} s)")
    for tier in actions.shed_tiers:
        parts.append(f"shed {tier} for utilization ({status.get(tier, 503)}, retry-after "
                     f"{actions.retry_after_s} s)")
    if actions.limits:
        parts.append("lend: " + ", ".join(f"{t} limit {n}" for t, n in actions.limits))
    if actions.pending_limits:
        parts.append("queue: " + ", ".join(f"{t} at most {n} pending"
                                           for t, n in actions.pending_limits))
    return ", ".join(parts) or "no action configured"


def _s(ms: int) -> str:
    return f"{ms / 1000:g} s"


def sheddable_tiers(group: OriginGroup) -> tuple[str, ...]:
    """The tiers utilization shedding sheds: sheddable ones, never the trigger tier."""
    trigger = group.tier_actions.trigger_tier
    return tuple(t.name for t in group.tiers if t.sheddable and t.name != trigger)


def actions_in_force(group: OriginGroup, state: TierState) -> TierActions | None:
    """The Envoy-side actions a state stands for (pure; also used to restore after a restart)."""
    policy = group.tier_actions
    if not policy.enabled:
        return None
    base = policy.actions() if state.active else TierActions(
        demote_tier=None, demote_to=None, demote_share=0, shed_tier=None,
        retry_after_s=policy.actions().retry_after_s,
    )
    shed = tuple(t for t in sheddable_tiers(group) if t != base.shed_tier) \
        if state.shedding else ()
    known = {t.name for t in group.tiers}
    limits = tuple((name, group.guarantee(group.tier(name)) + extra)
                   for name, extra in state.lent if name in known and extra > 0)
    queues = tuple((name, n) for name, n in state.queue_limits
                   if name in known and n < group.tier(name).max_queue_depth)
    if not state.active and not shed and not limits and not queues:
        return None
    actions = replace(base, shed_tiers=shed, limits=limits, pending_limits=queues)
    status = tuple((t, SHED_STATUS[group.tier(t).shed_action]) for t in sorted(actions.shed)
                   if t in known)
    return replace(actions, shed_status=status)


def _fresh(reading: TierPending | None, policy: TierActionPolicy, now_ms: int) -> str | None:
    """Why the reading cannot be used (None: it can)."""
    if reading is None:
        return "no reading"
    age = now_ms - reading.observed_at_ms
    if age > policy.stale_after_ms:
        return f"reading stale ({_s(age)} > {_s(policy.stale_after_ms)})"
    return None


# --- 1. re-prioritization ------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    state: TierState
    rule: str
    decision: TierDecision | None = None


def _trigger_reading(
    policy: TierActionPolicy, reading: TierPending | None, now_ms: int
) -> tuple[bool | None, str]:
    """(triggered, what was seen); triggered None: fail static, the text says why."""
    tier = policy.trigger_tier
    why = _fresh(reading, policy, now_ms)
    if why is not None or reading is None:
        return None, f"fail static: {why} for tier {tier}"
    if policy.trigger == "pending":
        pending, limit = reading.pending_max, policy.trigger_pending
        overloaded = reading.overloaded_max or 0
        hit = pending > limit or overloaded > 0
        seen = f"{tier} pending max {pending:g} {'>' if pending > limit else '≤'} {limit}"
        if overloaded > 0:  # a pool queue past its adaptive LIFO high watermark
            seen += f", {overloaded:g} pool queue(s) overloaded"
        return hit, seen
    q, limit_ms = policy.trigger_wait_quantile, policy.trigger_wait_ms
    need = wait_samples_needed(policy)
    wait = reading.wait
    if wait is None or wait.samples < need:
        # too few single-attempt samples for the quantile: this window uses the pending trigger
        sampled = 0 if wait is None else wait.samples
        excluded = 0 if wait is None else wait.excluded
        pending, limit = reading.pending_max, policy.trigger_pending
        overloaded = reading.overloaded_max or 0
        hit = pending > limit or overloaded > 0
        seen = (f"{tier} wait: {sampled} sampled < {need} ({excluded} retried/hedged left out), "
                f"trigger: pending for this window: pending max {pending:g} "
                f"{'>' if pending > limit else '≤'} {limit}")
        if overloaded > 0:
            seen += f", {overloaded:g} pool queue(s) overloaded"
        return hit, seen
    value = wait.quantile(q)
    hit = value > limit_ms
    return hit, (f"{tier} wait {q} {value:g} ms {'>' if hit else '≤'} {limit_ms} ms "
                 f"({wait.samples} sampled, {wait.excluded} retried/hedged left out)")


def wait_samples_needed(policy: TierActionPolicy) -> int:
    """Single-attempt samples a window needs for the wait trigger: `trigger_wait_min_samples`,
    raised so the nearest-rank quantile rests on at least two samples (p95: 20, p99: 100), so
    one slow request never decides."""
    q = {"p50": 0.5, "p95": 0.95, "p99": 0.99}[policy.trigger_wait_quantile]
    return max(policy.trigger_wait_min_samples, math.ceil(round(1 / (1 - q), 6)))


def _reprioritize(
    policy: TierActionPolicy, state: TierState, reading: TierPending | None, now_ms: int
) -> _Part:
    triggered, seen = _trigger_reading(policy, reading, now_ms)
    described = describe_actions(policy.actions())
    now_on = "on" if state.active else "off"

    def decision(on: bool, rule: str) -> TierDecision:
        return TierDecision("tier_action", rule, {"change": "on" if on else "off",
                                                  "part": "reprioritize"})

    if triggered is None:
        return _Part(state, f"{seen}; actions stay {now_on}")
    if not state.active:
        if not triggered:
            return _Part(replace(state, trigger_since_ms=None), f"{seen}: no trigger")
        since = now_ms if state.trigger_since_ms is None else state.trigger_since_ms
        held = now_ms - since
        if held >= policy.for_ms:
            rule = f"{seen} for {_s(held)} (≥ {_s(policy.for_ms)}): {described}"
            new = replace(state, active=True, trigger_since_ms=since, clear_since_ms=None,
                          active_since_ms=now_ms)
            return _Part(new, rule, decision(True, rule))
        return _Part(replace(state, trigger_since_ms=since),
                     f"{seen} for {_s(held)} of {_s(policy.for_ms)}")
    if triggered:
        return _Part(replace(state, clear_since_ms=None), f"{seen}: actions stay on")
    clear = now_ms if state.clear_since_ms is None else state.clear_since_ms
    quiet = now_ms - clear
    if quiet >= policy.recover_after_ms:
        rule = (f"{seen} for {_s(quiet)} (≥ recover_after {_s(policy.recover_after_ms)}): "
                f"lifted ({described})")
        new = replace(state, active=False, trigger_since_ms=None, clear_since_ms=None,
                      active_since_ms=None)
        return _Part(new, rule, decision(False, rule))
    return _Part(replace(state, clear_since_ms=clear, trigger_since_ms=None),
                 f"{seen} for {_s(quiet)} of {_s(policy.recover_after_ms)}; actions stay on")


# --- 2. utilization shedding -----------------------------------------------------------------


def utilization(
    group: OriginGroup, readings: Mapping[str, TierPending]
) -> tuple[float, str, int] | None:
    """(utilization, worst Envoy, newest sample ms), or None without active readings.

    Per Envoy: Σ over tiers of min(active peak, guarantee) / max_origin_concurrency.
    """
    used: dict[str, float] = {}
    newest = 0
    for tier in group.tiers:
        reading = readings.get(tier.name)
        if reading is None or not reading.active_by_node:
            continue
        newest = max(newest, reading.observed_at_ms)
        cap = group.guarantee(tier)
        for node, peak in reading.active_by_node:
            used[node] = used.get(node, 0.0) + min(peak, cap)
    if not used:
        return None
    node = max(sorted(used), key=lambda n: used[n])
    return used[node] / group.max_origin_concurrency, node, newest


def _shedding(
    group: OriginGroup, state: TierState, readings: Mapping[str, TierPending], now_ms: int
) -> _Part:
    policy = group.tier_actions
    tiers = sheddable_tiers(group)
    now_on = "on" if state.shedding else "off"
    if not tiers:
        off = replace(state, shedding=False, shed_since_ms=None, shed_clear_since_ms=None)
        return _Part(off, "utilization shedding: no sheddable tier")
    found = utilization(group, readings)
    if found is None:
        return _Part(state, f"utilization: fail static: no active-request reading; shedding "
                     f"stays {now_on}")
    used, node, newest = found
    age = now_ms - newest
    if age > policy.stale_after_ms:
        return _Part(state, f"utilization: fail static: reading stale ({_s(age)} > "
                     f"{_s(policy.stale_after_ms)}); shedding stays {now_on}")
    high, low = policy.shed_threshold, policy.shed_lift_threshold
    seen = f"utilization {used:.2f} (worst Envoy {node})"
    names = ", ".join(tiers)
    actions = ", ".join(f"{t} {group.tier(t).shed_action}" for t in tiers)

    def decision(on: bool, rule: str) -> TierDecision:
        return TierDecision("tier_shed", rule, {
            "change": "on" if on else "off", "utilization": round(used, 4), "node": node,
            "tiers": list(tiers),
            "shed_actions": {t: group.tier(t).shed_action for t in tiers},
        })

    if not state.shedding:
        if used <= high:
            return _Part(replace(state, shed_since_ms=None), f"{seen} ≤ {high:g}: no shedding")
        since = now_ms if state.shed_since_ms is None else state.shed_since_ms
        held = now_ms - since
        if held >= policy.for_ms:
            rule = (f"{seen} > {high:g} for {_s(held)} (≥ {_s(policy.for_ms)}): shed {names} "
                    f"({actions})")
            new = replace(state, shedding=True, shed_since_ms=now_ms, shed_clear_since_ms=None)
            return _Part(new, rule, decision(True, rule))
        return _Part(replace(state, shed_since_ms=since),
                     f"{seen} > {high:g} for {_s(held)} of {_s(policy.for_ms)}")
    if used >= low:
        return _Part(replace(state, shed_clear_since_ms=None),
                     f"{seen} ≥ lift {low:g}: shedding {names} stays on")
    clear = now_ms if state.shed_clear_since_ms is None else state.shed_clear_since_ms
    quiet = now_ms - clear
    if quiet >= policy.recover_after_ms:
        rule = (f"{seen} < lift {low:g} for {_s(quiet)} (≥ {_s(policy.recover_after_ms)}): "
                f"shedding of {names} lifted")
        new = replace(state, shedding=False, shed_since_ms=None, shed_clear_since_ms=None)
        return _Part(new, rule, decision(False, rule))
    return _Part(replace(state, shed_clear_since_ms=clear),
                 f"{seen} < lift {low:g} for {_s(quiet)} of {_s(policy.recover_after_ms)}; "
                 "shedding stays on")


# --- 3. lending ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LendingPlan:
    """The numbers behind one lending decision (all per Envoy, in request slots)."""

    guarantee: dict[str, int]
    demand: dict[str, float]
    spare: dict[str, int]  # what each tier lends (0 for borrowers)
    want: dict[str, int]  # what each tier would borrow (0 for lenders and shed tiers)
    lent: dict[str, int] = field(default_factory=dict)  # the outcome: tier -> slots borrowed

    @property
    def pool(self) -> int:
        return sum(self.spare.values())


def plan_lending(
    group: OriginGroup,
    current: Mapping[str, int],
    demand: Mapping[str, float],
    excluded: frozenset[str] = frozenset(),
    keeps: frozenset[str] = frozenset(),
) -> LendingPlan:
    """Pure arithmetic of work-conserving lending (see the module docstring, part 3).

    ``demand``: tier -> active + pending peak of the worst Envoy; ``excluded``: tiers that may
    not borrow (shed); ``keeps``: tiers that lend nothing (the trigger tier while
    re-prioritization is on: under stress its whole share stays free for it). Invariants
    (property-tested): Σ lent ≤ Σ spare; nothing is lent out of a tier whose demand reaches
    its guarantee minus headroom, nor out of a tier that keeps; no limit below its guarantee.
    """
    policy = group.tier_actions
    guarantee = {t.name: group.guarantee(t) for t in group.tiers}
    headroom = {name: math.ceil(policy.lend_headroom_percent * g / 100)
                for name, g in guarantee.items()}
    spare = {name: 0 if name in keeps else
             max(0, math.floor(guarantee[name] - demand[name] - headroom[name]))
             for name in guarantee}
    want = {name: 0 if name in excluded else
            max(0, math.ceil(demand[name] + headroom[name] - guarantee[name]))
            for name in guarantee}
    pool = sum(spare.values())
    order = [t.name for t in sorted(group.tiers, key=lambda t: t.priority)]
    ideal: dict[str, int] = {}
    left = pool
    for name in order:
        ideal[name] = min(want[name], left)
        left -= ideal[name]
    step = max(1, math.ceil(policy.lend_step_percent * group.max_origin_concurrency / 100))
    lent: dict[str, int] = {}
    for name in order:
        now, best = current.get(name, 0), ideal[name]
        keep = name not in excluded and abs(best - now) < step
        lent[name] = now if keep else best
    excess = sum(lent.values()) - pool
    for name in reversed(order):  # a lender's demand returned: least critical gives back first
        if excess <= 0:
            break
        back = min(excess, lent[name])
        lent[name] -= back
        excess -= back
    return LendingPlan(guarantee, dict(demand), spare, want,
                       {name: n for name, n in lent.items() if n > 0})


def _lending(
    group: OriginGroup, state: TierState, readings: Mapping[str, TierPending], now_ms: int,
    excluded: frozenset[str],
) -> _Part:
    policy = group.tier_actions
    current = dict(state.lent)

    def decision(new: dict[str, int], rule: str, plan: LendingPlan | None) -> TierDecision:
        change = "reclaim" if sum(new.values()) < sum(current.values()) or any(
            new.get(t, 0) < n for t, n in current.items()) else "lend"
        detail: dict[str, Any] = {"change": change, "lent_before": current, "lent": new}
        if plan is not None:
            detail |= {"guarantee": plan.guarantee, "demand": plan.demand,
                       "spare": plan.spare, "want": plan.want}
        return TierDecision("tier_lend", rule, detail)

    if not policy.lending:
        if current:
            rule = "lending disabled in the desired state: every borrowed slot reclaimed"
            return _Part(replace(state, lent=()), rule, decision({}, rule, None))
        return _Part(state, "lending disabled")
    problems = [f"{t.name}: {why}" for t in group.tiers
                if (why := _fresh(readings.get(t.name), policy, now_ms)) is not None]
    if problems:
        return _Part(state, f"lending: fail static ({'; '.join(problems)}); lent stays "
                     f"{current or 'nothing'}")
    demand = {t.name: readings[t.name].demand for t in group.tiers}
    keeps = frozenset({policy.trigger_tier}) if state.active else frozenset()
    plan = plan_lending(group, current, demand, excluded, keeps)
    summary = ", ".join(f"{t} D {demand[t]:g}/G {plan.guarantee[t]}" for t in plan.guarantee)
    lent = plan.lent
    since = None
    if any(n > current.get(t, 0) for t, n in lent.items()):
        # growth waits until the spare has been there at every tick for `for`; giving back
        # (a lender's demand returned) never waits
        since = now_ms if state.lend_since_ms is None else state.lend_since_ms
        held = now_ms - since
        if held < policy.for_ms:
            lent = {t: m for t, n in lent.items() if (m := min(n, current.get(t, 0))) > 0}
            summary += f"; more to lend for {_s(held)} of {_s(policy.for_ms)}"
        else:
            since = None
    base = replace(state, lend_since_ms=since)
    if lent == current:
        return _Part(base, f"lending: {summary}; lent {current or 'nothing'} (pool "
                     f"{plan.pool})")
    moves = ", ".join(f"{t} {current.get(t, 0)}→{lent.get(t, 0)}"
                      for t in plan.guarantee if current.get(t, 0) != lent.get(t, 0))
    rule = f"lending: {summary}; spare pool {plan.pool}: borrowed slots {moves}"
    new = replace(base, lent=tuple(sorted(lent.items())))
    return _Part(new, rule, decision(lent, rule, plan))


# --- 4. queues bounded in time ----------------------------------------------------------------


def queue_limits(group: OriginGroup, lent: Mapping[str, int], latency_ms: float
                 ) -> dict[str, int]:
    """Each tier's pending limit for the origin's service time `latency_ms` (pure): floor(slots
    x queue_timeout / latency), at least 1, at most max_queue_depth."""
    out = {}
    for tier in group.tiers:
        slots = group.guarantee(tier) + lent.get(tier.name, 0)
        drained = math.floor(slots * tier.queue_timeout_ms / max(latency_ms, 1e-3))
        out[tier.name] = max(1, min(tier.max_queue_depth, drained))
    return out


def _queues(group: OriginGroup, state: TierState, latency_ms: float | None) -> _Part:
    current = dict(state.queue_limits)
    if latency_ms is None:
        return _Part(state, f"queue limits: no latency measured; stay {current or 'unbounded'}")
    wanted = {name: n for name, n in queue_limits(group, dict(state.lent), latency_ms).items()
              if n < group.tier(name).max_queue_depth}
    new = {}
    for name in sorted(set(wanted) | set(current)):
        now, want = current.get(name), wanted.get(name)
        if now is not None and want is not None \
                and abs(want - now) < max(1, QUEUE_LIMIT_SLACK * now):
            new[name] = now
        elif want is not None:
            new[name] = want
    words = ", ".join(
        f"{t.name} {group.guarantee(t) + dict(state.lent).get(t.name, 0)} x "
        f"{t.queue_timeout_ms} ms / {latency_ms:.0f} ms = "
        f"{wanted.get(t.name, f'≥ {t.max_queue_depth} (max_queue_depth)')}"
        for t in group.tiers)
    if new == current:
        return _Part(state, f"queue limits (slots x queue_timeout / latency): {words}")
    moves = ", ".join(
        f"{t} {current.get(t, 'unbounded')}→{new.get(t, 'max_queue_depth')}"
        for t in sorted(set(new) | set(current)) if current.get(t) != new.get(t))
    rule = (f"queues bounded in time: latency p50 {latency_ms:.0f} ms; {words}; pending "
            f"limits {moves}")
    changed = replace(state, queue_limits=tuple(sorted(new.items())))
    return _Part(changed, rule, TierDecision("tier_queue", rule, {
        "change": "queue", "latency_ms": latency_ms, "queue_limits_before": current,
        "queue_limits": new}))


def service_time_ms(p50_by_origin: Mapping[str, float | None], weights: Mapping[str, int]
                    ) -> float | None:
    """The origins' p50 weighted by their weights (origins without a p50 left out); None when
    none has one. What a tier's queue drains at (part 4)."""
    known = [(p50, weights.get(name, 0)) for name, p50 in p50_by_origin.items()
             if p50 is not None and weights.get(name, 0) > 0]
    total = sum(weight for _, weight in known)
    if not total:
        return None
    return sum(p50 * weight for p50, weight in known) / total


# --- the tick --------------------------------------------------------------------------------


def _inputs_json(group: OriginGroup, policy: TierActionPolicy, readings: Mapping[str, TierPending],
                 state: TierState, now_ms: int, latency_ms: float | None) -> dict[str, Any]:
    """A tier step's inputs as its records hold them."""
    return {
        "now_ms": now_ms,
        "latency_ms": latency_ms,
        "trigger": policy.trigger,
        "trigger_tier": policy.trigger_tier,
        "trigger_wait_ms": policy.trigger_wait_ms,
        "trigger_wait_quantile": policy.trigger_wait_quantile,
        "trigger_wait_samples_needed": wait_samples_needed(policy),
        "trigger_pending": policy.trigger_pending,
        "shed_threshold": policy.shed_threshold,
        "shed_lift_threshold": policy.shed_lift_threshold,
        "max_origin_concurrency": group.max_origin_concurrency,
        "readings": _readings_json(readings),
        "state_before": state.to_dict(),
    }


def _readings_json(readings: Mapping[str, TierPending]) -> dict[str, Any]:
    return {name: _reading_json(r) for name, r in sorted(readings.items())}


def _reading_json(reading: TierPending) -> dict[str, Any]:
    """`asdict(reading)` without its deep copies (a reading per tier per pair per tick; every
    field but `wait` is a plain value or a tuple of them)."""
    data = {name: getattr(reading, name) for name in _READING_FIELDS}
    if reading.wait is not None:
        data["wait"] = {name: getattr(reading.wait, name) for name in _WAIT_FIELDS}
    return data


_READING_FIELDS = tuple(f.name for f in fields(TierPending))
_WAIT_FIELDS = tuple(f.name for f in fields(WaitQuantiles))


def tier_step(
    group: OriginGroup,
    state: TierState,
    readings: Mapping[str, TierPending] | None,
    now_ms: int,
    latency_ms: float | None = None,
) -> TierStepResult:
    """One tick of the tier controller of one (PoP, origin group). Pure.

    ``readings``: tier name -> the window's reading (None: no readings at all);
    ``latency_ms``: the origins' service time this window (``service_time_ms``; None: none).
    """
    policy = group.tier_actions
    readings = readings or {}
    inputs = LazyInputs(_inputs_json, group, policy, readings, state, now_ms, latency_ms)
    if not policy.enabled:
        decisions = []
        if state.active:
            decisions.append(TierDecision("tier_action", "tier actions disabled in the desired "
                                          f"state: lifted ({describe_actions(policy.actions())})",
                                          {"change": "off", "part": "reprioritize"}))
        if state.shedding:
            decisions.append(TierDecision("tier_shed", "tier actions disabled: shedding lifted",
                                          {"change": "off"}))
        if state.lent:
            decisions.append(TierDecision("tier_lend", "tier actions disabled: every borrowed "
                                          "slot reclaimed", {"change": "reclaim",
                                                             "lent_before": dict(state.lent),
                                                             "lent": {}}))
        rule = "; ".join(d.rule for d in decisions) or "tier actions disabled"
        return TierStepResult(tuple(decisions), rule, TierState(), None, inputs)
    first = _reprioritize(policy, state, readings.get(policy.trigger_tier), now_ms)
    second = _shedding(group, first.state, readings, now_ms)
    probe = actions_in_force(group, replace(second.state, lent=()))
    excluded = frozenset() if probe is None else probe.shed
    third = _lending(group, second.state, readings, now_ms, excluded)
    fourth = _queues(group, third.state, latency_ms)
    parts = (first, second, third, fourth)
    decisions = tuple(p.decision for p in parts if p.decision is not None)
    return TierStepResult(
        decisions,
        "; ".join(p.rule for p in parts),
        fourth.state,
        actions_in_force(group, fourth.state),
        inputs,
    )
