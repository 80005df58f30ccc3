"""A small decision log for the `ballast decisions` tests: a breach, a shift, a config change and
a hold, 20 s apart from 16:02:10 UTC (seq 1 to 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from control_plane.decisions.log import DecisionLog

T0 = datetime(2024, 5, 1, 16, 2, 10, tzinfo=UTC)


def write_records(state_dir: Path, group: str) -> Path:
    """Four records in `state_dir`, the PoP ones for `group`; returns `state_dir`."""
    moments = iter(T0 + timedelta(seconds=20 * i) for i in range(10))
    with DecisionLog(state_dir, clock=lambda: next(moments)) as log:
        log.record("threshold_breach", pop="ewr", group=group,
                   weights_before={"primary": 95, "secondary": 5},
                   weights_after={"primary": 95, "secondary": 5},
                   rule="primary 5xx 7.9% > 2% (window 1 of 2)")
        log.record("weight_shift", pop="ewr", group=group,
                   weights_before={"primary": 95, "secondary": 5},
                   weights_after={"primary": 85, "secondary": 15}, rule="step cap 10")
        log.record("config_applied", config_version="abc", detail={"changed": ["ewr"]})
        log.record("hold", pop="sjc", group=group, rule="fail static: metrics stale 50 s")
    return state_dir
