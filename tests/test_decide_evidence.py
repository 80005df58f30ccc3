"""Evidence before a breach: minimum samples, confidence bounds, probes filling in, and what the
controller does with a window that has too few samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.controller import ControllerState, step
from control_plane.decide.evidence import (
    abandoned_attempts,
    judge,
    no_evidence,
    quantile_lower,
    quantile_lower_rank,
    wilson_lower,
)
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy

POLICY = FailoverPolicy()


def sig(requests: int = 1000, errors: int = 0, connect: int = 0, p50: float | None = 40.0,
        p95: float | None = 120.0, *, samples: int | None = None, p95_low: float | None = None,
        probes: int = 0, probe: float | None = None, at: int = 0) -> OriginSignals:
    return OriginSignals(requests, errors, connect, p50, p95, 0.0, 0, probe, at,
                         latency_samples=samples, p95_low_ms=p95_low, probes=probes)


thin = st.integers(0, POLICY.min_samples - 1)


@settings(max_examples=500, deadline=None)
@given(attempts=thin, data=st.data(), p50=st.floats(0, 1e5), p95=st.floats(0, 1e5),
       samples=thin, policy_min=st.integers(1, 200))
def test_a_window_with_fewer_than_the_minimum_samples_never_breaches(
    attempts: int, data: st.DataObject, p50: float, p95: float, samples: int, policy_min: int
) -> None:
    policy = replace(POLICY, min_samples=policy_min)
    attempts = min(attempts, policy_min - 1)
    failed = data.draw(st.integers(0, attempts))
    connect = data.draw(st.integers(0, attempts - failed))
    probes = data.draw(st.integers(0, policy_min - 1 - attempts))
    share = data.draw(st.one_of(st.none(), st.floats(0, 1)))
    signals = sig(attempts - connect, failed, connect, p50, p95,
                  samples=min(samples, policy_min - 1), probes=probes, probe=share)
    judged = judge(signals, policy)
    assert judged.verdict == "inconclusive" and judged.breaches == ()


@settings(max_examples=300, deadline=None)
@given(attempts=st.integers(POLICY.min_samples, 100_000))
def test_one_failure_never_breaches_once_there_are_enough_samples(attempts: int) -> None:
    judged = judge(sig(attempts, 1, p95=100.0), POLICY)
    assert judged.breaches == ()


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 100_000), data=st.data())
def test_the_wilson_lower_bound_is_below_the_share(total: int, data: st.DataObject) -> None:
    failed = data.draw(st.integers(0, total))
    low = wilson_lower(failed, total)
    assert 0.0 <= low <= failed / total + 1e-12
    if failed < total:  # one more failure never lowers it
        assert wilson_lower(failed + 1, total) >= low


@pytest.mark.parametrize(
    ("failed", "total", "breaches"),
    [
        (1, 6, False),  # the warm pool: 1 of 6 is 17 %, but 6 < 10 samples
        (1, 10, False),  # 10 %: lower bound 1.8 %
        (2, 10, True),  # 20 %: lower bound 5.7 %
        (1, 20, False),
        (2, 20, True),  # 10 %: lower bound 2.8 %
        (21, 1000, False),  # 2.1 %: over the line, lower bound 1.4 %
        (40, 1000, True),
    ],
)
def test_error_breach_needs_the_lower_bound_over_the_threshold(
    failed: int, total: int, breaches: bool
) -> None:
    assert bool(judge(sig(total, failed), POLICY).breaches) is breaches


def test_a_p95_over_the_threshold_needs_several_slow_samples() -> None:
    assert quantile_lower_rank(10) == 8  # the 8th of 10: three samples at or above it
    assert quantile_lower_rank(5) == 3 and quantile_lower_rank(1) is None
    two_slow = [100.0] * 8 + [2000.0] * 2
    three_slow = [100.0] * 7 + [2000.0] * 3
    for values, breaches in ((two_slow, False), (three_slow, True)):
        low = quantile_lower(values)
        judged = judge(sig(10, p50=100.0, p95=2000.0, samples=10, p95_low=low), POLICY)
        assert bool(judged.breaches) is breaches, (values, judged)
    slow_once = sig(10, p50=100.0, p95=2000.0, samples=10, p95_low=100.0)
    assert judge(slow_once, POLICY).verdict == "neither"  # enough samples, no breach, not healthy


def test_probes_fill_in_a_thin_window() -> None:
    # a standby at its warm pool: 6 requests, one 5xx; 12 probes of a 30 s window, all passed
    alone = judge(sig(6, 1, samples=6), POLICY)
    assert alone.verdict == "inconclusive"
    assert "errors: 6 samples < min_samples 10" in alone.notes
    filled = judge(sig(6, 1, samples=12, probes=12, probe=1.0), POLICY)
    assert filled.error_samples == 18 and filled.breaches == ()
    assert filled.verdict == "neither"  # 1 in 18 is no breach, nor evidence of health
    assert judge(sig(6, 0, samples=12, probes=12, probe=1.0), POLICY).verdict == "healthy"
    failing = judge(sig(6, 1, samples=12, probes=12, probe=0.5), POLICY)
    assert failing.verdict == "breach" and failing.breaches[0].startswith("5xx 38.9% > 2%")


def test_without_a_count_the_completed_requests_stand_in_for_latency_samples() -> None:
    assert judge(sig(9, p95=900.0), POLICY).verdict == "inconclusive"
    assert judge(sig(10, p95=900.0), POLICY).breaches == ("p95 900 ms > 800 ms",)


def test_an_inconclusive_window_leaves_the_streaks_and_is_recorded() -> None:
    names = ("primary", "secondary")
    weights = {"primary": 95, "secondary": 5}
    state = ControllerState({"primary": 1, "secondary": 0}, {"primary": 0, "secondary": 2})
    thin_window = {"primary": sig(5, 5, at=1000), "secondary": sig(4, 0, at=1000)}
    result = step(POLICY, names, weights, state, thin_window, 1000, 0)
    assert result.state == state  # neither breached nor healthy: both streaks stay
    assert result.weights_after == weights
    evidence = result.inputs["evidence"]
    assert evidence["primary"]["verdict"] == "inconclusive"
    assert "errors: 5 samples < min_samples 10" in evidence["primary"]["notes"]
    # the same failures with enough samples: the second consecutive breach
    sure = {"primary": sig(50, 50, at=2000), "secondary": sig(400, 0, at=2000)}
    after = step(POLICY, names, weights, state, sure, 2000, 0)
    assert after.state.unhealthy("primary") == 2 and after.state.healthy("secondary") == 3
    assert after.kind == "weight_shift"


def test_a_sick_origin_in_a_thin_window_gives_weight_but_never_takes_it() -> None:
    names = ("primary", "secondary")
    weights = {"primary": 60, "secondary": 40}
    sick = ControllerState({"primary": 3, "secondary": 0}, {"primary": 0, "secondary": 3})
    thin = {"primary": sig(4, 4, at=1000), "secondary": sig(400, 0, at=1000)}
    result = step(replace(POLICY, mode="linear"), names, weights, sick, thin, 1000, 0)
    assert result.kind == "weight_shift" and result.changed
    assert result.weights_after["primary"] < 60
    assert "primary too few samples this window" in result.rule


# -- abandoned attempts (issue 33): a hedge that keeps winning hides an origin ------------------

def hedged(started: int, abandoned: int, errors: int = 0, *, samples: int = 0,
           p95: float | None = None) -> OriginSignals:
    """An origin behind a hedged tier: `abandoned` of its `started` attempts never finished."""
    return replace(sig(started, errors, p50=None if p95 is None else 40.0, p95=p95,
                       samples=samples), abandoned=abandoned)


def test_abandoned_attempts_are_started_minus_finished_never_negative() -> None:
    # measured on Envoy 1.40 (issue 33): rq_total 886, rq_success 159, rq_error 1
    assert abandoned_attempts(886, 159, 1) == 726
    assert abandoned_attempts(10, 12, 0) == 0
    # a load report knows the attempts still in flight: their growth is not abandonment
    assert abandoned_attempts(100, 80, 5, in_flight_change=10) == 5


def test_a_hedged_origin_whose_attempts_all_go_unanswered_breaches() -> None:
    # issue 33's window: 294 attempts, 3 errors (1 %), no latency sample: it was "inconclusive"
    judged = judge(hedged(294, 291, 3), POLICY)
    assert judged.verdict == "breach"
    assert judged.breaches and "none of its 294 attempts succeeded" in judged.breaches[0]


def test_none_succeeded_breaches_below_min_samples() -> None:
    judged = judge(hedged(3, 2, 1), POLICY)
    assert judged.verdict == "breach", judged
    # one attempt still in flight when the window closed is not an origin that answers nothing
    assert judge(hedged(1, 1), POLICY).verdict == "inconclusive"


def test_a_large_abandoned_share_breaches_on_its_lower_bound() -> None:
    judged = judge(hedged(1000, 300, samples=700, p95=120.0), POLICY)
    assert judged.verdict == "breach"
    assert any(b.startswith("abandoned 30.0% > 10%") for b in judged.breaches), judged


@pytest.mark.parametrize("share", [0.01, 0.03, 0.05, 0.08])
def test_ordinary_light_hedging_never_breaches(share: float) -> None:
    """A healthy origin whose tail beyond the hedge delay (a few percent of its attempts) is
    lost to hedges stays below the breach, however many samples (docs/benchmarks.md)."""
    for started in (20, 200, 2_000, 200_000):
        lost = round(started * share)
        judged = judge(hedged(started, lost, samples=started - lost, p95=45.0), POLICY)
        assert judged.breaches == (), (started, judged)
        assert judged.verdict == "healthy", (started, judged)


def test_an_abandoned_share_over_the_threshold_without_evidence_is_not_healthy() -> None:
    judged = judge(hedged(20, 3, samples=17, p95=45.0), POLICY)  # 15 %, lower bound 5.2 %
    assert judged.breaches == () and judged.verdict == "neither"


def test_the_abandoned_share_pulls_the_errors_score_down() -> None:
    from control_plane.decide.health import score_origin

    clean = score_origin(hedged(1000, 0, samples=1000, p95=45.0), POLICY)
    lost = score_origin(hedged(1000, 900, samples=100, p95=45.0), POLICY)
    assert clean.errors == 1.0
    assert lost.errors is not None and lost.errors < 0 and lost.limiting == "errors"


# -- no evidence is said as such ----------------------------------------------------------------

def test_every_origin_inconclusive_is_no_evidence() -> None:
    judged = {"primary": judge(sig(0, p50=None, p95=None), POLICY),
              "secondary": judge(sig(3, p95=None, p50=None), POLICY)}
    assert no_evidence(judged)
    judged["secondary"] = judge(sig(1000), POLICY)
    assert not no_evidence(judged)
    assert not no_evidence({})


def test_the_controller_holds_for_no_evidence_and_never_calls_it_steady() -> None:
    home = {"primary": 95, "secondary": 5}
    quiet = {"primary": sig(0, p50=None, p95=None, at=1000),
             "secondary": sig(0, p50=None, p95=None, at=1000)}
    state = ControllerState(unhealthy_windows={"primary": 1}, healthy_windows={"secondary": 2})
    result = step(POLICY, ("primary", "secondary"), home, state, quiet, 1000, 0)
    assert (result.kind, result.reason) == ("hold", "no_evidence")
    assert result.weights_after == home and result.state == state
    assert result.rule.startswith("no evidence: no origin has a conclusive window")
    assert "errors: 0 samples < min_samples 10" in result.rule
    assert result.inputs.json()["evidence"]["primary"]["verdict"] == "inconclusive"
