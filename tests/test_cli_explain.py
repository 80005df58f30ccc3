"""`ballast explain`: plain words for one (PoP, group) — weights and tier actions — from the
state directory and from a running server (`--server`), and its argument errors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decide.controller import ControllerState, home_weights, step
from control_plane.decide.signals import OriginSignals, TierPending
from control_plane.decide.tiers import TierState, tier_step
from control_plane.decisions.log import DecisionLog
from control_plane.desired.model import FailoverPolicy, TierActionPolicy
from harness.ads_desired import desired
from harness.models import shop_group
from tests.support.admin_stack import AdminStack, serving

T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)


def write_log(state_dir: Path, group: str, critical_pending: list[float] | None = None) -> Path:
    """Three ticks of a sick primary in ewr (and, with `critical_pending`, the tier step on that
    critical tier peak per tick), recorded like the reconcile loop does."""
    policy, pref = FailoverPolicy(), ("primary", "secondary")
    tiers = replace(shop_group(), tier_actions=TierActionPolicy(trigger="pending", lending=False))
    now = [T0]
    weights, state, tier_state = home_weights(pref, 5), ControllerState(), TierState()
    with DecisionLog(state_dir, clock=lambda: now[0]) as log:
        for tick in range(1, 4):
            ms = tick * 20_000
            now[0] = T0 + timedelta(milliseconds=ms)
            signals = {"primary": OriginSignals(1000, 79, 0, 90.0, 300.0, 0, 0, None, ms),
                       "secondary": OriginSignals(1000, 0, 0, 40.0, 90.0, 0, 0, None, ms)}
            result = step(policy, pref, weights, state, signals, ms, 0)
            log.record(result.kind, pop="ewr", group=group, **result.record_fields())
            weights, state = result.weights_after, result.state
            if critical_pending is not None:
                pending = {"critical": TierPending(critical_pending[tick - 1], ms)}
                tiers_result = tier_step(tiers, tier_state, pending, ms)
                if tiers_result.kind is not None:
                    log.record(tiers_result.kind, pop="ewr", group=group,
                               **tiers_result.record_fields(tiers_result.decisions[0]))
                tier_state = tiers_result.state
    return state_dir


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return write_log(tmp_path, "api")


TIER_LINES = [
    "tier actions: normal: 50% demoted to background (answered at the edge: background is "
    "shed) since 16:01:00; background: shed to its floor of 6 slot(s) (503 beyond) since "
    "16:01:00",
    "  switched on at 16:01:00 (tier_action, seq 4): critical pending max 31 > 10 "
    "(trigger_pending) at every tick for 40 s since 16:00:20 (for: 30 s)",
    "  off: once 60 s (recover_after) pass without critical pending max > 10, or when tier "
    "actions are disabled in the desired state",
]


def test_explain(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--state-dir", str(state_dir), "--pop", "ewr", "--group", "api"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pop ewr, group api: weights now primary 75, secondary 25")
    assert "16:00:20 threshold_breach: primary 5xx 7.9% > 2% (window 1 of 2)" in out
    assert "16:00:40 weight_shift: primary 95→85, secondary 5→15 (" in out
    assert "16:01:00 weight_shift: primary 85→75, secondary 15→25 (" in out
    assert "next: " in out
    assert out.splitlines()[-1] == "tier actions: no tier actions active (none switched on in " \
        "the log)"


def test_explain_with_tier_actions_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, "api", critical_pending=[25, 28, 31])
    assert main(["explain", "--state-dir", str(tmp_path), "--pop", "ewr", "--group", "api"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pop ewr, group api: weights now primary 75, secondary 25")
    assert not any("16:01:00 tier_action" in line for line in lines)  # not in the weights story
    assert lines[-3:] == TIER_LINES


@pytest.fixture
def served(tmp_path: Path) -> Iterator[AdminStack]:
    write_log(tmp_path, "shop", critical_pending=[25, 28, 31])
    the_desired = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    with serving(the_desired, tmp_path) as (_, stack):
        yield stack


def test_explain_tier_actions_from_the_server(
    served: AdminStack, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--pop", "ewr", "--group", "shop"]
    assert main(["explain", "--server", served.url, *where]) == 0
    remote = capsys.readouterr().out
    assert main(["explain", "--state-dir", str(served.state_dir), *where]) == 0
    assert capsys.readouterr().out == remote
    assert remote.splitlines()[-3:] == TIER_LINES


def test_unknown_pop_or_group_is_not_found(state_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for pop, group in (("lhr", "api"), ("ewr", "nope")):
        assert main(["explain", "--state-dir", str(state_dir), "--pop", pop,
                     "--group", group]) == 3
        assert capsys.readouterr().err == (f"ballast explain: not found: no record names pop "
                                           f"{pop!r}, group {group!r} in {state_dir}\n")


def test_pop_and_group_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["explain", "--pop", "ewr"])
    assert info.value.code == 2
    assert "the following arguments are required: --group" in capsys.readouterr().err
