"""Table tests of the weight controller: one scenario per rule of the failover source."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.decide.controller import (
    ControllerState,
    StepResult,
    home_weights,
    signals_from_dict,
    signals_to_dict,
    step,
)
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy, GroupWeights

POLICY = FailoverPolicy()
PREF = ("primary", "secondary")
TICK = 20_000


def ok(at: int, p50: float = 40.0) -> OriginSignals:
    return OriginSignals(1000, 0, 0, p50, 120.0, 0.0, 0, 1.0, at)


def bad(at: int, errors: int = 79, p95: float = 300.0) -> OriginSignals:
    return OriginSignals(1000, errors, 0, 200.0, p95, 0.0, 0, 1.0, at)


def run(
    windows: list[dict[str, OriginSignals] | None],
    policy: FailoverPolicy = POLICY,
    pref: tuple[str, ...] = PREF,
    weights: GroupWeights | None = None,
    jitter: int = 0,
) -> list[StepResult]:
    current = weights or home_weights(pref, policy.min_warm_pool)
    state = ControllerState()
    results = []
    for tick, window in enumerate(windows, start=1):
        result = step(policy, pref, current, state, window, tick * TICK, jitter)
        results.append(result)
        current, state = result.weights_after, result.state
    return results


def sick_primary(n: int, pref: tuple[str, ...] = PREF) -> list[dict[str, OriginSignals] | None]:
    return [
        {name: (bad if name == pref[0] else ok)((i + 1) * TICK) for name in pref} for i in range(n)
    ]


def healthy(n: int, start: int = 0, pref: tuple[str, ...] = PREF, p50: float = 40.0
            ) -> list[dict[str, OriginSignals] | None]:
    return [{name: ok((start + i + 1) * TICK, p50) for name in pref} for i in range(n)]


def test_breach_needs_two_consecutive_windows() -> None:
    first, second = run(sick_primary(2))
    assert first.kind == "threshold_breach"
    assert first.weights_after == {"primary": 95, "secondary": 5}
    assert "window 1 of 2" in first.rule and "5xx 7.9% > 2%" in first.rule
    assert "1 more window" in first.next
    assert second.kind == "weight_shift"
    assert second.weights_after == {"primary": 85, "secondary": 15}
    assert "window 2 of 2" in second.rule and "step cap 10" in second.rule


def test_an_interrupted_breach_starts_counting_again() -> None:
    windows = sick_primary(1) + healthy(1, 1) + sick_primary(1)
    assert [r.kind for r in run(windows)] == ["threshold_breach", "steady", "threshold_breach"]


def test_p95_alone_breaches() -> None:
    windows = [{"primary": bad(t * TICK, errors=0, p95=900.0), "secondary": ok(t * TICK)}
               for t in (1, 2)]
    result = run(windows)[-1]
    assert result.kind == "weight_shift"
    assert "p95 900 ms > 800 ms" in result.rule


@pytest.mark.parametrize(
    ("mode", "primary_path"),
    [
        # score 0.21 -> target 21; 10 per tick, then the last move is within hysteresis
        ("health_proportional", [95, 85, 75, 65, 55, 45, 35, 25, 25]),
        ("linear", [95, 85, 75, 65, 55, 45, 35, 25, 15, 5, 5]),
        # the standby ramps 5 -> 10 -> 20 -> 35 (doubling, capped at 15); the primary halves
        ("exponential", [95, 90, 80, 65, 50, 35, 20, 10, 5, 5]),
    ],
)
def test_leave_paths_per_mode(mode: str, primary_path: list[int]) -> None:
    policy = replace(POLICY, mode=mode)
    results = run(sick_primary(len(primary_path)), policy=policy)
    assert [r.weights_after["primary"] for r in results] == primary_path
    assert all(sum(r.weights_after.values()) == 100 for r in results)
    assert results[-1].kind == "hold"


def test_exponential_standby_ramp_doubles() -> None:
    results = run(sick_primary(5), policy=replace(POLICY, mode="exponential"))
    assert [r.weights_after["secondary"] for r in results] == [5, 10, 20, 35, 50]


def test_health_proportional_target_tracks_score() -> None:
    # 3 % errors -> score 0.7 -> target 70: 95 -> 85 -> 75 -> 70, then steady on target
    windows = [
        {"primary": bad(t * TICK, errors=30), "secondary": ok(t * TICK)} for t in range(1, 6)
    ]
    assert [r.weights_after["primary"] for r in run(windows)] == [95, 85, 75, 70, 70]


def test_jitter_is_added_to_the_step() -> None:
    up = run(sick_primary(2), jitter=2)[-1]
    down = run(sick_primary(2), jitter=-2)[-1]
    assert up.weights_after["primary"] == 95 - 12
    assert down.weights_after["primary"] == 95 - 8
    assert "jitter +2" in up.rule


def test_jitter_never_overshoots_the_target() -> None:
    # linear: the target is exactly one shift_step away, so +2 cannot push past it
    up = run(sick_primary(2), policy=replace(POLICY, mode="linear"), jitter=2)[-1]
    assert up.weights_after["primary"] == 85


def test_jitter_never_exceeds_max_step() -> None:
    policy = replace(POLICY, mode="exponential")
    results = run(sick_primary(6), policy=policy, jitter=2)
    moves = [abs(r.weights_after["primary"] - r.weights_before["primary"]) for r in results]
    assert max(moves) == policy.max_step


@pytest.mark.parametrize("jitter", [3, -3])
def test_jitter_outside_policy_is_rejected(jitter: int) -> None:
    with pytest.raises(ValueError, match="jitter"):
        run(sick_primary(1), jitter=jitter)


@pytest.mark.parametrize(
    "weights",
    [{"primary": 90, "secondary": 5}, {"primary": 95}, {"primary": 95.0, "secondary": 5}],
)
def test_bad_weights_are_rejected(weights: GroupWeights) -> None:
    with pytest.raises(ValueError, match="weights"):
        step(POLICY, PREF, weights, ControllerState(), None, 0, 0)


def test_missing_signals_hold_and_freeze_streaks() -> None:
    state = ControllerState({"primary": 1, "secondary": 0}, {"primary": 0, "secondary": 4})
    weights = {"primary": 60, "secondary": 40}
    for signals, reason in [
        (None, "no metrics for this group"),
        ({"primary": ok(TICK)}, "no metrics for secondary"),
        ({"primary": ok(TICK - 45_001), "secondary": ok(TICK)}, "metrics stale 45 s (primary)"),
    ]:
        result = step(POLICY, PREF, weights, state, signals, TICK, 2)
        assert result.kind == "hold"
        assert result.weights_after == weights
        assert result.state == state
        assert reason in result.rule


def test_signals_exactly_at_the_stale_limit_still_count() -> None:
    signals = {"primary": bad(0), "secondary": ok(0)}
    assert step(POLICY, PREF, home_weights(PREF, 5), ControllerState(), signals,
                POLICY.stale_after_ms, 0).kind == "threshold_breach"


def test_return_needs_three_healthy_windows_and_goes_at_half_speed() -> None:
    results = run(sick_primary(4) + healthy(6, 4))
    kinds = [r.kind for r in results[4:]]
    assert kinds == ["hold", "hold", "return", "return", "return", "return"]
    assert "1 of 3 so far" in results[4].next and "2 of 3 so far" in results[5].next
    returns = [r.weights_after["primary"] - r.weights_before["primary"] for r in results[6:]]
    assert returns == [5, 5, 5, 5]


def test_no_return_while_p50_is_slow() -> None:
    results = run(sick_primary(3) + healthy(6, 3, p50=260.0))
    assert {r.kind for r in results[3:]} == {"hold"}
    assert results[-1].weights_after == results[2].weights_after


def test_return_stops_at_home() -> None:
    results = run(healthy(4), weights={"primary": 92, "secondary": 8}, jitter=2)
    assert [r.weights_after["primary"] for r in results] == [92, 92, 95, 95]
    assert [r.kind for r in results] == ["hold", "hold", "return", "steady"]


def test_three_origins_leave_to_the_next_preferred_healthy_origin() -> None:
    pref = ("a", "b", "c")
    windows = [{"a": bad(t * TICK), "b": bad(t * TICK), "c": ok(t * TICK)} for t in (1, 2)]
    result = run(windows, pref=pref)[-1]
    assert result.weights_before == {"a": 90, "b": 5, "c": 5}
    assert result.weights_after == {"a": 80, "b": 5, "c": 15}


def test_three_origins_second_choice_takes_the_weight() -> None:
    pref = ("a", "b", "c")
    result = run(sick_primary(2, pref), pref=pref)[-1]
    assert result.weights_after == {"a": 80, "b": 15, "c": 5}


def test_everyone_breaching_holds() -> None:
    windows = [{"primary": bad(t * TICK), "secondary": bad(t * TICK)} for t in (1, 2, 3)]
    result = run(windows)[-1]
    assert result.kind == "hold"
    assert "nowhere better" in result.rule
    assert result.weights_after == {"primary": 95, "secondary": 5}


@pytest.mark.parametrize("mode", ["health_proportional", "linear", "exponential"])
@pytest.mark.parametrize(("primary", "secondary", "loser"), [
    (950, 600, "primary"),  # 95 % vs 60 % 5xx: both far past dead, 60 % is the better place
    (600, 950, None),  # the primary is the better one: nothing moves towards the worse
    (610, 605, None),  # 61 % vs 60.5 %: 0.05 apart, within the compare margin 0.1: a hold
])
def test_two_failing_origins_compare(mode: str, primary: int, secondary: int,
                                     loser: str | None) -> None:
    """Compare, don't only threshold, at the bad end too: the scores of 60 % and 95 % 5xx do
    not both saturate at 0, so weight leaves the worse for the better by the margin."""
    policy = replace(POLICY, mode=mode)
    windows = [{"primary": bad(t * TICK, errors=primary),
                "secondary": bad(t * TICK, errors=secondary)} for t in (1, 2)]
    result = run(windows, policy)[-1]
    if loser is None:
        assert result.kind == "hold"
        assert result.weights_after == {"primary": 95, "secondary": 5}
        if primary > secondary:
            assert "nowhere better" in result.rule
    else:
        assert result.kind == "weight_shift", result.rule
        assert result.weights_after[loser] < result.weights_before[loser]
        assert "breaches too" in result.rule and "nowhere better" not in result.rule


def test_single_origin_group_is_steady_or_holds() -> None:
    results = run([{"only": bad(t * TICK)} for t in (1, 2, 3)], pref=("only",))
    assert [r.kind for r in results] == ["threshold_breach", "hold", "hold"]
    assert results[-1].weights_after == {"only": 100}


def test_record_fields_carry_everything_to_log() -> None:
    result = run(sick_primary(2))[-1]
    fields = result.record_fields()
    assert fields["weights_before"] == {"primary": 95, "secondary": 5}
    assert fields["inputs"]["scores"]["primary"]["composite"] == pytest.approx(0.21)
    assert fields["inputs"]["signals"]["primary"]["errors_5xx"] == 79
    assert fields["detail"]["state"] == result.state.to_dict()


def test_controller_state_round_trip_and_validation() -> None:
    state = ControllerState({"a": 2}, {"a": 0, "b": 5})
    assert ControllerState.from_dict(state.to_dict()) == state
    for bad_data in [
        {"unhealthy_windows": {"a": -1}, "healthy_windows": {}},
        {"unhealthy_windows": {"a": "2"}, "healthy_windows": {}},
        {"unhealthy_windows": {}},
        [],
    ]:
        with pytest.raises(ValueError):
            ControllerState.from_dict(bad_data)


@given(st.builds(OriginSignals, st.integers(0, 10**6), st.integers(0, 10**6),
                 st.integers(0, 10**6), st.none() | st.floats(0, 1e4),
                 st.none() | st.floats(0, 1e4), st.floats(0, 1e4), st.integers(0, 10**6),
                 st.none() | st.floats(0, 1), st.integers(0, 2**42)))
def test_signals_recorded_are_the_signals_fields(signals: OriginSignals) -> None:
    assert signals_to_dict(signals) == asdict(signals)
    assert signals_from_dict(signals_to_dict(signals)) == signals
