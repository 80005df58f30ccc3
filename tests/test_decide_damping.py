"""Flap damping (`decide/damping.py`) and how the controller, its state, `ballast explain` and the
desired state carry it: table tests (the properties are in test_decide_properties.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from control_plane.decide import damping
from control_plane.decide.controller import ControllerState, step
from control_plane.decide.damping import Flap
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.explain import explain
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import FailoverPolicy

POLICY = replace(FailoverPolicy(), damping_half_life_ms=300_000)
HALF = POLICY.damping_half_life_ms
PREF = ("primary", "secondary")
TICK = 20_000


def test_onsets_add_the_penalty_which_halves_every_half_life() -> None:
    first = damping.onset(None, POLICY, 0)
    assert first == Flap(1000.0, 0)
    assert first.now(POLICY, HALF) == pytest.approx(500.0)
    second = damping.onset(first, POLICY, HALF)
    assert second == Flap(1500.0, HALF)
    assert not damping.suppressed(second, POLICY, HALF)
    third = damping.onset(second, POLICY, HALF)
    assert damping.suppressed(third, POLICY, HALF)
    assert damping.return_windows(third, POLICY, HALF) == POLICY.damping_return_windows
    # 2500 decays to the suppress level 2000 after log2(2500/2000) half-lives
    assert damping.suppressed(third, POLICY, HALF + int(0.32 * HALF))
    assert not damping.suppressed(third, POLICY, HALF + int(0.33 * HALF))
    assert damping.return_windows(third, POLICY, 2 * HALF) == POLICY.return_healthy_windows
    # below the reuse level (750) the history is forgotten
    assert damping.remembered(third, POLICY, HALF + int(1.7 * HALF))
    assert not damping.remembered(third, POLICY, HALF + int(1.8 * HALF))


def test_the_penalty_has_a_ceiling() -> None:
    flap = None
    for tick in range(100):
        flap = damping.onset(flap, POLICY, tick)
    assert flap is not None and flap.penalty == damping.ceiling(POLICY) == 32_000


@pytest.mark.parametrize("bad", [
    {"penalty": -1, "at_ms": 0}, {"penalty": 1, "at_ms": -1}, {"penalty": True, "at_ms": 0},
    {"penalty": 1}, [], {"penalty": "1", "at_ms": 0},
])
def test_a_bad_flap_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        Flap.from_dict(bad)


def test_controller_state_round_trips_and_reads_a_state_saved_before_damping() -> None:
    state = ControllerState({"primary": 2}, {"secondary": 3}, {"primary": Flap(1234.5, 99)})
    assert ControllerState.from_dict(state.to_dict()) == state
    old = {"unhealthy_windows": {"primary": 1}, "healthy_windows": {}}
    assert ControllerState.from_dict(old) == ControllerState({"primary": 1}, {})
    with pytest.raises(ValueError):
        ControllerState.from_dict({**old, "flaps": {"primary": {"penalty": 1}}})
    with pytest.raises(ValueError):
        ControllerState.from_dict({**old, "other": {}})


def _window(primary_errors: int, now: int) -> dict[str, OriginSignals]:
    def origin(errors: int) -> OriginSignals:
        return OriginSignals(1000, errors, 0, 40.0, 120.0, 0.0, 0, None, now)
    return {"primary": origin(primary_errors), "secondary": origin(0)}


def _flapping(folder: Path) -> list[dict]:
    """Three flaps of the primary (2 sick windows, 3 healthy) then healthy windows, under the
    default damping (half-life 15 min): recorded."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    log = DecisionLog(folder, clock=lambda: now[0])
    weights, state = {"primary": 95, "secondary": 5}, ControllerState()
    pattern = [300, 300, 0, 0, 0] * 3 + [0] * 12
    for tick, errors in enumerate(pattern, 1):
        now[0] = datetime.fromtimestamp(tick * TICK / 1000, UTC)
        result = step(FailoverPolicy(), PREF, weights, state, _window(errors, tick * TICK),
                      tick * TICK, 0)
        log.record(result.kind, pop="ewr", group="shop", config_version="v1",
                   **result.record_fields())
        weights, state = result.weights_after, result.state
    log.close()
    return list(iter_records(folder))


def test_a_suppressed_origin_needs_more_healthy_windows_to_return(tmp_path: Path) -> None:
    records = _flapping(tmp_path)
    by_tick = {int(r["inputs"]["now_ms"]) // TICK: r for r in records}
    # the third onset (tick 12) suppresses the primary: no return after 3 healthy windows
    assert by_tick[12]["detail"]["damping"]["primary"]["suppressed"]
    assert [by_tick[t]["kind"] for t in (15, 16, 17)] == ["hold", "hold", "hold"]
    assert "return needs 6 healthy windows" in by_tick[15]["rule"]
    assert by_tick[18]["kind"] == "return"
    assert "need 6" in by_tick[18]["rule"]
    # the first two onsets did not suppress: the return came after 3 healthy windows
    assert by_tick[5]["kind"] == "return" and "need 3" in by_tick[5]["rule"]
    text = explain(records, "ewr", "shop")
    assert "flap damping (as of" in text and "primary penalty" in text


def test_desired_state_reads_the_damping_knobs_and_checks_reuse_below_suppress() -> None:
    base = Path("examples/desired.yaml").read_text()
    ok = (base.replace("  compare_margin: 0.1\n", "  compare_margin: 0.2\n")
          .replace("  damping_half_life: 15m\n", "  damping_half_life: 5m\n")
          .replace("  damping_suppress: 2000\n", "  damping_suppress: 3000\n"))
    policy = parse_desired(ok, "desired.yaml").origin_groups[0].failover
    assert (policy.compare_margin, policy.damping_half_life_ms, policy.damping_suppress) == (
        0.2, 300_000, 3000)
    bad = base.replace("  damping_reuse: 750\n", "  damping_reuse: 2500\n")
    with pytest.raises(DesiredStateError, match=r"damping_reuse \(2500\) must be below"):
        parse_desired(bad, "desired.yaml")
