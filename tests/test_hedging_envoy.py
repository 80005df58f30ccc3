"""P0 hedging through a real Envoy 1.40 (the tiers source: "50ms for P0 before we attempt hedging to
a secondary origin"), with the critical tier's hedge_delay of 50 ms against the same tier without.

- A primary that stalls some first attempts past the delay: the client's p99 falls with hedging
  (direction only; the numbers are in docs/benchmarks.md, from bench/hedging.py), every request
  is answered, none takes more attempts than the tier's retries allow.
- A burst where every first attempt stalls: Envoy sends hedges only within the tier's retry
  budget (15 % of active requests) and refuses the rest (`upstream_rq_retry_overflow`); the most
  hedges ever in progress at once, seen by the origins, stays within the budget.
"""

from __future__ import annotations

import math

import pytest

from control_plane.desired.defaults import DEFAULT_TIERS
from harness.hedging import run_hedging

pytestmark = pytest.mark.envoy

CRITICAL = next(t for t in DEFAULT_TIERS if t.name == "critical")


def test_hedging_cuts_the_p99_of_a_stalling_primary() -> None:
    runs = {delay: run_hedging(delay, requests=60, concurrency=2, stall_every=10, stall_ms=600)
            for delay in (0, 50)}
    without, hedged = runs[0], runs[50]
    assert without.statuses == hedged.statuses == {200: 60}
    assert without.stats["upstream_rq_retry"] == 0
    assert hedged.stats["upstream_rq_retry"] > 0
    assert hedged.attempts.by_origin["standby"] > without.attempts.by_origin["standby"]
    assert hedged.percentile(99) < without.percentile(99), (
        hedged.percentile(99), without.percentile(99))
    for run in runs.values():
        assert max(run.attempts.by_number) <= CRITICAL.retries + 1
        assert run.stats["upstream_rq_retry"] <= 60 * CRITICAL.retries


def test_hedges_stay_within_the_retry_budget() -> None:
    clients = 30
    run = run_hedging(50, requests=2 * clients, concurrency=clients, stall_every=1,
                      stall_ms=500, answer_ms=30)
    assert run.statuses == {200: 2 * clients}
    assert run.stats["upstream_rq_retry_overflow"] > 0, run.stats
    # Envoy: concurrent retries <= budget x (active requests, retries included), at least
    # min_retry_concurrency (the tier's retries): r <= b (c + r)  =>  r <= b c / (1 - b)
    budget = CRITICAL.retry_budget_percent / 100
    bound = max(CRITICAL.retries, math.floor(budget * clients / (1 - budget)))
    assert 0 < run.attempts.max_retries_in_flight <= bound, (
        run.attempts.max_retries_in_flight, bound, run.stats)
    assert run.stats["upstream_rq_retry"] < 2 * clients
