"""`explain`: the chain of decisions, with numbers, and what moves the weights next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from control_plane.decide.controller import ControllerState, home_weights, step
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.explain import explain
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.desired.model import FailoverPolicy

POLICY = FailoverPolicy()
PREF = ("primary", "secondary")
T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
TICK = 20_000


def sig(now: int, errors: int = 0, p95: float = 120.0, age: int = 0) -> OriginSignals:
    return OriginSignals(1000, errors, 0, 40.0, p95, 0.0, 0, None, now - age)


def incident(tmp_path: Path, phases: list[tuple[str, int]]) -> list[dict]:
    """Run the controller through phases (sick | healthy | stale, ticks) and log like the app."""
    now = [T0]
    weights, state, tick = home_weights(PREF, 5), ControllerState(), 0
    with DecisionLog(tmp_path, clock=lambda: now[0]) as log:
        for phase, ticks in phases:
            for _ in range(ticks):
                tick += 1
                ms = tick * TICK
                now[0] = T0 + timedelta(milliseconds=ms)
                primary = {
                    "sick": sig(ms, errors=79, p95=1440.0),
                    "healthy": sig(ms),
                    "stale": sig(ms, age=45_000 + TICK * ticks),
                }[phase]
                result = step(POLICY, PREF, weights, state,
                              {"primary": primary, "secondary": sig(ms)}, ms, 0)
                log.record(result.kind, pop="ewr", group="api", config_version="v1",
                           **result.record_fields())
                log.record("steady", pop="sjc", group="api", weights_before=home_weights(PREF, 5),
                           weights_after=home_weights(PREF, 5))
                weights, state = result.weights_after, result.state
    return list(iter_records(tmp_path))


def test_explains_a_shift_with_numbers(tmp_path: Path) -> None:
    text = explain(incident(tmp_path, [("healthy", 1), ("sick", 3)]), "ewr", "api")
    lines = text.splitlines()
    assert lines[0] == ("pop ewr, group api: weights now primary 75, secondary 25 "
                        "(since 2024-05-01 16:01:20 UTC, seq 7)")
    assert "16:00:40 threshold_breach: primary 5xx 7.9% > 2%, p95 1440 ms > 800 ms " \
           "(window 1 of 2)" in text
    assert ("16:01:00 weight_shift: primary 95→85, secondary 5→15 (primary 5xx 7.9% > 2%"
            in text)
    assert "score 0.21 = min(errors 0.21, latency 0.64, saturation 1.00)" in text
    assert "step cap 10" in text
    assert "16:01:20 weight_shift: primary 85→75, secondary 15→25" in text
    assert lines[-1].startswith("next: health_proportional: keeps moving up to 10 per interval")
    assert "latest scores: primary 0.21 (lowest: errors); secondary" in text
    assert "sjc" not in text


def test_explains_a_hold_and_the_wait_for_return(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("healthy", 1)])
    text = explain(records, "ewr", "api")
    assert "held since 16:01:20: held away from home: return waits for 3 healthy windows" in text
    assert text.splitlines()[-1] == "next: return to primary starts after 3 healthy windows; " \
                                    "1 of 3 so far"


def test_folds_stale_holds_into_one_line(tmp_path: Path) -> None:
    text = explain(incident(tmp_path, [("sick", 3), ("stale", 3)]), "ewr", "api")
    assert ("held since 16:01:20: fail static: metrics stale 105 s (primary); weights held "
            "(3 ticks, last at 16:02:00)") in text
    assert "next: weights stay until every origin reports metrics newer than 45 s" in text


def test_calm_after_return_home(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("healthy", 8)])
    text = explain(records, "ewr", "api")
    assert "weights now primary 95, secondary 5" in text
    assert "calm: at the preferred split since 16:03:00 (return, seq 17)" in text
    assert "how they got here" not in text


def test_no_records(tmp_path: Path) -> None:
    assert explain([], "ewr", "api") == "no decisions for pop ewr, group api"
