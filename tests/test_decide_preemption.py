"""Preemption (`decide/tiers.py` part 4): a tier short of slots (its demand, or its requests
waiting) takes them from less critical tiers, busy or not, down to their floors, at the tick it
is seen; they are given back in the reverse order once the surplus held for `recover_after`.
Tables and properties."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.signals import TierPending, WaitQuantiles
from control_plane.decide.tiers import (
    TierState,
    own_slots,
    plan_preemption,
    preempted,
    shed_of,
    tier_limits,
    tier_step,
)
from control_plane.desired.model import OriginGroup, TierActionPolicy
from harness.models import shop_group

T0 = 1_800_000_000_000
TIERS = ("critical", "normal", "background")


def sized(cap: int, **changes: object) -> OriginGroup:
    """The shop group at `cap` origin connections, the pending trigger (quiet here)."""
    group = replace(shop_group(), max_origin_concurrency=cap)
    return replace(group, tier_actions=replace(TierActionPolicy(trigger="pending"), **changes))


# the tiers source's priority scenario: 20 slots, guarantees 14 / 5 / 1, floors (5 %) 1 / 1 / 1
SMALL = sized(20)


def readings(now: int = T0, pending: dict[str, float] | None = None,
             **active: float) -> dict[str, TierPending]:
    """One Envoy `e1`: each tier's active peak and pending peak (demand = their sum)."""
    waiting = pending or {}
    return {t: TierPending(waiting.get(t, 0.0), now, (("e1", active.get(t, 0.0)),))
            for t in TIERS}


def test_floors_and_guarantees_of_the_priority_scenario() -> None:
    assert {t.name: (SMALL.guarantee(t), SMALL.floor(t)) for t in SMALL.tiers} == {
        "critical": (14, 1), "normal": (5, 1), "background": (1, 1)}
    big = sized(120)
    assert {t.name: big.floor(t) for t in big.tiers} == {
        "critical": 6, "normal": 6, "background": 6}
    no_floor = replace(big, tiers=tuple(replace(t, min_share_percent=0) for t in big.tiers))
    assert {no_floor.floor(t) for t in no_floor.tiers} == {0}


def test_checkout_surge_takes_normal_busy_slots_within_the_tick() -> None:
    """Every tier wants more than it has (the issue's 9.8 s into the slowdown): critical takes
    normal's slots down to normal's floor at once; background is at its floor already."""
    busy = readings(pending={"critical": 7, "normal": 10, "background": 6},
                    critical=14, normal=5, background=1)
    result = tier_step(SMALL, TierState(), busy, T0)
    assert [d.kind for d in result.decisions] == ["tier_preempt"]
    (decision,) = result.decisions
    assert decision.detail["change"] == "take"
    assert decision.detail["took"] == {"critical": 4}
    assert decision.detail["lost"] == {"normal": 4}
    assert "slots taken critical 0→4 (own slots left: normal 1)" in decision.rule
    assert result.actions is not None
    assert dict(result.actions.limits) == {"critical": 18, "normal": 1}


def test_waiting_requests_make_a_tier_short_whatever_its_gauge_peaks_read() -> None:
    """Critical's gauges (read at each stats flush) show 12 active and nobody pending (it wants
    12 + 2 headroom = its 14), but its measured pool wait p95 is 80 ms (> 35 ms): it takes a
    step (1 slot at 20) more than it holds at each tick until normal is at its floor; with a
    quiet wait, the surplus waits for recover_after."""
    group = sized(20, trigger="wait")

    def seen(now: int, p95: float | None) -> dict[str, TierPending]:
        found = readings(now, critical=12, normal=5, background=1)
        if p95 is not None:
            found["critical"] = replace(found["critical"],
                                        wait=WaitQuantiles(p95 / 2, p95, p95, 200))
        return found

    assert tier_step(group, TierState(), seen(T0, None), T0).state.took == ()
    assert tier_step(group, TierState(), seen(T0, 20.0), T0).state.took == ()
    state = TierState()
    for tick in range(5):  # one more slot per tick: 15, 16, 17, 18, then normal is at 1
        now = T0 + tick * 5_000
        result = tier_step(group, state, seen(now, 80.0), now)
        state = result.state
        assert dict(state.took) == {"critical": min(tick + 1, 4)}, result.rule
    assert "its requests wait: p95 80 ms > 35 ms" in result.rule
    quiet = tier_step(group, state, seen(T0 + 30_000, 10.0), T0 + 30_000)
    assert quiet.state.took == state.took  # a surplus of 4: it waits recover_after (60 s)
    assert "critical to give back 4 for 0 s of 60 s" in quiet.rule


def test_bottom_first_then_given_back_top_first_after_the_hold() -> None:
    """At 120 connections (84 / 30 / 6, floors 6): critical first empties background above its
    floor (nothing: its floor is its share), then normal; giving back returns normal's slots."""
    group = sized(120, lend_step_percent=1)
    wide = replace(group, tiers=tuple(replace(t, min_share_percent=1) for t in group.tiers))
    # floors 2 / 2 / 2: background has 4 above its floor, normal 28
    surge = readings(pending={"critical": 100}, critical=84, normal=30, background=6)
    taken = tier_step(wide, TierState(), surge, T0)
    _, lost = preempted(wide, dict(taken.state.took))
    assert lost == {"critical": 0, "normal": 28, "background": 4}
    # demand falls: critical wants 84 + 10 + 9 = 103, so it holds 13 too many; nothing moves
    # until the surplus has held for `recover_after` (60 s), then normal gets its 13 back first
    calmer = readings(T0 + 10_000, pending={"critical": 10}, critical=84, normal=30,
                      background=6)
    held = tier_step(wide, taken.state, calmer, T0 + 10_000)
    assert held.state.took == taken.state.took and not any(
        d.kind == "tier_preempt" for d in held.decisions)
    assert "critical to give back 13 for 0 s of 60 s" in held.rule
    later = {t: replace(r, observed_at_ms=T0 + 70_000) for t, r in calmer.items()}
    back = tier_step(wide, held.state, later, T0 + 70_000)
    (decision,) = [d for d in back.decisions if d.kind == "tier_preempt"]
    assert decision.detail["change"] == "give_back"
    assert decision.detail["lost"] == {"normal": 15, "background": 4}
    assert back.state.give_back_since_ms == ()


def test_a_shed_tier_takes_nothing_and_a_shed_victim_stays_at_its_floor() -> None:
    state = TierState(active=True, active_since_ms=T0)  # re-prioritization on: background shed
    group = sized(120)
    wide = replace(group, tiers=tuple(
        replace(t, min_share_percent=1 if t.name == "background" else 5) for t in group.tiers))
    assert shed_of(wide, state) == frozenset({"background"})
    # only background wants more: it is shed, so it takes nothing; its limit is its floor
    result = tier_step(wide, state, readings(pending={"background": 50}, background=6), T0)
    assert result.state.took == ()
    assert result.actions is not None and dict(result.actions.limits) == {"background": 2}
    assert dict(result.actions.pending_limits)["background"] == 2


def test_disabled_preemption_gives_everything_back_at_once() -> None:
    state = TierState(took=(("critical", 4),))
    result = tier_step(sized(20, preemption=False), state, readings(critical=14), T0)
    assert [d.kind for d in result.decisions] == ["tier_preempt"]
    assert result.state.took == () and result.actions is None


def test_preemption_holds_on_a_missing_reading() -> None:
    state = TierState(took=(("critical", 4),))
    result = tier_step(SMALL, state, {"critical": readings()["critical"]}, T0)
    assert result.state.took == state.took
    assert "preemption: fail static" in result.rule


def test_a_state_with_taken_slots_round_trips() -> None:
    state = TierState(took=(("critical", 4),), give_back_since_ms=(("critical", T0),))
    assert TierState.from_dict(state.to_dict()) == state


# --- properties ----------------------------------------------------------------------------

DEMAND = st.floats(min_value=0, max_value=60, allow_nan=False)
CLAIMS = st.dictionaries(st.sampled_from(TIERS), st.integers(1, 30), max_size=3)
LENT = st.dictionaries(st.sampled_from(TIERS), st.integers(1, 10), max_size=2)
FLOORS = st.tuples(st.integers(0, 70), st.integers(0, 25), st.integers(0, 5))


def floored(cap: int, floors: tuple[int, int, int], **changes: object) -> OriginGroup:
    group = sized(cap, **changes)
    return replace(group, tiers=tuple(replace(t, min_share_percent=f)
                                      for t, f in zip(group.tiers, floors, strict=True)))


@settings(max_examples=200, deadline=None)
@given(critical=DEMAND, normal=DEMAND, background=DEMAND, took=CLAIMS, lent=LENT,
       floors=FLOORS, cap=st.sampled_from([20, 40, 120]), lending=st.booleans(),
       active=st.booleans(), shedding=st.booleans())
def test_no_tier_short_while_a_less_critical_one_holds_a_slot_above_its_floor(
    critical: float, normal: float, background: float, took: dict[str, int],
    lent: dict[str, int], floors: tuple[int, int, int], cap: int, lending: bool, active: bool,
    shedding: bool,
) -> None:
    """After any tick from any state, in the limits pushed to Envoy: a tier that wants more
    slots than its limit has every less critical tier at its floor; every tier keeps at least
    its floor (a shed tier exactly its floor); preemption moves slots, it never adds any (Σ own
    slots = Σ guarantees)."""
    group = floored(cap, floors, lending=lending)
    state = TierState(active=active, shedding=shedding, took=tuple(sorted(took.items())),
                      lent=tuple(sorted(lent.items())) if lending else ())
    demand = {"critical": critical, "normal": normal, "background": background}
    result = tier_step(group, state, readings(pending=demand), T0)
    after = result.state
    shed = shed_of(group, after)
    # the limits pushed (a tier the actions do not name keeps its guarantee)
    pushed = dict(result.actions.limits) if result.actions else {}
    limits = {t.name: pushed.get(t.name, group.guarantee(t)) for t in group.tiers}
    assert {n: m for n, m in tier_limits(group, after).items() if n not in shed} == {
        n: m for n, m in limits.items() if n not in shed}
    want = plan_preemption(group, demand, dict(after.lent), shed).want
    order = sorted(group.tiers, key=lambda t: t.priority)
    for i, tier in enumerate(order):
        floor = group.floor(tier)
        assert limits[tier.name] >= floor, (tier.name, limits)
        if tier.name in shed:
            assert limits[tier.name] == floor
        elif want[tier.name] > limits[tier.name]:  # short of slots
            for lower in order[i + 1:]:
                assert limits[lower.name] == group.floor(lower), (tier.name, lower.name, limits)
    assert sum(own_slots(group, after).values()) == sum(group.guarantee(t) for t in group.tiers)


@settings(max_examples=150, deadline=None)
@given(demands=st.lists(st.tuples(DEMAND, DEMAND), min_size=2, max_size=25),
       floors=FLOORS, step=st.integers(0, 20))
def test_slots_come_back_most_critical_victim_first_and_only_after_the_hold(
    demands: list[tuple[float, float]], floors: tuple[int, int, int], step: int,
) -> None:
    """Ticks every 10 s with critical's demand varying (normal's and background's pools busy):
    a victim gets slots back only when every more critical victim has all of its own back
    (the reverse of the bottom-first taking); slots are given back only after critical held
    a surplus of at least a step at every tick for `recover_after`; taking never waits."""
    group = floored(40, floors, lending=False, lend_step_percent=step)
    policy = group.tier_actions
    slots = max(1, math.ceil(step * 40 / 100))
    background = next(t for t in group.tiers if t.name == "background")
    state, run = TierState(), None
    for tick, (critical, normal) in enumerate(demands):
        now = T0 + tick * 10_000
        demand = {"critical": critical, "normal": normal, "background": 10.0}
        result = tier_step(group, state, readings(now, pending=demand), now)
        _, before = preempted(group, dict(state.took))
        _, after = preempted(group, dict(result.state.took))
        if after["background"] < before["background"]:
            assert after["normal"] == 0, (before, after)
        if after["normal"] > 0:  # normal loses slots only once background is at its floor
            assert after["background"] == group.guarantee(background) - group.floor(background)
        best = plan_preemption(group, demand, {}, frozenset()).took.get("critical", 0)
        took_before = preempted(group, dict(state.took))[0].get("critical", 0)
        took_after = dict(result.state.took).get("critical", 0)
        run = (run if run is not None else now) if took_before - best >= slots else None
        if best > took_before:
            assert took_after == best  # taking never waits
        if took_after < took_before:
            assert run is not None and now - run >= policy.recover_after_ms, (run, now)
            run = None
        state = result.state


@settings(max_examples=200, deadline=None)
@given(took=CLAIMS, floors=FLOORS)
def test_claims_are_cut_to_what_fits(took: dict[str, int], floors: tuple[int, int, int]) -> None:
    group = floored(20, floors)
    held, lost = preempted(group, took)
    assert sum(held.values()) == sum(lost.values())
    assert "background" not in held  # nothing below the least critical tier
    for tier in group.tiers:
        assert held.get(tier.name, 0) <= took.get(tier.name, 0)
        assert group.guarantee(tier) - lost[tier.name] >= group.floor(tier)
