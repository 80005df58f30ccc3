"""The cold-standby ramp (`decide/ramp.py`): table tests of each rule, and properties over random
runs of the controller and the ramp together (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.controller import ControllerState, step
from control_plane.decide.health import score_origin
from control_plane.decide.ramp import RampState, ramp_step, replay_ramp_record
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy, StandbyRampPolicy, home_weights

FAILOVER = FailoverPolicy()
RAMP = StandbyRampPolicy()
PREF = ("primary", "secondary")
NOW = 1_000_000
HEALTHY = (1000, 0, 0, 40.0, 120.0)
BREACH = (1000, 80, 0, 200.0, 1200.0)
SHAPES = {"healthy": HEALTHY, "breach": BREACH, "slow": (1000, 0, 0, 200.0, 900.0),
          "dead": (100, 0, 900, None, None),
          "thin": (4, 0, 0, 40.0, 120.0),  # fewer than min_samples: inconclusive
          "uneven": (100, 3, 0, 40.0, 120.0)}  # 3 % 5xx, lower bound 1 %: not healthy, no breach


def sig(shape: tuple[int, int, int, float | None, float | None]) -> OriginSignals:
    return OriginSignals(*shape[:3], shape[3], shape[4], 0.0, 0, None, NOW)


def signals(primary: str = "breach", secondary: str = "healthy") -> dict[str, OriginSignals]:
    return {"primary": sig(SHAPES[primary]), "secondary": sig(SHAPES[secondary])}


def run(before: dict[str, int], proposed: dict[str, int], state: RampState,
        sigs: dict[str, OriginSignals] | None = None, policy: StandbyRampPolicy = RAMP,
        now: int = NOW):
    return ramp_step(policy, FAILOVER, PREF, before, proposed, state,
                     signals() if sigs is None else sigs, now)


COLD = RampState({}, {"secondary": NOW - 100_000})


@pytest.mark.parametrize(
    ("name", "before", "proposed", "state", "sigs", "after", "kind", "ramps"),
    [
        ("cold standby starts at the first stage above its share",
         {"primary": 95, "secondary": 5}, {"primary": 80, "secondary": 20}, COLD, None,
         {"primary": 90, "secondary": 10}, "ramp_start", {"secondary": 1}),
        ("unknown history counts as cold",
         {"primary": 95, "secondary": 5}, {"primary": 85, "secondary": 15}, RampState(), None,
         {"primary": 90, "secondary": 10}, "ramp_start", {"secondary": 1}),
        ("warm standby (at the pool for less than cold_after) is not ramped",
         {"primary": 95, "secondary": 5}, {"primary": 80, "secondary": 20},
         RampState({}, {"secondary": NOW - 10_000}), None,
         {"primary": 80, "secondary": 20}, None, {}),
        ("healthy at its stage: one stage on",
         {"primary": 90, "secondary": 10}, {"primary": 75, "secondary": 25},
         RampState({"secondary": 1}, {}), None,
         {"primary": 80, "secondary": 20}, "ramp_advance", {"secondary": 2}),
        ("not yet at its stage: no advance, capped",
         {"primary": 92, "secondary": 8}, {"primary": 77, "secondary": 23},
         RampState({"secondary": 1}, {}), None,
         {"primary": 90, "secondary": 10}, "ramp_capped", {"secondary": 1}),
        ("healthy at the last stage: complete, controller free",
         {"primary": 60, "secondary": 40}, {"primary": 45, "secondary": 55},
         RampState({"secondary": 3}, {}), None,
         {"primary": 45, "secondary": 55}, "ramp_complete", {}),
        ("degrading standby worse than the primary backs off one stage",
         {"primary": 80, "secondary": 20}, {"primary": 80, "secondary": 20},
         RampState({"secondary": 2}, {}), signals("healthy", "breach"),
         {"primary": 90, "secondary": 10}, "ramp_back_off", {"secondary": 1}),
        ("breaching standby as sick as the primary (within the margin) holds",
         {"primary": 80, "secondary": 20}, {"primary": 70, "secondary": 30},
         RampState({"secondary": 2}, {}), signals("breach", "breach"),
         {"primary": 80, "secondary": 20}, "ramp_hold", {"secondary": 2}),
        ("breaching standby better than the primary by the margin advances",
         {"primary": 80, "secondary": 20}, {"primary": 70, "secondary": 30},
         RampState({"secondary": 2}, {}), signals("breach", "slow"),
         {"primary": 70, "secondary": 30}, "ramp_advance", {"secondary": 3}),
        ("too few samples at its stage: no evidence of health, the ramp holds",
         {"primary": 90, "secondary": 10}, {"primary": 75, "secondary": 25},
         RampState({"secondary": 1}, {}), signals("breach", "thin"),
         {"primary": 90, "secondary": 10}, "ramp_hold", {"secondary": 1}),
        ("too few samples below its stage: grows within the stage, no advance",
         {"primary": 92, "secondary": 8}, {"primary": 77, "secondary": 23},
         RampState({"secondary": 1}, {}), signals("breach", "thin"),
         {"primary": 90, "secondary": 10}, "ramp_capped", {"secondary": 1}),
        ("not healthy, no breach, no better than a healthy primary: the ramp holds",
         {"primary": 80, "secondary": 20}, {"primary": 70, "secondary": 30},
         RampState({"secondary": 2}, {}), signals("healthy", "uneven"),
         {"primary": 80, "secondary": 20}, "ramp_hold", {"secondary": 2}),
        ("not healthy, no breach, better than the breaching primary: advances",
         {"primary": 80, "secondary": 20}, {"primary": 70, "secondary": 30},
         RampState({"secondary": 2}, {}), signals("breach", "uneven"),
         {"primary": 70, "secondary": 30}, "ramp_advance", {"secondary": 3}),
        ("no metrics: ramp holds",
         {"primary": 90, "secondary": 10}, {"primary": 90, "secondary": 10},
         RampState({"secondary": 1}, {}), {}, {"primary": 90, "secondary": 10}, None,
         {"secondary": 1}),
        ("stale metrics: ramp holds, caps a proposed move",
         {"primary": 90, "secondary": 10}, {"primary": 80, "secondary": 20},
         RampState({"secondary": 1}, {}),
         {n: OriginSignals(*HEALTHY[:3], 40.0, 120.0, 0.0, 0, None, NOW - 60_000)
          for n in PREF},
         {"primary": 90, "secondary": 10}, "ramp_capped", {"secondary": 1}),
        ("the shift reverses: ramp ends",
         {"primary": 80, "secondary": 20}, {"primary": 85, "secondary": 15},
         RampState({"secondary": 2}, {}), signals("healthy", "healthy"),
         {"primary": 85, "secondary": 15}, "ramp_end", {}),
    ],
)
def test_ramp_rules(name, before, proposed, state, sigs, after, kind, ramps) -> None:
    result = run(before, proposed, state, sigs)
    assert result.weights_after == after, result.rule
    assert result.kind == kind, result.rule
    assert result.state.ramps == ramps
    if kind is not None:
        assert result.rule


def test_hold_rule_keeps_a_degrading_standby_where_it_is() -> None:
    result = run({"primary": 80, "secondary": 20}, {"primary": 70, "secondary": 30},
                 RampState({"secondary": 2}, {}), signals("healthy", "slow"),
                 replace(RAMP, on_degrade="hold"))
    assert result.weights_after == {"primary": 80, "secondary": 20}
    assert result.kind == "ramp_hold" and "p95 900 ms > 800 ms" in result.rule


def test_disabled_ramp_ends_and_never_caps() -> None:
    off = replace(RAMP, enabled=False)
    result = run({"primary": 90, "secondary": 10}, {"primary": 75, "secondary": 25},
                 RampState({"secondary": 1}, {}), policy=off)
    assert result.weights_after == {"primary": 75, "secondary": 25}
    assert result.kind == "ramp_end" and result.state.ramps == {}


def test_warm_pool_clock_starts_when_the_standby_comes_down() -> None:
    result = run({"primary": 80, "secondary": 20}, {"primary": 95, "secondary": 5},
                 RampState(), signals("healthy", "healthy"))
    assert result.state.warm_pool_since_ms == {"secondary": NOW}
    again = run({"primary": 95, "secondary": 5}, {"primary": 80, "secondary": 20},
                result.state, now=NOW + 20_000)
    assert again.kind is None  # 20 s at the pool is not cold (cold after 90 s)
    later = run({"primary": 95, "secondary": 5}, {"primary": 80, "secondary": 20},
                result.state, now=NOW + 90_000)
    assert later.kind == "ramp_start"


def test_state_round_trips_and_rejects_garbage() -> None:
    state = RampState({"secondary": 2}, {"tertiary": 5})
    assert RampState.from_dict(state.to_dict()) == state
    for bad in ({}, {"ramps": [], "warm_pool_since_ms": {}},
                {"ramps": {"a": -1}, "warm_pool_since_ms": {}}):
        with pytest.raises(ValueError):
            RampState.from_dict(bad)


def test_record_replays() -> None:
    result = run({"primary": 95, "secondary": 5}, {"primary": 80, "secondary": 20}, COLD)
    record = result.record_fields({"primary": 95, "secondary": 5})
    again = replay_ramp_record(RAMP, FAILOVER, record)
    assert again.weights_after == result.weights_after and again.state == result.state


# --- properties: the controller and the ramp together over random windows -------------------

Window = dict[str, str] | None
NAMES = ("primary", "secondary", "tertiary")


@st.composite
def scenario(draw: st.DrawFn):
    names = NAMES[: draw(st.integers(2, 3))]
    mode = draw(st.sampled_from(("health_proportional", "linear", "exponential")))
    degrade = draw(st.sampled_from(("hold", "back_off")))
    shapes = st.sampled_from(sorted(SHAPES))
    window = st.one_of(st.fixed_dictionaries({n: shapes for n in names}), st.none())
    windows = draw(st.lists(window, min_size=1, max_size=40))
    return names, replace(FAILOVER, mode=mode), replace(RAMP, on_degrade=degrade), windows


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_ramp_properties(case) -> None:
    names, failover, ramp, windows = case
    weights = home_weights(names, failover.min_warm_pool)
    controller, state = ControllerState(), RampState()
    schedule = ramp.schedule
    for tick, window in enumerate(windows):
        now = NOW + tick * failover.interval_ms
        sigs = None if window is None else {
            n: OriginSignals(*SHAPES[s][:3], SHAPES[s][3], SHAPES[s][4], 0.0, 0, None, now)
            for n, s in window.items()}
        proposed = step(failover, names, weights, controller, sigs, now, 0)
        result = ramp_step(ramp, failover, names, weights, proposed.weights_after, state, sigs,
                           now)
        after = result.weights_after
        assert sum(after.values()) == 100
        # the warm pool always holds
        assert all(w >= failover.min_warm_pool for w in after.values()), (after, result.rule)
        for name in names[1:]:
            index_before = state.ramps.get(name)
            index_after = result.state.ramps.get(name)
            if index_after is not None:
                # the ramp never grows a standby past its stage, nor by more than one stage a tick
                assert after[name] <= max(schedule[index_after], weights[name]), result.rule
                if index_before is not None:
                    assert index_after <= index_before + 1
                # a degrading (breaching) standby doing worse than every origin its traffic
                # could go back to stops the ramp: no growth, no advance
                if (sigs is not None and window is not None
                        and window[name] in ("breach", "slow", "dead")
                        and all(score_origin(sigs[o], failover).composite
                                - score_origin(sigs[name], failover).composite
                                >= failover.compare_margin
                                for o in names if o != name and o not in result.state.ramps)):
                    assert after[name] <= weights[name], result.rule
                    assert index_before is None or index_after <= index_before
        # the primary never drops below what the ramping standbys leave it
        capped = sum(result.ceilings.get(n, after[n]) for n in names[1:])
        assert after[names[0]] >= min(100 - capped, proposed.weights_after[names[0]])
        controller, state, weights = proposed.state, result.state, after


def test_hedge_share_guards_a_cold_or_ramping_standby() -> None:
    """Issue 33: a standby at its warm pool may take through hedges only its ramp headroom."""
    from control_plane.decide.ramp import hedge_share
    from harness.models import shop_group

    plain = shop_group()
    group = replace(plain, tiers=tuple(
        replace(t, hedge_delay_ms=50) if t.name == "critical" else t for t in plain.tiers))
    pref = ("primary", "secondary")
    # at the warm pool (5): the first stage above is 10, so 5 points of 95 hedge
    assert hedge_share(group, pref, {"primary": 95, "secondary": 5}, None) == 52_631
    # ramping at stage 3 (20 %) with 10 %: 10 of 90
    ramping = RampState(ramps={"secondary": 2})
    assert hedge_share(group, pref, {"primary": 90, "secondary": 10}, ramping) == 111_111
    # at its stage's ceiling: no room for hedges
    assert hedge_share(group, pref, {"primary": 80, "secondary": 20}, ramping) == 0
    # warm (above the warm pool, not ramping): every request may hedge
    assert hedge_share(group, pref, {"primary": 60, "secondary": 40}, RampState()) is None
    # no hedging tier, or the ramp off: nothing to guard
    assert hedge_share(plain, pref, {"primary": 95, "secondary": 5}, None) is None
    off = replace(group, standby_ramp=replace(group.standby_ramp, enabled=False))
    assert hedge_share(off, pref, {"primary": 95, "secondary": 5}, None) is None
