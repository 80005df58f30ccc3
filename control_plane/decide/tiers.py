"""The tier controller of one (PoP, origin group): one pure call per tier tick.

Five parts, each with its own decision records, decided from the same window of readings
(``TierPending`` per tier: the worst Envoy's pool, since breakers and the LIFO watermarks act per
Envoy) with the defaults of ``TierActionPolicy``. Tiers share by priority: lending moves idle
slots, preemption moves the slots a more critical tier needs from less critical tiers down to
their floors, and shedding starts at the bottom; every tier keeps its floor
(``OriginGroup.floor``: its ``min_share``, the tiers source: "non-critical still makes progress").

1. **Re-prioritization** (the tiers source: "If P0 wait time exceeds 35ms for more than 30
   seconds, we automatically demote 50% of P1 to P2 and shed P2 entirely"). Trigger ``wait``: the
   ``trigger_wait_quantile`` of the trigger tier's pool wait (access logs) above
   ``trigger_wait_ms``, over requests that took one attempt (a retried or hedged request's
   wait holds its failed attempts and backoff); a window with fewer such samples than
   ``wait_samples_needed`` uses the ``pending`` trigger instead, and says so. Trigger
   ``pending``: the worst Envoy's pending peak above
   ``trigger_pending``, or a pool queue of the tier reported overloaded
   (``upstream_queue_overloaded`` > 0: past its adaptive LIFO high watermark) where a node
   reports it. Off → on once the trigger held at every tick for ``for_ms``; on → off once
   ``recover_after_ms`` passed without it. Kind ``tier_action``.
2. **Utilization shedding** (the tiers source ``shed_threshold: 0.85``). The origin
   concurrency in use is each Envoy's active requests of the group's tier pools, each tier
   counted up to its own slots (its guarantee, less what preemption took from it, plus what it
   took; borrowed slots are idle capacity of another tier and are reclaimed by lending, not by
   shedding), over ``max_origin_concurrency``; the worst Envoy counts. Above
   ``shed_threshold`` at every tick for ``for_ms``: every sheddable tier (never the trigger
   tier) is shed. Lifted with hysteresis: once it stayed below ``shed_lift_threshold`` for
   ``recover_after_ms``. Kind ``tier_shed``.

   **A shed tier keeps its floor** (the tiers source's starvation prevention: "guarantee at least 1
   dequeue per second per tier"; starved revalidations "triggered a thundering herd later"):
   its per-Envoy limit is its floor and its queue holds at most as many requests as the floor
   has slots, so what finds them busy is answered at once by Envoy with the tier's
   ``shed_action`` (``translate/overflow.py``: "we don't queue it at all — we serve stale or
   return 202"). Only a floor of 0 (``min_share: 0``) sheds a tier entirely.
3. **Lending** (work-conserving shares: "if P0 is empty, its capacity spills to P1"). Each
   tier's guarantee G (``OriginGroup.guarantee``) is its own whenever it wants it. Demand D =
   active + pending peak (worst Envoy). A tier with D < G - lost - headroom lends the
   difference (headroom = ``lend_headroom_percent`` of G, kept free for its own arrivals until
   the next tick; lost: what preemption took from it); the pooled spare goes to tiers with
   D + headroom > G in priority order (never to a shed tier). A lender keeps its limit, so
   lent slots are idle ones. Growth and voluntary shrinkage smaller than ``lend_step_percent``
   of ``max_origin_concurrency`` wait (hysteresis), and any growth waits until there was more
   to lend at every tick for ``for_ms`` (so a lender whose demand comes and goes does not
   flap); when a lender's demand returns, the borrowers give back at this tick whatever
   exceeds the new spare (least critical first). Kind ``tier_lend``.
4. **Preemption** (a tier short of slots takes them from less critical tiers, busy or not). A
   tier wants D + headroom slots, and at least a step (``lend_step_percent`` of
   ``max_origin_concurrency``) more than its limit while its requests wait (its measured pool
   wait's ``trigger_wait_quantile`` above ``trigger_wait_ms``: a gauge's peak read at each
   stats flush misses bursts between two flushes, a wait measured on every request does not).
   A tier wanting more than its own (G + borrowed - lost) takes the difference from the tiers
   below it, least critical first, each down to its floor, at this tick; tiers take in
   priority order, so a more critical tier's need is met first and never taken back by a less
   critical one. The taker's limit rises and the victim's falls by the same number (the origin
   is never oversubscribed by preemption). Slots are given back in the reverse order (the most
   critical victim first) once the taker held at least a step more than it wants at every
   tick for ``recover_after_ms`` (hysteresis: the same quiet time that lifts the
   re-prioritization); a shed tier takes nothing and gives back at once. Kind
   ``tier_preempt``.
5. **Queues bounded in time** (the tiers source: "800 ms for P2 before we just serve stale or
   a 202"; "the most common misconfiguration we see is setting queue limits in counts instead
   of bytes or time"). Envoy has no timeout for a request waiting in a pool's pending queue, so the
   queue's length is bounded instead: with S slots each taking the origin's measured service
   time L (``latency_ms``: the p50 of the group's origins this window, weighted by their
   weights), a queue drains S / L requests per ms, so a request behind N others waits about
   N x L / S. S is the tier's own slots (its guarantee, plus what it took, less what was taken
   from it; borrowed slots left out, since they go back at the tick their lender needs them)
   plus the slots it could still take from the tiers below it (so a critical queue overflows
   only when no less critical tier has a slot above its floor left to take). The pending
   limit is floor(S x ``queue_timeout`` / L), at least 1 and at most ``max_queue_depth`` (the
   count stays a ceiling); what overflows gets
   the tier's ``shed_action`` (translate/overflow.py). Only limits below ``max_queue_depth``
   are in force (a fast origin changes nothing); a new limit within 10 % (at least 1) of the
   one in force waits. Kind ``tier_queue``.

**Fail static.** A missing reading, or one older than ``stale_after_ms``, holds that part's
state and timers, and the rule says why. ``enabled: false`` lifts everything at once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from control_plane.decide.inputs import LazyInputs
from control_plane.decide.signals import TierPending, WaitQuantiles
from control_plane.desired.model import (
    SHED_STATUS,
    OriginGroup,
    Tier,
    TierActionPolicy,
    TierActions,
)

TierKind = Literal["tier_action", "tier_shed", "tier_lend", "tier_preempt", "tier_queue"]
TIER_KINDS: tuple[TierKind, ...] = ("tier_action", "tier_shed", "tier_lend", "tier_preempt",
                                    "tier_queue")
QUEUE_LIMIT_SLACK = 0.1  # a new pending limit within this share of the one in force waits

_REQUIRED_KEYS = frozenset({"active", "trigger_since_ms", "clear_since_ms", "active_since_ms"})
_SHED_KEYS = frozenset({"shedding", "shed_since_ms", "shed_clear_since_ms", "lend_since_ms"})
_SLOT_KEYS = frozenset({"lent", "took", "give_back_since_ms", "queue_limits"})


def _optional_ms(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"tier state {key} must be null or milliseconds >= 0, got {value!r}")
    return value


def _by_tier(data: Mapping[str, Any], key: str, least: int = 1,
             what: str = "slots > 0") -> tuple[tuple[str, int], ...]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= least for k, v in value.items()
    ):
        raise ValueError(f"tier state {key} must map tier names to {what}, got {value!r}")
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
    took: tuple[tuple[str, int], ...] = ()  # tier -> slots it took from less critical tiers
    # taker -> first tick of its current run holding a step more than it wants
    give_back_since_ms: tuple[tuple[str, int], ...] = ()
    # tier -> its pending limit bounded in time, where below its max_queue_depth
    queue_limits: tuple[tuple[str, int], ...] = ()

    @property
    def idle(self) -> bool:
        return self == TierState()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lent"] = dict(self.lent)
        data["took"] = dict(self.took)
        data["give_back_since_ms"] = dict(self.give_back_since_ms)
        data["queue_limits"] = dict(self.queue_limits)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> TierState:
        """Inverse of ``to_dict`` (states saved before shedding, lending and preemption existed
        load too); raises ValueError on anything else."""
        allowed = _REQUIRED_KEYS | _SHED_KEYS | _SLOT_KEYS
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
            lent=_by_tier(data, "lent"),
            took=_by_tier(data, "took"),
            give_back_since_ms=_by_tier(data, "give_back_since_ms", 0, "milliseconds >= 0"),
            queue_limits=_by_tier(data, "queue_limits"),
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
    limits = dict(actions.limits)
    parts = []
    if actions.demote_tier and actions.demote_to and actions.demote_share:
        edge = (f" (answered at the edge while {actions.demote_to} is shed)"
                if actions.demote_to in actions.shed else "")
        parts.append(f"demote {actions.demote_share}% of {actions.demote_tier} to "
                     f"{actions.demote_to}{edge}")
    for tier, why in [*([(actions.shed_tier, "shed")] if actions.shed_tier else []),
                      *((t, "shed for utilization") for t in actions.shed_tiers)]:
        floor = f" to its floor of {limits[tier]}" if tier in limits else " to its floor"
        parts.append(f"{why} {tier}{floor} ({status.get(tier, 503)} beyond)")
    others = [(t, n) for t, n in actions.limits if t not in actions.shed]
    if others:
        parts.append("limits: " + ", ".join(f"{t} {n}" for t, n in others))
    queues = [(t, n) for t, n in actions.pending_limits if t not in actions.shed]
    if queues:
        parts.append("queue: " + ", ".join(f"{t} at most {n} pending" for t, n in queues))
    return ", ".join(parts) or "no action configured"


def _s(ms: int) -> str:
    return f"{ms / 1000:g} s"


def sheddable_tiers(group: OriginGroup) -> tuple[str, ...]:
    """The tiers utilization shedding sheds: sheddable ones, never the trigger tier."""
    trigger = group.tier_actions.trigger_tier
    return tuple(t.name for t in group.tiers if t.sheddable and t.name != trigger)


def by_priority(group: OriginGroup) -> tuple[Tier, ...]:
    """The group's tiers, most critical first."""
    return tuple(sorted(group.tiers, key=lambda t: t.priority))


@dataclass(frozen=True)
class Slots:
    """A group's per-Envoy slot arithmetic: its tiers most critical first, their guarantees
    and floors (`slots_of`; computed once per group object)."""

    order: tuple[str, ...]
    guarantee: tuple[int, ...]  # in `order`
    floor: tuple[int, ...]

    def room(self) -> tuple[int, ...]:
        """Per tier (in `order`): its slots above its floor."""
        return tuple(g - f for g, f in zip(self.guarantee, self.floor, strict=True))


_SLOTS: dict[int, tuple[OriginGroup, Slots]] = {}
_SLOTS_KEPT = 4096


def slots_of(group: OriginGroup) -> Slots:
    """The group's `Slots` (cached per group object: groups are immutable)."""
    found = _SLOTS.get(id(group))
    if found is not None and found[0] is group:
        return found[1]
    order = by_priority(group)
    slots = Slots(tuple(t.name for t in order), tuple(group.guarantee(t) for t in order),
                  tuple(group.floor(t) for t in order))
    if len(_SLOTS) >= _SLOTS_KEPT:
        _SLOTS.clear()
    _SLOTS[id(group)] = (group, slots)
    return slots


@functools.lru_cache(maxsize=4096)
def _preempted(slots: Slots, took: tuple[tuple[str, int], ...]
               ) -> tuple[tuple[tuple[str, int], ...], tuple[int, ...]]:
    claims = dict(took)
    room = list(slots.room())
    lost = [0] * len(slots.order)
    held: dict[str, int] = {}
    for i, taker in enumerate(slots.order):
        claim = claims.get(taker, 0)
        for v in range(len(slots.order) - 1, i, -1):
            if claim <= 0:
                break
            n = min(claim, max(0, room[v] - lost[v]))
            lost[v] += n
            if n:
                held[taker] = held.get(taker, 0) + n
            claim -= n
    return tuple(held.items()), tuple(lost)


def preempted(group: OriginGroup, took: Mapping[str, int]
              ) -> tuple[dict[str, int], dict[str, int]]:
    """(what each taker holds, what each tier lost) for takers claiming `took` (pure).

    Takers in priority order; each taker's slots come from the tiers below it, least critical
    first, each down to its floor (so giving back, which shrinks a taker's claim, returns the
    most critical victim's slots first). A claim that no longer fits (a floor or a share
    changed) is cut to what does."""
    slots = slots_of(group)
    held, lost = _preempted(slots, tuple(sorted(took.items())))
    return dict(held), dict(zip(slots.order, lost, strict=True))


def own_slots(group: OriginGroup, state: TierState) -> dict[str, int]:
    """Each tier's slots without borrowed ones: its guarantee, plus what it took by
    preemption, less what was taken from it."""
    slots = slots_of(group)
    held, lost = _preempted(slots, state.took)
    took = dict(held)
    return {name: g + took.get(name, 0) - n
            for name, g, n in zip(slots.order, slots.guarantee, lost, strict=True)}


def tier_limits(group: OriginGroup, state: TierState) -> dict[str, int]:
    """Each tier's per-Envoy concurrency limit: its own slots plus what it borrows (a shed
    tier's is its floor instead: `TierActions.with_floors`)."""
    lent = dict(state.lent)
    return {name: n + lent.get(name, 0) for name, n in own_slots(group, state).items()}


def takeable(group: OriginGroup, state: TierState) -> dict[str, int]:
    """Per tier: the slots preemption could still take for it from the tiers below it (their
    guarantees above their floors, less what was taken already)."""
    slots = slots_of(group)
    _, lost = _preempted(slots, state.took)
    left = [max(0, r - n) for r, n in zip(slots.room(), lost, strict=True)]
    return {name: sum(left[i + 1:]) for i, name in enumerate(slots.order)}


def shed_of(group: OriginGroup, state: TierState) -> frozenset[str]:
    """The tiers a state sheds (re-prioritization's shed tier, utilization shedding)."""
    policy = group.tier_actions
    if not policy.enabled:
        return frozenset()
    shed = set(sheddable_tiers(group)) if state.shedding else set()
    if state.active and policy.shed_tier:
        shed.add(policy.shed_tier)
    return frozenset(shed & {t.name for t in group.tiers})


def actions_in_force(group: OriginGroup, state: TierState) -> TierActions | None:
    """The Envoy-side actions a state stands for (pure; also used to restore after a restart).

    Limits: every tier whose per-Envoy limit is not its guarantee (borrowing, preemption, a
    shed tier at its floor). Pending limits: the queues bounded in time, and a shed tier's
    queue at most its floor (what finds the floor busy is answered at once)."""
    policy = group.tier_actions
    if not policy.enabled:
        return None
    base = policy.actions() if state.active else TierActions(
        demote_tier=None, demote_to=None, demote_share=0, shed_tier=None,
        retry_after_s=policy.actions().retry_after_s,
    )
    shed_tiers = tuple(t for t in sheddable_tiers(group) if t != base.shed_tier) \
        if state.shedding else ()
    known = {t.name for t in group.tiers}
    in_force = tier_limits(group, state)
    limits = tuple((t.name, n) for t in group.tiers
                   if (n := in_force[t.name]) != group.guarantee(t))
    queues = tuple((name, n) for name, n in state.queue_limits
                   if name in known and n < group.tier(name).max_queue_depth)
    if not state.active and not shed_tiers and not limits and not queues:
        return None
    actions = replace(base, shed_tiers=shed_tiers, limits=limits, pending_limits=queues)
    status = tuple((t, SHED_STATUS[group.tier(t).shed_action]) for t in sorted(actions.shed)
                   if t in known)
    return replace(actions, shed_status=status).with_floors(group)


def _with(state: TierState, **changes: Any) -> TierState:
    """`state` with `changes` (itself when they change nothing: a steady tick copies nothing)."""
    if all(getattr(state, name) == value for name, value in changes.items()):
        return state
    return replace(state, **changes)


def _unusable(group: OriginGroup, readings: Mapping[str, TierPending], now_ms: int
              ) -> str | None:
    """Why the tiers' readings cannot be used together (None: every tier's can)."""
    policy = group.tier_actions
    problems = [f"{t.name}: {why}" for t in group.tiers
                if (why := _fresh(readings.get(t.name), policy, now_ms)) is not None]
    return "; ".join(problems) if problems else None


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
            return _Part(_with(state, trigger_since_ms=None), f"{seen}: no trigger")
        since = now_ms if state.trigger_since_ms is None else state.trigger_since_ms
        held = now_ms - since
        if held >= policy.for_ms:
            rule = f"{seen} for {_s(held)} (≥ {_s(policy.for_ms)}): {described}"
            new = _with(state, active=True, trigger_since_ms=since, clear_since_ms=None,
                          active_since_ms=now_ms)
            return _Part(new, rule, decision(True, rule))
        return _Part(_with(state, trigger_since_ms=since),
                     f"{seen} for {_s(held)} of {_s(policy.for_ms)}")
    if triggered:
        return _Part(_with(state, clear_since_ms=None), f"{seen}: actions stay on")
    clear = now_ms if state.clear_since_ms is None else state.clear_since_ms
    quiet = now_ms - clear
    if quiet >= policy.recover_after_ms:
        rule = (f"{seen} for {_s(quiet)} (≥ recover_after {_s(policy.recover_after_ms)}): "
                f"lifted ({described})")
        new = _with(state, active=False, trigger_since_ms=None, clear_since_ms=None,
                      active_since_ms=None)
        return _Part(new, rule, decision(False, rule))
    return _Part(_with(state, clear_since_ms=clear, trigger_since_ms=None),
                 f"{seen} for {_s(quiet)} of {_s(policy.recover_after_ms)}; actions stay on")


# --- 2. utilization shedding -----------------------------------------------------------------


def utilization(
    group: OriginGroup, readings: Mapping[str, TierPending], state: TierState = TierState()
) -> tuple[float, str, int] | None:
    """(utilization, worst Envoy, newest sample ms), or None without active readings.

    Per Envoy: Σ over tiers of min(active peak, the tier's own slots) / max_origin_concurrency
    (own slots: `own_slots`, borrowed ones left out).
    """
    used: dict[str, float] = {}
    newest = 0
    own = own_slots(group, state)
    for tier in group.tiers:
        reading = readings.get(tier.name)
        if reading is None or not reading.active_by_node:
            continue
        newest = max(newest, reading.observed_at_ms)
        cap = own[tier.name]
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
        off = _with(state, shedding=False, shed_since_ms=None, shed_clear_since_ms=None)
        return _Part(off, "utilization shedding: no sheddable tier")
    found = utilization(group, readings, state)
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
            return _Part(_with(state, shed_since_ms=None), f"{seen} ≤ {high:g}: no shedding")
        since = now_ms if state.shed_since_ms is None else state.shed_since_ms
        held = now_ms - since
        if held >= policy.for_ms:
            rule = (f"{seen} > {high:g} for {_s(held)} (≥ {_s(policy.for_ms)}): shed {names} "
                    f"({actions})")
            new = _with(state, shedding=True, shed_since_ms=now_ms, shed_clear_since_ms=None)
            return _Part(new, rule, decision(True, rule))
        return _Part(_with(state, shed_since_ms=since),
                     f"{seen} > {high:g} for {_s(held)} of {_s(policy.for_ms)}")
    if used >= low:
        return _Part(_with(state, shed_clear_since_ms=None),
                     f"{seen} ≥ lift {low:g}: shedding {names} stays on")
    clear = now_ms if state.shed_clear_since_ms is None else state.shed_clear_since_ms
    quiet = now_ms - clear
    if quiet >= policy.recover_after_ms:
        rule = (f"{seen} < lift {low:g} for {_s(quiet)} (≥ {_s(policy.recover_after_ms)}): "
                f"shedding of {names} lifted")
        new = _with(state, shedding=False, shed_since_ms=None, shed_clear_since_ms=None)
        return _Part(new, rule, decision(False, rule))
    return _Part(_with(state, shed_clear_since_ms=clear),
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
    lost: Mapping[str, int] | None = None,
) -> LendingPlan:
    """Pure arithmetic of work-conserving lending (see the module docstring, part 3).

    ``demand``: tier -> active + pending peak of the worst Envoy; ``excluded``: tiers that may
    not borrow (shed); ``keeps``: tiers that lend nothing (the trigger tier while
    re-prioritization is on: under stress its whole share stays free for it); ``lost``: tier
    -> slots preemption took from it (not its own to lend). Invariants (property-tested):
    Σ lent ≤ Σ spare; nothing is lent out of a tier whose demand reaches its own slots minus
    headroom, nor out of a tier that keeps.
    """
    policy = group.tier_actions
    taken = lost or {}
    guarantee = {t.name: group.guarantee(t) for t in group.tiers}
    headroom = {name: math.ceil(policy.lend_headroom_percent * g / 100)
                for name, g in guarantee.items()}
    spare = {name: 0 if name in keeps else
             max(0, math.floor(guarantee[name] - taken.get(name, 0) - demand[name]
                               - headroom[name]))
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


def _below_the_wanting(group: OriginGroup, plan: LendingPlan, lent: Mapping[str, int]
                       ) -> dict[str, int]:
    """`lent`, where no tier less critical than one left wanting more than it borrows (the
    pool ran out, or its growth waits) keeps a borrowed slot: the pool is the most critical
    wanting tier's first, and no hysteresis keeps a slot below a tier that is short."""
    out, wanting = {}, False
    for tier in by_priority(group):
        n = 0 if wanting else lent.get(tier.name, 0)
        if n:
            out[tier.name] = n
        wanting = wanting or plan.want[tier.name] > lent.get(tier.name, 0)
    return out


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
            return _Part(_with(state, lent=()), rule, decision({}, rule, None))
        return _Part(state, "lending disabled")
    if (problems := _unusable(group, readings, now_ms)) is not None:
        return _Part(state, f"lending: fail static ({problems}); lent stays "
                     f"{current or 'nothing'}")
    demand = {t.name: readings[t.name].demand for t in group.tiers}
    keeps = frozenset({policy.trigger_tier}) if state.active else frozenset()
    plan = plan_lending(group, current, demand, excluded, keeps,
                        preempted(group, dict(state.took))[1])
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
    lent = _below_the_wanting(group, plan, lent)
    base = _with(state, lend_since_ms=since)
    if lent == current:
        return _Part(base, f"lending: {summary}; lent {current or 'nothing'} (pool "
                     f"{plan.pool})")
    moves = ", ".join(f"{t} {current.get(t, 0)}→{lent.get(t, 0)}"
                      for t in plan.guarantee if current.get(t, 0) != lent.get(t, 0))
    rule = f"lending: {summary}; spare pool {plan.pool}: borrowed slots {moves}"
    new = _with(base, lent=tuple(sorted(lent.items())))
    return _Part(new, rule, decision(lent, rule, plan))


# --- 4. preemption -------------------------------------------------------------------------


@dataclass(frozen=True)
class PreemptionPlan:
    """The numbers behind one preemption decision (per Envoy, in request slots)."""

    want: dict[str, int]  # each tier's wanted slots: demand + headroom, rounded up
    have: dict[str, int]  # its slots before preemption: guarantee + borrowed
    took: dict[str, int]  # the outcome: taker -> slots it takes from less critical tiers
    lost: dict[str, int]  # victim -> slots taken from it


def plan_preemption(
    group: OriginGroup,
    demand: Mapping[str, float],
    lent: Mapping[str, int],
    excluded: frozenset[str] = frozenset(),
    at_least: Mapping[str, int] | None = None,
) -> PreemptionPlan:
    """Pure arithmetic of preemption (module docstring, part 4): in priority order, a tier
    wanting more slots than its guarantee, borrowed slots and what is left of its own after
    more critical tiers took theirs, takes the difference from the tiers below it, least
    critical first, each down to its floor. A tier wants its demand plus headroom, and at
    least ``at_least`` (a tier whose requests wait: a step more than it holds). ``excluded``
    (shed) tiers take nothing.

    Invariants (property-tested): no tier below its floor; a tier short of slots only while
    every less critical tier is at its floor; Σ took = Σ lost."""
    policy = group.tier_actions
    order = by_priority(group)
    floor_of_want = at_least or {}
    want = {t.name: max(math.ceil(demand[t.name] + math.ceil(
        policy.lend_headroom_percent * group.guarantee(t) / 100)), floor_of_want.get(t.name, 0))
            for t in order}
    have = {t.name: group.guarantee(t) + lent.get(t.name, 0) for t in order}
    lost = {t.name: 0 for t in order}
    took: dict[str, int] = {}
    for i, taker in enumerate(order):
        need = 0 if taker.name in excluded else \
            want[taker.name] - have[taker.name] + lost[taker.name]
        for victim in reversed(order[i + 1:]):
            if need <= 0:
                break
            n = min(need, max(0, group.guarantee(victim) - group.floor(victim)
                              - lost[victim.name]))
            lost[victim.name] += n
            took[taker.name] = took.get(taker.name, 0) + n
            need -= n
    return PreemptionPlan(want, have, took, {name: n for name, n in lost.items() if n})


def _waits(reading: TierPending, policy: TierActionPolicy) -> str | None:
    """What shows a tier's requests wait for its slots (None: they do not, or too few
    samples): the ``trigger_wait_quantile`` of its measured pool wait above ``trigger_wait``."""
    wait = reading.wait
    if wait is None or wait.samples < wait_samples_needed(policy):
        return None
    q = policy.trigger_wait_quantile
    value = wait.quantile(q)
    return f"{q} {value:g} ms > {policy.trigger_wait_ms} ms" if value > policy.trigger_wait_ms \
        else None


def _preemption(
    group: OriginGroup, state: TierState, readings: Mapping[str, TierPending], now_ms: int,
    excluded: frozenset[str],
) -> _Part:
    policy = group.tier_actions
    current, _ = preempted(group, dict(state.took))

    def decision(new: dict[str, int], rule: str, plan: PreemptionPlan | None) -> TierDecision:
        change = "give_back" if any(new.get(t, 0) < n for t, n in current.items()) else "take"
        detail: dict[str, Any] = {
            "change": change, "took_before": current, "took": new,
            "lost": {t: n for t, n in preempted(group, new)[1].items() if n},
            "floors": {t.name: group.floor(t) for t in group.tiers},
        }
        if plan is not None:
            detail |= {"want": plan.want, "have": plan.have}
        return TierDecision("tier_preempt", rule, detail)

    if not policy.preemption:
        if current:
            rule = "preemption disabled in the desired state: every slot given back"
            return _Part(_with(state, took=(), give_back_since_ms=()), rule,
                         decision({}, rule, None))
        return _Part(_with(state, took=(), give_back_since_ms=()), "preemption disabled")
    if (problems := _unusable(group, readings, now_ms)) is not None:
        return _Part(state, f"preemption: fail static ({problems}); taken stays "
                     f"{current or 'nothing'}")
    demand = {t.name: readings[t.name].demand for t in group.tiers}
    step = max(1, math.ceil(policy.lend_step_percent * group.max_origin_concurrency / 100))
    limits = tier_limits(group, state)
    waits = {t.name: seen for t in group.tiers
             if (seen := _waits(readings[t.name], policy)) is not None}
    plan = plan_preemption(group, demand, dict(state.lent), excluded,
                           {name: limits[name] + step for name in waits})
    running = dict(state.give_back_since_ms)
    claims: dict[str, int] = {}
    since: dict[str, int] = {}
    waiting: list[str] = []
    for tier in by_priority(group):
        name = tier.name
        now, best = current.get(name, 0), plan.took.get(name, 0)
        claims[name] = now  # a surplus smaller than a step waits (hysteresis)
        if best >= now or name in excluded:
            claims[name] = best  # taking never waits; a shed tier gives back at once
        elif now - best >= step:  # given back once the surplus held at every tick for
            since[name] = running.get(name, now_ms)  # recover_after
            if now_ms - since[name] >= policy.recover_after_ms:
                claims[name] = best
                del since[name]
            else:
                waiting.append(f"{name} to give back {now - best} for "
                               f"{_s(now_ms - since[name])} of {_s(policy.recover_after_ms)}")
    words = f"; {', '.join(waiting)}" if waiting else ""
    took, lost = preempted(group, claims)
    summary = ", ".join(
        f"{t.name} wants {plan.want[t.name]}/has {plan.have[t.name]} (floor {group.floor(t)}"
        + (f"; its requests wait: {waits[t.name]}" if t.name in waits else "") + ")"
        for t in by_priority(group)) + words
    base = _with(state, give_back_since_ms=tuple(sorted(since.items())))
    if took == current:
        held_now = ", ".join(f"{t} took {n}" for t, n in took.items())
        return _Part(base, f"preemption: {summary}; {held_now or 'nothing taken'}")
    moves = ", ".join(f"{t.name} {current.get(t.name, 0)}→{took.get(t.name, 0)}"
                      for t in by_priority(group)
                      if current.get(t.name, 0) != took.get(t.name, 0))
    victims = ", ".join(f"{t.name} {group.guarantee(t) - lost[t.name]}"
                        for t in by_priority(group) if lost[t.name])
    rule = (f"preemption: {summary}; slots taken {moves}"
            + (f" (own slots left: {victims})" if victims else ""))
    new = _with(base, took=tuple(sorted(took.items())))
    return _Part(new, rule, decision(took, rule, plan))


# --- 5. queues bounded in time ----------------------------------------------------------------


def queue_slots(group: OriginGroup, state: TierState) -> dict[str, int]:
    """Each tier's slots for its queue bound: its own slots (borrowed ones left out: they go
    back at the tick the lender needs them, and a queue sized for them would then wait for
    seconds behind the tier's own slots) plus what it could still take."""
    own, more = own_slots(group, state), takeable(group, state)
    return {name: own[name] + more[name] for name in own}


def queue_limits(group: OriginGroup, slots: Mapping[str, int], latency_ms: float
                 ) -> dict[str, int]:
    """Each tier's pending limit for the origin's service time `latency_ms` (pure): floor(slots
    x queue_timeout / latency), at least 1, at most max_queue_depth. `slots`: tier -> its
    slots (`queue_slots`; a tier not named: its guarantee)."""
    out = {}
    for tier in group.tiers:
        count = slots.get(tier.name, group.guarantee(tier))
        drained = math.floor(count * tier.queue_timeout_ms / max(latency_ms, 1e-3))
        out[tier.name] = max(1, min(tier.max_queue_depth, drained))
    return out


def _queues(group: OriginGroup, state: TierState, latency_ms: float | None) -> _Part:
    current = dict(state.queue_limits)
    if latency_ms is None:
        return _Part(state, f"queue limits: no latency measured; stay {current or 'unbounded'}")
    slots = queue_slots(group, state)
    wanted = {name: n for name, n in queue_limits(group, slots, latency_ms).items()
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
        f"{t.name} {slots[t.name]} x "
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
    changed = _with(state, queue_limits=tuple(sorted(new.items())))
    return _Part(changed, rule, TierDecision("tier_queue", rule, {
        "change": "queue", "latency_ms": latency_ms, "queue_limits_before": current,
        "queue_limits": new}))


def service_time_ms(p50_by_origin: Mapping[str, float | None], weights: Mapping[str, int]
                    ) -> float | None:
    """The origins' p50 weighted by their weights (origins without a p50 left out); None when
    none has one. What a tier's queue drains at (part 5)."""
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
        if state.took:
            decisions.append(TierDecision("tier_preempt", "tier actions disabled: every taken "
                                          "slot given back", {"change": "give_back",
                                                              "took_before": dict(state.took),
                                                              "took": {}}))
        rule = "; ".join(d.rule for d in decisions) or "tier actions disabled"
        return TierStepResult(tuple(decisions), rule, TierState(), None, inputs)
    first = _reprioritize(policy, state, readings.get(policy.trigger_tier), now_ms)
    second = _shedding(group, first.state, readings, now_ms)
    excluded = shed_of(group, second.state)
    third = _lending(group, second.state, readings, now_ms, excluded)
    fourth = _preemption(group, third.state, readings, now_ms, excluded)
    fifth = _queues(group, fourth.state, latency_ms)
    parts = (first, second, third, fourth, fifth)
    decisions = tuple(p.decision for p in parts if p.decision is not None)
    return TierStepResult(
        decisions,
        "; ".join(p.rule for p in parts),
        fifth.state,
        actions_in_force(group, fifth.state),
        inputs,
    )
