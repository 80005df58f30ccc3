"""`ballast plan` shows the waves a change goes through and what each PoP gets in its wave."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.cli.plan import PopPlan, rollout_lines, rollout_plan
from control_plane.desired.model import RolloutPolicy
from control_plane.translate.diff import ResourceChange
from harness.ads_desired import write_desired

PORTS = {"listener_port": 10000, "primary_port": 8081, "secondary_port": 8082}
CHANGE = ResourceChange("clusters", "shop.critical", "change")


def test_waves_and_what_each_pop_gets() -> None:
    plans = [PopPlan("ewr", "", [CHANGE]), PopPlan("sjc", "", []), PopPlan("lhr", "", [CHANGE]),
             PopPlan("fra", "", [CHANGE])]
    got = rollout_plan(RolloutPolicy(), ("ewr", "sjc", "lhr"), ("ewr", "sjc", "fra"), plans)
    assert [[p["pop"] for p in wave["pops"]] for wave in got["waves"]] == [
        ["ewr", "lhr"], ["sjc", "fra"]]
    assert [wave["starts_after_ms"] for wave in got["waves"]] == [0, 300_000]
    assert got["passes_after_ms"] == 600_000
    lines = rollout_lines(got)
    assert lines[0] == ("Rollout: 2 wave(s), each baked 5m, then passed by its gate; a failing "
                        "gate rolls back every PoP that got the change")
    assert lines[1] == ("  gate: every node ACKs within 1m, no NACK, no regression (min 10 "
                        "samples): 5xx +2.0%, p95 x1.5 and +100 ms, shed +5.0%, tier-action "
                        "onsets +0")
    assert lines[2:] == [
        "  wave 1 (canary): starts at once",
        "    ewr: the new version (0 to add, 1 to change, 0 to remove)",
        "    lhr: added: served for the first time (0 to add, 1 to change, 0 to remove)",
        "  wave 2: starts at the earliest 5m after wave 1",
        "    sjc: the new version (no changes to its resources)",
        "    fra: removed: its resources are withdrawn (0 to add, 1 to change, 0 to remove)",
        "  passes at the earliest 10m after wave 1; PoPs not yet in a wave keep the running "
        "version",
    ]


def test_immediate_and_a_pop_left_out_by_pop() -> None:
    got = rollout_plan(RolloutPolicy(strategy="immediate"), ("ewr", "sjc"), ("ewr", "sjc"),
                       [PopPlan("sjc", "", [CHANGE])])
    assert rollout_lines(got) == [
        "Rollout: every PoP at once (rollout strategy immediate: no bake, no gate)",
        "  wave 1: starts at once",
        "    ewr: the new version (not planned (--pop))",
        "    sjc: the new version (0 to add, 1 to change, 0 to remove)",
    ]
    assert got["gates"] is None and got["bake_ms"] == 0


def test_a_renewal_alone_is_planned_at_once_or_in_waves_by_its_policy() -> None:
    plans = [PopPlan("ewr", "", [CHANGE]), PopPlan("sjc", "", [CHANGE])]
    now = rollout_plan(RolloutPolicy(), ("ewr", "sjc"), ("ewr", "sjc"), plans, ("https.shop",))
    assert rollout_lines(now)[:2] == [
        "Rollout: every PoP at once (a renewal of certificate(s) https.shop alone: "
        "rollout.renewals immediate, no bake, no gate)",
        "  wave 1: starts at once"]
    assert now["bake_ms"] == 0 and len(now["waves"]) == 1
    waves = rollout_plan(RolloutPolicy(renewals="waves"), ("ewr", "sjc"), ("ewr", "sjc"), plans,
                         ("https.shop",))
    assert len(waves["waves"]) == 2 and waves["bake_ms"] == RolloutPolicy().bake_ms


def test_plan_prints_the_rollout_before_its_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_desired(tmp_path / "old.yaml", **PORTS)
    new = write_desired(tmp_path / "new.yaml", max_origin_concurrency=200, **PORTS)
    new.write_text(new.read_text() + "rollout: {canary: [sjc], bake: 2m}\n")
    assert main(["plan", str(new), "--against", str(old)]) == 2
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("Rollout: 2 wave(s), each baked 2m, then passed by its gate; a failing "
                     "gate rolls back every PoP that got the change")
    assert lines[at + 2: at + 7] == [
        "  wave 1 (canary): starts at once",
        "    sjc: the new version (0 to add, 4 to change, 0 to remove)",
        "  wave 2: starts at the earliest 2m after wave 1",
        "    ewr: the new version (0 to add, 4 to change, 0 to remove)",
        "  passes at the earliest 4m after wave 1; PoPs not yet in a wave keep the running "
        "version",
    ]
    assert lines[-1].startswith("Plan: 0 to add, 8 to change")
    # no change, no rollout shown
    assert main(["plan", str(old), "--against", str(old)]) == 0
    assert "Rollout:" not in capsys.readouterr().out
