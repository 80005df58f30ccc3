"""Health score: each signal's sub-score and the weighted minimum."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.health import (
    SIGNAL_WEIGHTS,
    breach_reasons,
    is_healthy_window,
    score_origin,
)
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy

POLICY = FailoverPolicy()


def sig(
    requests: int = 1000,
    errors: int = 0,
    connect: int = 0,
    p50: float | None = 40.0,
    p95: float | None = 120.0,
    pending: float = 0.0,
    overflow: int = 0,
    probe: float | None = 1.0,
) -> OriginSignals:
    return OriginSignals(requests, errors, connect, p50, p95, pending, overflow, probe, 0)


@pytest.mark.parametrize(
    ("signals", "field", "expected"),
    [
        (sig(errors=79), "errors", 0.21),  # 7.9 % against 2 %: 1 - 3.95 / 5
        (sig(errors=20), "errors", 0.8),  # exactly at the threshold
        (sig(errors=100), "errors", 0.0),  # five times the threshold
        (sig(requests=90, connect=10), "errors", 0.0),  # connect failures count as errors
        (sig(errors=600), "errors", -5.0),  # past dead: 30 thresholds, -0.2 each past 5
        (sig(errors=950), "errors", -8.5),
        (sig(p95=800.0), "latency", 0.8),
        (sig(p95=4000.0), "latency", 0.0),
        (sig(p95=8000.0), "latency", -1.0),
        (sig(pending=80.0), "saturation", 0.8),  # at the adaptive-LIFO high watermark
        (sig(pending=800.0), "saturation", 0.0),  # saturation stays in 0..1
        (sig(requests=980, overflow=20), "saturation", 0.8),  # 2 % refused by the queue
        (sig(probe=0.25), "probe", 0.25),
    ],
)
def test_sub_scores(signals: OriginSignals, field: str, expected: float) -> None:
    assert getattr(score_origin(signals, POLICY), field) == pytest.approx(expected)


def test_weighted_minimum_not_average() -> None:
    score = score_origin(sig(errors=79, p95=1440.0), POLICY)
    assert score.errors == pytest.approx(0.21)
    assert score.latency == pytest.approx(0.64)
    assert score.composite == pytest.approx(0.21)
    assert score.limiting == "errors"
    assert score.describe().startswith("0.21 = min(errors 0.21, latency 0.64")


def test_weight_limits_how_far_one_signal_pulls_down() -> None:
    score = score_origin(sig(probe=0.0), POLICY)
    assert score.composite == pytest.approx(1 - SIGNAL_WEIGHTS["probe"])
    assert score.limiting == "probe"


def test_idle_origin_is_not_unhealthy() -> None:
    score = score_origin(sig(requests=0, p50=None, p95=None, probe=None), POLICY)
    assert (score.errors, score.latency, score.probe) == (None, None, None)
    assert score.composite == 1.0
    assert breach_reasons(sig(requests=0, p50=None, p95=None), POLICY) == ()
    assert not is_healthy_window(sig(requests=0, p50=None, p95=None), POLICY)


def test_breach_reasons_name_the_numbers() -> None:
    assert breach_reasons(sig(errors=79, p95=1200.0), POLICY) == (
        "5xx 7.9% > 2%",
        "p95 1200 ms > 800 ms",
    )
    assert breach_reasons(sig(errors=20, p95=800.0), POLICY) == ()  # at, not over


def test_healthy_window_needs_low_p50() -> None:
    assert is_healthy_window(sig(p50=249.0), POLICY)
    assert not is_healthy_window(sig(p50=250.0), POLICY)
    assert not is_healthy_window(sig(errors=30), POLICY)


def test_round_trip() -> None:
    score = score_origin(sig(errors=50, probe=None), POLICY)
    assert type(score).from_dict(score.to_dict()) == score


@settings(max_examples=200)
@given(
    requests=st.integers(0, 10_000),
    errors=st.integers(0, 10_000),
    connect=st.integers(0, 1000),
    p95=st.none() | st.floats(0, 100_000),
    pending=st.floats(0, 10_000),
    overflow=st.integers(0, 1000),
    probe=st.none() | st.floats(0, 1),
)
def test_composite_is_the_smallest_weighted_term(
    requests: int, errors: int, connect: int, p95: float | None, pending: float,
    overflow: int, probe: float | None,
) -> None:
    signals = sig(min(requests, 10_000), min(errors, requests), connect, p95, p95, pending,
                  overflow, probe)
    score = score_origin(signals, POLICY)
    assert score.composite <= 1.0
    assert 0.0 <= score.saturation <= 1.0
    assert score.probe is None or 0.0 <= score.probe <= 1.0
    assert score.composite == min(score.terms().values())
    assert score.terms()[score.limiting] == score.composite
    evidence = [value for value in score.sub_scores().values() if value is not None]
    assert score.composite >= min(evidence) - 1e-12  # weights only soften a signal


@settings(max_examples=300)
@given(
    requests=st.integers(1, 10_000),
    data=st.data(),
    p95=st.floats(0, 100_000),
    connect=st.integers(0, 1000),
)
def test_a_strictly_lower_5xx_rate_scores_strictly_better(
    requests: int, data: st.DataObject, p95: float, connect: int,
) -> None:
    """Over the whole range, not only up to five times the threshold: fewer 5xx (the same
    attempts and everything else) is a strictly better errors sub-score, and a composite at
    least as good (strictly better where errors was the minimum)."""
    better = data.draw(st.integers(0, requests - 1))
    worse = data.draw(st.integers(better + 1, requests))
    good = score_origin(sig(requests, better, connect, 40.0, p95), POLICY)
    bad = score_origin(sig(requests, worse, connect, 40.0, p95), POLICY)
    assert good.errors is not None and bad.errors is not None
    assert good.errors > bad.errors
    assert good.composite >= bad.composite
    if bad.limiting == "errors":
        assert good.composite > bad.composite


@settings(max_examples=300)
@given(low=st.floats(0, 1_000_000), gap=st.floats(0.001, 1_000_000),
       errors=st.integers(0, 1000))
def test_a_strictly_lower_p95_scores_strictly_better(low: float, gap: float, errors: int
                                                     ) -> None:
    """A p95 lower by a thousandth of a millisecond or more scores strictly better, at any p95."""
    high = low + gap
    good = score_origin(sig(errors=errors, p95=low), POLICY)
    bad = score_origin(sig(errors=errors, p95=high), POLICY)
    assert good.latency is not None and bad.latency is not None
    assert good.latency > bad.latency
    assert good.composite >= bad.composite
    if bad.limiting == "latency":
        assert good.composite > bad.composite


def test_two_failing_origins_still_order() -> None:
    """60 % and 95 % 5xx are both far past dead (10 %), yet 60 % scores better by more than the
    compare margin: weight can leave the worse one for it (`test_decide_controller.py`)."""
    sixty = score_origin(sig(errors=600), POLICY)
    ninety_five = score_origin(sig(errors=950), POLICY)
    assert sixty.composite - ninety_five.composite >= POLICY.compare_margin
