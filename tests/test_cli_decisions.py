"""`ballast decisions`: table, JSON, filters, follow, and exit codes for bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decisions.log import DecisionLog
from tests.support.decision_records import write_records

ROOT = Path(__file__).parent.parent


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return write_records(tmp_path, "api")


def test_table(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", "--state-dir", str(state_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["TIME", "SEQ", "KIND", "POP", "GROUP", "WEIGHTS", "RULE"]
    assert out[2].split("  ")[0] == "2024-05-01 16:02:30.000"
    assert "weight_shift" in out[2] and "primary 95→85, secondary 5→15" in out[2]
    assert out[2].endswith("step cap 10")
    assert "primary 95, secondary 5" in out[1]
    assert out[3].endswith('{"changed":["ewr"]}')
    assert len(out) == 5


def test_filters_and_json(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", "--state-dir", str(state_dir), "--pop", "ewr",
                 "--kind", "weight_shift,hold", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["seq"], r["kind"]) for r in records] == [(2, "weight_shift")]


def test_limit_and_env_state_dir(state_dir: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BALLAST_STATE_DIR", str(state_dir))
    assert main(["decisions", "--limit", "2", "--json"]) == 0
    assert [json.loads(x)["seq"] for x in capsys.readouterr().out.splitlines()] == [3, 4]


def test_since_filters_by_time(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", "--state-dir", str(state_dir), "--since",
                 "2024-05-01T16:02:45Z", "--json"]) == 0
    assert [json.loads(x)["seq"] for x in capsys.readouterr().out.splitlines()] == [3, 4]
    assert main(["decisions", "--state-dir", str(state_dir), "--since", "10m"]) == 0
    assert capsys.readouterr().out.startswith("no decisions in ")


def test_unknown_pop_or_group_is_not_found(state_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    where = ["decisions", "--state-dir", str(state_dir)]
    assert main([*where, "--pop", "lhr"]) == 3
    assert capsys.readouterr().err.startswith("ballast decisions: not found: no record names "
                                              "pop 'lhr' in ")
    assert main([*where, "--pop", "ewr", "--group", "nope"]) == 3
    assert "no record names group 'nope' in pop 'ewr'" in capsys.readouterr().err
    # a known PoP with nothing in the window is not "not found"
    assert main([*where, "--pop", "ewr", "--since", "10m"]) == 0
    assert capsys.readouterr().out.startswith("no decisions in ")


def test_no_decisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decisions", "--state-dir", str(tmp_path / "empty")]) == 0
    assert capsys.readouterr().out == f"no decisions in {tmp_path / 'empty'} matching the filters\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "banana"], "argument --since: cannot read 'banana' as a time"),
        (["--kind", "weight_shfit"], "unknown kind weight_shfit; known kinds: weight_shift"),
        (["--limit", "0"], "argument --limit: wants a whole number >= 1, got '0'"),
        (["--limit", "x"], "argument --limit: wants a whole number >= 1"),
        (["--interval", "-1"], "argument --interval: wants a number of seconds > 0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_exit_2(state_dir: Path, capsys: pytest.CaptureFixture[str],
                              argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["decisions", "--state-dir", str(state_dir), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_follow_prints_new_records(state_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "control_plane", "decisions", "--state-dir", str(state_dir),
         "--follow", "--json", "--interval", "0.05", "--pop", "ewr", "--limit", "1"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    assert child.stdout is not None
    try:
        assert json.loads(child.stdout.readline())["seq"] == 2
        with DecisionLog(state_dir) as log:
            log.record("hold", pop="sjc", group="api")
            log.record("return", pop="ewr", group="api", rule="back")
        started = time.monotonic()
        record = json.loads(child.stdout.readline())
        assert (record["seq"], record["kind"], record["rule"]) == (6, "return", "back")
        assert time.monotonic() - started < 10
    finally:
        child.terminate()
        child.wait(10)


def test_follow_keeps_the_table_aligned(state_dir: Path) -> None:
    """Rows followed one at a time line up with the table printed before them (and with each
    other): every rule starts under RULE, whatever the kind, PoP, group and weights."""
    child = subprocess.Popen(
        [sys.executable, "-m", "control_plane", "decisions", "--state-dir", str(state_dir),
         "--follow", "--interval", "0.05"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    assert child.stdout is not None
    try:
        lines = [child.stdout.readline() for _ in range(5)]  # the header and 4 records
        with DecisionLog(state_dir) as log:
            log.record("ramp_start", pop="lax", group="shop", rule="ramp rule",
                       weights_before={"primary": 95, "secondary": 5},
                       weights_after={"primary": 90, "secondary": 10})
            log.record("hold", pop="sjc", group="api", rule="hold rule")
            log.record("rollout_superseded", rule="rollout rule")
        lines += [child.stdout.readline() for _ in range(3)]
    finally:
        child.terminate()
        child.wait(10)
    column = lines[0].index("RULE")
    rules = [line[column:].rstrip("\n") for line in lines[1:]]
    assert rules[-3:] == ["ramp rule", "hold rule", "rollout rule"], lines
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines[1:]), lines
