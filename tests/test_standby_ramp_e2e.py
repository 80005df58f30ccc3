"""Seed 002's incident through a real Envoy 1.40, twice (`bench/standby_ramp.py`): a primary that
fails and a standby behind a cold cache with a capacity cap. With the cold-standby ramp the
standby stays within the failover thresholds (5xx 2 %, p95 800 ms) and the shift completes;
with the ramp off it breaches. Direction only: the numbers are in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from bench.standby_ramp import Scenario, report, run

pytestmark = pytest.mark.envoy


async def test_the_ramp_keeps_a_cold_standby_within_thresholds_without_it_it_breaches() -> None:
    scenario = Scenario()
    on = await run(True, scenario)
    off = await run(False, scenario)
    table = report([on, off])
    assert on.shift_completed and on.within_thresholds, table
    assert on.ramp_records.get("ramp_start") == 1 and on.ramp_records.get("ramp_complete"), table
    assert on.mirrored > 0, table
    assert not off.within_thresholds, table
    assert on.standby_error_rate < off.standby_error_rate, table
