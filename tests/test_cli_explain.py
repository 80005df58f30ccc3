"""`ballast explain`: plain words for one (PoP, group), and its argument errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decide.controller import ControllerState, home_weights, step
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.log import DecisionLog
from control_plane.desired.model import FailoverPolicy

T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    policy, pref = FailoverPolicy(), ("primary", "secondary")
    now = [T0]
    weights, state = home_weights(pref, 5), ControllerState()
    with DecisionLog(tmp_path, clock=lambda: now[0]) as log:
        for tick in range(1, 4):
            ms = tick * 20_000
            now[0] = T0 + timedelta(milliseconds=ms)
            signals = {"primary": OriginSignals(1000, 79, 0, 90.0, 300.0, 0, 0, None, ms),
                       "secondary": OriginSignals(1000, 0, 0, 40.0, 90.0, 0, 0, None, ms)}
            result = step(policy, pref, weights, state, signals, ms, 0)
            log.record(result.kind, pop="ewr", group="api", **result.record_fields())
            weights, state = result.weights_after, result.state
    return tmp_path


def test_explain(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--state-dir", str(state_dir), "--pop", "ewr", "--group", "api"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pop ewr, group api: weights now primary 75, secondary 25")
    assert "16:00:20 threshold_breach: primary 5xx 7.9% > 2% (window 1 of 2)" in out
    assert "16:00:40 weight_shift: primary 95→85, secondary 5→15 (" in out
    assert "16:01:00 weight_shift: primary 85→75, secondary 15→25 (" in out
    assert "next: " in out


def test_unknown_pop(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--state-dir", str(state_dir), "--pop", "lhr", "--group", "api"]) == 0
    assert capsys.readouterr().out == f"no decisions for pop lhr, group api in {state_dir}\n"


def test_pop_and_group_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["explain", "--pop", "ewr"])
    assert info.value.code == 2
    assert "the following arguments are required: --group" in capsys.readouterr().err
