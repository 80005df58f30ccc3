"""Seed 002's incident through a real Envoy 1.40, twice (`bench/standby_ramp.py`): a primary that
fails and a standby behind a cold cache with a capacity cap. With the cold-standby ramp (and its
cache-warming mirror) the shift completes and the standby refuses fewer requests, over the whole
shift and in its worst failover window, than with the ramp off. Direction only: the numbers of
both runs side by side are in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from bench.standby_ramp import Scenario, report, run

pytestmark = pytest.mark.envoy


async def test_the_ramp_spares_a_cold_standby_what_a_plain_shift_pours_into_it() -> None:
    scenario = Scenario()
    on = await run(True, scenario)
    off = await run(False, scenario)
    table = report([on, off])
    assert on.shift_completed, table
    assert on.ramp_records.get("ramp_start") == 1 and on.ramp_records.get("ramp_complete"), table
    assert on.mirrored > 0 and off.mirrored == 0, table
    assert off.worst_window_error_rate > 0.02, table  # the plain shift breaches the standby
    assert on.standby_error_rate < off.standby_error_rate, table
    assert on.worst_window_error_rate < off.worst_window_error_rate, table
