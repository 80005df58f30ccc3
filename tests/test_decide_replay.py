"""Replay: the inputs a decision record holds, fed back into `step`, give the logged weights."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.decide.controller import (
    ControllerState,
    home_weights,
    replay_record,
    step,
)
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.desired.model import FailoverPolicy

TICK = 20_000


def window(rng: random.Random, now: int, incident: bool) -> dict[str, OriginSignals] | None:
    """Noisy windows: the primary mostly sick during the incident, mostly fine after it."""
    if rng.random() < 0.05:
        return None
    out = {}
    for name in ("primary", "secondary"):
        sick = name == "primary" and (rng.random() < 0.8) == incident
        errors = rng.choice([30, 80, 300]) if sick else rng.choice([0, 0, 0, 5, 25])
        p95 = rng.choice([900.0, 1500.0]) if sick else rng.choice([100.0, 500.0])
        p50 = rng.choice([40.0, 120.0, 120.0, 300.0])
        age = rng.choice([0, 5000, 50_000]) if rng.random() < 0.1 else 1000
        out[name] = OriginSignals(
            1000, errors, rng.choice([0, 0, 0, 10]), p50, p95, rng.uniform(0, 100),
            rng.choice([0, 0, 3]), rng.choice([None, 1.0, 0.6]), now - age,
        )
    return out


@pytest.mark.parametrize("mode", ["health_proportional", "linear", "exponential"])
def test_replaying_the_log_reproduces_the_weights(tmp_path: Path, mode: str) -> None:
    # a short damping half-life, so the noisy incident both suppresses returns and lets them
    # happen within the run
    policy = replace(FailoverPolicy(), mode=mode, damping_half_life_ms=300_000)
    pref = ("primary", "secondary")
    rng = random.Random(7)
    start = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
    now = [start]
    log = DecisionLog(tmp_path, clock=lambda: now[0])
    weights, state = home_weights(pref, policy.min_warm_pool), ControllerState()
    for tick in range(1, 120):
        now[0] = start + timedelta(milliseconds=tick * TICK)
        signals = window(rng, tick * TICK, incident=tick < 40)
        jitter = rng.randint(-policy.jitter, policy.jitter)
        result = step(policy, pref, weights, state, signals, tick * TICK, jitter)
        log.record(result.kind, pop="ewr", group="api", config_version="v1",
                   **result.record_fields())
        weights, state = result.weights_after, result.state
    log.close()

    records = list(iter_records(tmp_path))
    assert len(records) == 119
    assert {r["kind"] for r in records} >= {"weight_shift", "return", "hold"}
    suppressed = [r for r in records
                  if any(d["suppressed"] for d in r["detail"].get("damping", {}).values())]
    assert suppressed, "the flapping primary was suppressed at some point"
    previous_after = None
    for record in records:
        again = replay_record(policy, record)
        assert again.kind == record["kind"]
        assert again.weights_after == record["weights_after"]
        assert again.rule == record["rule"]
        assert again.state.to_dict() == record["detail"]["state"]
        if previous_after is not None:  # the chain is continuous
            assert record["weights_before"] == previous_after
        previous_after = record["weights_after"]
