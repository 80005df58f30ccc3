"""The tier controller: re-prioritization (wait or pending trigger), utilization shedding with
hysteresis, work-conserving lending with floors, fail static; tables and properties."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.signals import TierPending, WaitQuantiles
from control_plane.decide.tiers import (
    TierState,
    _readings_json,
    actions_in_force,
    plan_lending,
    tier_step,
    utilization,
)
from control_plane.desired.model import OriginGroup, TierActionPolicy, TierActions
from harness.models import shop_group

T0 = 1_800_000_000_000
GROUP = replace(shop_group(), tier_actions=TierActionPolicy(trigger="wait"))  # 84 / 30 / 6
PENDING = replace(GROUP, tier_actions=TierActionPolicy(trigger="pending"))
NO_LENDING = replace(GROUP, tier_actions=TierActionPolicy(trigger="wait", lending=False,
                                                         preemption=False))
ACTIVE = TierState(active=True, trigger_since_ms=T0 - 40_000, active_since_ms=T0 - 10_000)


def with_policy(group: OriginGroup, **changes: object) -> OriginGroup:
    return replace(group, tier_actions=replace(group.tier_actions, **changes))


def quiet(now: int = T0, age_ms: int = 0, **active: float) -> dict[str, TierPending]:
    """Every tier read by one Envoy `e1`, with the given active peaks (default 0)."""
    return {
        tier: TierPending(0, now - age_ms, (("e1", active.get(tier, 0.0)),))
        for tier in ("critical", "normal", "background")
    }


def pending(value: float, age_ms: int = 0, now: int = T0) -> dict[str, TierPending]:
    return {**quiet(now, age_ms), "critical": TierPending(value, now - age_ms, (("e1", 0.0),))}


def wait(p95: float | None, pending_max: float = 0, now: int = T0,
         samples: int = 200, excluded: int = 0) -> dict[str, TierPending]:
    quantiles = None if p95 is None else WaitQuantiles(p95 / 2, p95, p95 * 2, samples, excluded)
    critical = TierPending(pending_max, now, (("e1", 10.0),), wait=quantiles)
    return {**quiet(now), "critical": critical}


@pytest.mark.parametrize(
    ("case", "group", "state", "readings", "kind", "active", "rule_has"),
    [
        ("pending quiet", PENDING, TierState(), pending(3), None, False,
         "critical pending max 3 ≤ 10"),
        ("at the limit is not above it", PENDING, TierState(), pending(10), None, False, "≤ 10"),
        ("an overloaded pool queue triggers", PENDING, TierState(trigger_since_ms=T0 - 30_000),
         {**quiet(), "critical": TierPending(3, T0, (("e1", 0.0),), overloaded_max=1)},
         "tier_action", True, "critical pending max 3 ≤ 10, 1 pool queue(s) overloaded"),
        ("trigger starts the count", PENDING, TierState(), pending(25), None, False,
         "for 0 s of 30 s"),
        ("trigger held 20 s of 30", PENDING, TierState(trigger_since_ms=T0 - 20_000),
         pending(25), None, False, "for 20 s of 30 s"),
        ("trigger held 30 s: on", PENDING, TierState(trigger_since_ms=T0 - 30_000), pending(25),
         "tier_action", True,
         "critical pending max 25 > 10 for 30 s (≥ 30 s): demote 50% of normal to background "
         "(answered at the edge while background is shed), shed background to its floor (503 "
         "beyond)"),
        ("a quiet tick restarts the count", PENDING, TierState(trigger_since_ms=T0 - 20_000),
         pending(2), None, False, "no trigger"),
        ("on and still triggered", PENDING, ACTIVE, pending(40), None, True, "actions stay on"),
        ("on, quiet 0 s of 60", PENDING, ACTIVE, pending(1), None, True, "for 0 s of 60 s"),
        ("on, quiet 60 s: lifted", PENDING, replace(ACTIVE, clear_since_ms=T0 - 60_000),
         pending(1), "tier_action", False, "(≥ recover_after 60 s): lifted"),
        ("no reading holds on", PENDING, ACTIVE, None, None, True,
         "fail static: no reading for tier critical; actions stay on"),
        ("no critical tier reading holds off", PENDING, TierState(trigger_since_ms=T0 - 20_000),
         {"normal": TierPending(90, T0)}, None, False, "actions stay off"),
        ("stale reading holds on", PENDING, ACTIVE, pending(0, age_ms=50_000), None, True,
         "stale (50 s > 45 s) for tier critical; actions stay on"),
        ("disabled lifts at once", with_policy(PENDING, enabled=False), ACTIVE, pending(40),
         "tier_action", False, "disabled in the desired state: lifted"),
        ("disabled and off: nothing", with_policy(PENDING, enabled=False), TierState(),
         pending(40), None, False, "tier actions disabled"),
        ("for 0 s: on at the first trigger", with_policy(PENDING, for_ms=0), TierState(),
         pending(11), "tier_action", True, "for 0 s (≥ 0 s)"),
        # the default trigger: measured pool wait (the tiers source's 35 ms)
        ("wait p95 below 35 ms", GROUP, TierState(), wait(20), None, False,
         "critical wait p95 20 ms ≤ 35 ms (200 sampled, 0 retried/hedged left out)"),
        ("wait p95 above 35 ms held 30 s: on", GROUP, TierState(trigger_since_ms=T0 - 30_000),
         wait(60), "tier_action", True, "critical wait p95 60 ms > 35 ms"),
        ("no sampled request, none pending: no trigger", GROUP, ACTIVE, wait(None), None,
         True, "critical wait: 0 sampled < 20 (0 retried/hedged left out), trigger: pending "
         "for this window: pending max 0 ≤ 10"),
        ("no sampled request while 7 pending: the pending trigger decides", GROUP,
         TierState(trigger_since_ms=T0 - 30_000), wait(None, pending_max=7), None, False,
         "trigger: pending for this window: pending max 7 ≤ 10: no trigger"),
        ("too few samples while 40 pending: the pending trigger fires", GROUP,
         TierState(trigger_since_ms=T0 - 30_000), wait(20, pending_max=40, samples=19),
         "tier_action", True, "critical wait: 19 sampled < 20"),
        # the case: a retried request's wait is 300 ms of failed attempt and backoff;
        # with it left out, 3 first attempts are too few, and nobody is pending
        ("one slow request never sheds", GROUP, TierState(trigger_since_ms=T0 - 30_000),
         wait(300, samples=3, excluded=1), None, False,
         "critical wait: 3 sampled < 20 (1 retried/hedged left out), trigger: pending"),
        ("p99 needs 100 samples", with_policy(GROUP, trigger_wait_quantile="p99"),
         TierState(trigger_since_ms=T0 - 30_000), wait(20, samples=99), None, False,
         "critical wait: 99 sampled < 100"),
        ("p99 quantile chosen", with_policy(GROUP, trigger_wait_quantile="p99"), TierState(),
         wait(20), None, False, "wait p99 40 ms > 35 ms"),
    ],
)
def test_reprioritization_table(
    case: str,
    group: OriginGroup,
    state: TierState,
    readings: dict[str, TierPending] | None,
    kind: str | None,
    active: bool,
    rule_has: str,
) -> None:
    group = with_policy(group, preemption=False)  # a waiting critical would take slots too
    result = tier_step(group, state, readings, T0)
    assert result.kind == kind, (case, result.rule)
    assert result.state.active is active, case
    assert rule_has in result.rule, (case, result.rule)
    if active:
        assert result.actions is not None
        assert result.actions.demote_tier == "normal" and result.actions.shed_tier == "background"
    else:
        assert result.actions is None or result.actions.shed_tier is None


def test_a_run_from_trigger_to_recovery_every_20_s() -> None:
    """Ticks every 20 s: on at the third triggered tick (40 s ≥ 30 s), off 60 s after the first
    quiet tick; only the two changes are `tier_action` records."""
    values = [25, 25, 25, 30, 4, 5, 3, 2, 2]
    state, kinds, active = TierState(), [], []
    for tick, value in enumerate(values):
        now = T0 + tick * 20_000
        result = tier_step(PENDING, state, pending(value, now=now), now)
        state = result.state
        kinds.append(result.kind)
        active.append(state.active)
    assert active == [False, False, True, True, True, True, True, False, False]
    assert kinds == [None, None, "tier_action", None, None, None, None, "tier_action", None]
    assert state == TierState() and state.idle


def test_a_hold_keeps_the_timers() -> None:
    counting = TierState(trigger_since_ms=T0 - 20_000)
    held = tier_step(PENDING, counting, None, T0)
    assert held.state == counting and held.kind is None
    after = tier_step(PENDING, held.state, pending(30, now=T0 + 10_000), T0 + 10_000)
    assert after.kind == "tier_action"


# --- utilization shedding ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "state", "active", "kind", "shedding", "rule_has"),
    [
        ("below the threshold", TierState(), {"critical": 80, "normal": 10}, None, False,
         "utilization 0.75 (worst Envoy e1) ≤ 0.85: no shedding"),
        ("above: the hold starts", TierState(), {"critical": 84, "normal": 25}, None, False,
         "> 0.85 for 0 s of 30 s"),
        ("above for 30 s: shed", TierState(shed_since_ms=T0 - 30_000),
         {"critical": 84, "normal": 25}, "tier_shed", True,
         "> 0.85 for 30 s (≥ 30 s): shed background (background reject)"),
        ("borrowed slots do not count", TierState(shed_since_ms=T0 - 30_000),
         {"critical": 40, "normal": 70, "background": 6}, None, False, "0.63"),
        ("on, between lift and threshold: stays", TierState(shedding=True, shed_since_ms=T0),
         {"critical": 84}, None, True, "(worst Envoy e1) ≥ lift 0.7: shedding background stays on"),
        ("on, below lift 30 s: stays", TierState(shedding=True, shed_since_ms=T0,
                                                 shed_clear_since_ms=T0 - 30_000),
         {"critical": 50}, None, True, "for 30 s of 60 s; shedding stays on"),
        ("on, below lift 60 s: lifted", TierState(shedding=True, shed_since_ms=T0,
                                                  shed_clear_since_ms=T0 - 60_000),
         {"critical": 50}, "tier_shed", False, "shedding of background lifted"),
    ],
)
def test_utilization_shedding_table(
    case: str, state: TierState, active: dict[str, float], kind: str | None, shedding: bool,
    rule_has: str,
) -> None:
    result = tier_step(NO_LENDING, state, quiet(**active), T0)
    assert [d.kind for d in result.decisions] == ([kind] if kind else []), (case, result.rule)
    assert result.state.shedding is shedding, (case, result.rule)
    assert rule_has in result.rule, (case, result.rule)
    assert (result.actions is not None and result.actions.shed_tiers == ("background",)) \
        is shedding


def test_worst_envoy_counts_not_the_pops_sum() -> None:
    readings = {
        "critical": TierPending(0, T0, (("e1", 84.0), ("e2", 10.0))),
        "normal": TierPending(0, T0, (("e1", 25.0), ("e2", 5.0))),
    }
    found = utilization(GROUP, readings)
    assert found is not None
    used, node, newest = found
    assert (round(used, 3), node, newest) == (0.908, "e1", T0)


def test_shedding_holds_on_missing_or_stale_active_readings() -> None:
    on = TierState(shedding=True, shed_since_ms=T0, shed_clear_since_ms=T0 - 59_000)
    for readings in (None, {"critical": TierPending(0, T0)}, quiet(age_ms=50_000)):
        result = tier_step(NO_LENDING, on, readings, T0)
        assert result.state == on and not result.decisions
        assert "fail static" in result.rule


def test_shed_action_of_each_tier_is_in_the_record() -> None:
    group = replace(NO_LENDING, tiers=tuple(
        replace(t, shed_action="defer") if t.name == "background" else t for t in GROUP.tiers))
    result = tier_step(group, TierState(shed_since_ms=T0 - 30_000),
                       quiet(critical=84, normal=30), T0)
    (decision,) = result.decisions
    fields = json.loads(json.dumps(result.record_fields(decision)))
    assert fields["detail"]["shed_actions"] == {"background": "defer"}
    assert fields["detail"]["change"] == "on" and fields["detail"]["shedding"] is True
    assert fields["inputs"]["readings"]["critical"]["active_by_node"] == [["e1", 84.0]]


# --- lending -------------------------------------------------------------------------------


def test_idle_critical_lends_to_normal_then_background_in_priority_order() -> None:
    demand = {"critical": 0.0, "normal": 60.0, "background": 200.0}
    plan = plan_lending(GROUP, {}, demand)
    # critical lends 84 - 0 - ceil(8.4)=9 -> 75; normal wants 60 + 3 - 30 = 33; background rest
    assert plan.spare == {"critical": 75, "normal": 0, "background": 0}
    assert plan.lent == {"normal": 33, "background": 42}


def test_critical_demand_returning_is_reclaimed_at_the_next_tick() -> None:
    lent = {"normal": 33, "background": 42}
    plan = plan_lending(GROUP, lent, {"critical": 70.0, "normal": 63.0, "background": 48.0})
    assert plan.spare["critical"] == 5
    assert sum(plan.lent.values()) <= 5
    assert plan.lent.get("background", 0) == 0  # least critical gives back first


def test_small_changes_wait_but_reclaim_does_not() -> None:
    step_group = with_policy(GROUP, lend_step_percent=10)  # 12 slots
    grown = plan_lending(step_group, {"normal": 20}, {"critical": 0.0, "normal": 57.0,
                                                      "background": 0.0})
    assert grown.lent == {"normal": 20}  # wants 30: +10 < 12 waits
    reclaimed = plan_lending(step_group, {"normal": 20}, {"critical": 70.0, "normal": 57.0,
                                                          "background": 0.0})
    # spare: critical 84 - 70 - 9 = 5, idle background 6 - 0 - 1 = 5: given back at once
    assert reclaimed.lent == {"normal": 10}


def test_a_shed_tier_borrows_nothing() -> None:
    plan = plan_lending(GROUP, {"background": 40}, {"critical": 0.0, "normal": 0.0,
                                                    "background": 300.0},
                        excluded=frozenset({"background"}))
    assert plan.lent == {}


def test_lending_in_the_step_records_lend_and_reclaim_and_sets_breaker_limits() -> None:
    busy_background = quiet(background=6)
    busy_background["background"] = replace(busy_background["background"], pending_max=50)
    first = tier_step(GROUP, TierState(), busy_background, T0)  # growth waits `for` (30 s)
    assert not first.decisions and first.state.lend_since_ms == T0
    assert "more to lend for 0 s of 30 s" in first.rule
    busy_background = {t: replace(r, observed_at_ms=T0 + 30_000)
                       for t, r in busy_background.items()}
    lend = tier_step(GROUP, first.state, busy_background, T0 + 30_000)
    assert [d.kind for d in lend.decisions] == ["tier_lend"]
    assert lend.decisions[0].detail["change"] == "lend"
    # background wants 6 + 50 + 1 (headroom) - 6 = 51 more: its breaker limit becomes 57
    assert lend.actions is not None and lend.actions.limits == (("background", 57),)
    assert lend.state.lent == (("background", 51),)
    back = quiet(T0 + 40_000, critical=80, normal=30, background=57)
    reclaim = tier_step(GROUP, lend.state, back, T0 + 40_000)  # giving back never waits
    assert [d.kind for d in reclaim.decisions] == ["tier_lend", "tier_preempt"]
    assert reclaim.decisions[0].detail["change"] == "reclaim" and reclaim.state.lent == ()
    # critical wants 80 + 9 (headroom) = 89 of its 84: it takes 5 of normal's (busy) slots
    assert reclaim.decisions[1].detail["change"] == "take"
    assert reclaim.actions is not None
    assert reclaim.actions.limits == (("critical", 89), ("normal", 25))
    assert lend.state.lend_since_ms is None


@settings(max_examples=200, deadline=None)
@given(spares=st.lists(st.floats(0, 84, allow_nan=False), min_size=1, max_size=30))
def test_lending_grows_only_after_the_hold(spares: list[float]) -> None:
    """Property: the borrowed total grows only once more could be lent for `for` (critical's
    demand varies, background always wants more)."""
    policy = GROUP.tier_actions
    state = TierState()
    for tick, critical in enumerate(spares):
        now = T0 + tick * 10_000
        readings = quiet(now, critical=critical, normal=30, background=6)
        readings["background"] = replace(readings["background"], pending_max=200)
        result = tier_step(GROUP, state, readings, now)
        before, after = sum(dict(state.lent).values()), sum(dict(result.state.lent).values())
        if after > before:
            assert state.lend_since_ms is not None or policy.for_ms == 0
            assert now - (state.lend_since_ms or now) >= policy.for_ms
        state = result.state


def test_lending_holds_when_any_tier_reading_is_missing_or_stale() -> None:
    state = TierState(lent=(("normal", 20),))
    for readings in ({"critical": quiet()["critical"]}, quiet(age_ms=60_000)):
        result = tier_step(GROUP, state, readings, T0)
        assert result.state.lent == state.lent and not any(
            d.kind == "tier_lend" for d in result.decisions)
        assert "lending: fail static" in result.rule


def test_disabled_lifts_everything_with_a_record_each() -> None:
    state = TierState(active=True, shedding=True, lent=(("normal", 9),))
    result = tier_step(with_policy(GROUP, enabled=False), state, quiet(), T0)
    assert [d.kind for d in result.decisions] == ["tier_action", "tier_shed", "tier_lend"]
    assert result.state == TierState() and result.actions is None


DEMAND = st.floats(min_value=0, max_value=400, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    critical=DEMAND, normal=DEMAND, background=DEMAND,
    lent=st.dictionaries(st.sampled_from(["critical", "normal", "background"]),
                         st.integers(1, 120), max_size=3),
    excluded=st.frozensets(st.sampled_from(["normal", "background"])),
    headroom=st.integers(0, 50), step=st.integers(0, 30), stressed=st.booleans(),
)
def test_lending_properties(
    critical: float, normal: float, background: float, lent: dict[str, int],
    excluded: frozenset[str], headroom: int, step: int, stressed: bool,
) -> None:
    group = with_policy(GROUP, lend_headroom_percent=headroom, lend_step_percent=step)
    demand = {"critical": critical, "normal": normal, "background": background}
    keeps = frozenset({"critical"}) if stressed else frozenset()
    plan = plan_lending(group, lent, demand, excluded, keeps)
    if stressed:  # re-prioritization on: critical's share is not lent at all
        assert plan.spare["critical"] == 0
    # never more lent than the lenders have spare: critical with demand at its guarantee (less
    # headroom) lends nothing, and what others borrow never eats into its demand
    assert sum(plan.lent.values()) <= plan.pool
    g0 = plan.guarantee["critical"]
    if critical >= g0:
        assert plan.spare["critical"] == 0
    assert sum(plan.lent.values()) <= sum(
        max(0, plan.guarantee[t] - demand[t]) for t in demand)
    assert not excluded & set(plan.lent)
    # floors: every tier keeps at least its guarantee (>= 1 slot) in Envoy
    actions = actions_in_force(group, TierState(lent=tuple(sorted(plan.lent.items()))))
    for tier in group.tiers:
        limit = (actions.limit(tier.name) if actions else None) or group.guarantee(tier)
        assert limit >= group.guarantee(tier) >= 1


@settings(max_examples=200, deadline=None)
@given(
    utilizations=st.lists(st.floats(0, 1.2, allow_nan=False), min_size=1, max_size=30),
    interval=st.integers(1_000, 30_000),
)
def test_shedding_only_after_the_hold_and_lifted_only_after_the_quiet_time(
    utilizations: list[float], interval: int,
) -> None:
    """Property: shedding goes on only when every tick of the last `for` was above the
    threshold, and off only when every tick of the last `recover_after` was below the lift."""
    policy = NO_LENDING.tier_actions
    state = TierState()
    history: list[tuple[int, float]] = []
    for tick, used in enumerate(utilizations):
        now = T0 + tick * interval
        history.append((now, used))
        result = tier_step(NO_LENDING, state, quiet(now, critical=used * 120), now)
        if result.state.shedding and not state.shedding:
            run = [u for t, u in history if t >= now - policy.for_ms]
            assert all(u * 120 > policy.shed_threshold * 120 - 1e-9 for u in run)
            assert any(t <= now - policy.for_ms for t, _ in history)
        if state.shedding and not result.state.shedding:
            run = [u for t, u in history if t >= now - policy.recover_after_ms]
            assert all(min(u * 120, 84) / 120 < policy.shed_lift_threshold for u in run)
            assert any(t <= now - policy.recover_after_ms for t, _ in history)
        state = result.state


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.floats(0, 100, allow_nan=False)), min_size=1,
                       max_size=30))
def test_reprioritization_lifts_only_after_recover_after_without_trigger(
    values: list[float | None],
) -> None:
    """Property (hysteresis on the lift): on → off only when no tick of the last
    `recover_after` saw the trigger; a missing reading never changes anything."""
    policy = PENDING.tier_actions
    state = TierState()
    seen: list[tuple[int, float]] = []
    for tick, value in enumerate(values):
        now = T0 + tick * 20_000
        readings = None if value is None else pending(value, now=now)
        result = tier_step(PENDING, state, readings, now)
        if value is None:
            assert result.state == state
        else:
            seen.append((now, value))
        if state.active and not result.state.active:
            recent = [v for t, v in seen if t > now - policy.recover_after_ms]
            assert all(v <= policy.trigger_pending for v in recent)
        if result.state.active and not state.active:
            recent = [v for t, v in seen if t >= now - policy.for_ms]
            assert all(v > policy.trigger_pending for v in recent)
        state = result.state


def test_record_fields_and_state_round_trip_through_json() -> None:
    result = tier_step(PENDING, TierState(trigger_since_ms=T0 - 30_000), pending(25), T0)
    fields = json.loads(json.dumps(result.record_fields(result.decisions[0])))
    assert fields["inputs"]["readings"]["critical"]["pending_max"] == 25
    assert fields["inputs"]["trigger_pending"] == 10
    assert fields["inputs"]["state_before"]["trigger_since_ms"] == T0 - 30_000
    assert fields["detail"]["actions"] == {
        "demote_tier": "normal", "demote_to": "background", "demote_share": 50,
        "shed_tier": "background", "retry_after_s": 60, "shed_tiers": [],
        # the shed tier keeps its floor (5 % of 120: its whole share), no queue beyond it
        "limits": {"background": 6}, "shed_status": {"background": 503},
        "pending_limits": {"background": 6},
    }
    assert TierState.from_dict(json.loads(json.dumps(result.state.to_dict()))) == result.state


def test_a_state_saved_before_shedding_and_lending_still_loads() -> None:
    old = {"active": True, "trigger_since_ms": None, "clear_since_ms": None,
           "active_since_ms": T0}
    assert TierState.from_dict(old) == TierState(active=True, active_since_ms=T0)


@pytest.mark.parametrize(
    "bad",
    [None, {}, {"active": "yes", "trigger_since_ms": None, "clear_since_ms": None,
                "active_since_ms": None},
     {"active": True, "trigger_since_ms": -1, "clear_since_ms": None, "active_since_ms": None},
     {"active": True, "trigger_since_ms": None, "clear_since_ms": None, "active_since_ms": None,
      "lent": {"normal": -3}},
     {"active": True, "trigger_since_ms": None, "clear_since_ms": None, "active_since_ms": None,
      "surprise": 1}],
)
def test_state_from_dict_refuses_anything_else(bad: object) -> None:
    with pytest.raises(ValueError):
        TierState.from_dict(bad)


def test_actions_of_a_policy_without_demotion_or_shedding() -> None:
    actions = replace(PENDING.tier_actions, demote_share=0, shed_tier=None).actions()
    assert actions == TierActions(demote_tier=None, demote_to=None, demote_share=0,
                                  shed_tier=None, retry_after_s=60)


@given(st.builds(
    TierPending, st.floats(0, 1e4), st.integers(0, 2**40),
    st.lists(st.tuples(st.text(max_size=6), st.floats(0, 1e4)), max_size=3).map(tuple),
    st.none() | st.floats(0, 10),
    st.none() | st.builds(WaitQuantiles, st.floats(0, 1e4), st.floats(0, 1e4),
                          st.floats(0, 1e4), st.integers(0, 1000))))
def test_readings_recorded_are_the_readings_fields(reading: TierPending) -> None:
    """The tier step's inputs hold each reading as `asdict` would (done by hand: it is on
    every pair's every tick); a field added to the reading shows up in the record."""
    assert _readings_json({"critical": reading}) == {"critical": asdict(reading)}
