"""`ballast plan`: output and exit codes (0 no changes, 2 changes, 1 error), against a real
running Ballast (admin API over HTTP) and offline with `--against`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.desired import load_desired
from harness.ads_desired import write_desired
from harness.background_loop import BackgroundLoop
from harness.envoy_process import free_port
from harness.intent_changes import set_weights
from tests.support.admin_stack import AdminStack, serving

Running = tuple[BackgroundLoop, AdminStack]
PORTS = {"listener_port": 10000, "primary_port": 8081, "secondary_port": 8082}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A Ballast serving the base file (group `shop`, PoPs ewr and sjc) with its admin API."""
    folder = tmp_path_factory.mktemp("running")
    base = write_desired(folder / "desired.yaml", **PORTS)
    with serving(load_desired(base), folder) as bg_and_stack:
        yield bg_and_stack


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_same_file_has_no_changes_even_after_weights_moved(
    running: Running, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bg, stack = running
    same = write_desired(tmp_path / "same.yaml", **PORTS)
    code, out, _ = plan(capsys, str(same), "--server", stack.url)
    assert code == 0, out
    assert "pop ewr: no changes (running: capabilities fifo" in out
    assert out.rstrip().endswith(f"No changes: {same} matches {stack.url} in 2 PoP(s).")
    intent = stack.ballast.intent
    try:
        bg.run(set_weights(intent, "ewr", "shop", {"primary": 50, "secondary": 50}))
        code, out, _ = plan(capsys, str(same), "--server", stack.url)
        assert code == 0, out  # planned with the running weights, so they are no change
    finally:
        bg.run(set_weights(intent, "ewr", "shop", {"primary": 95, "secondary": 5}))


def test_changed_breaker_shows_field_old_and_new(
    running: Running, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, stack = running
    bigger = write_desired(tmp_path / "bigger.yaml", max_origin_concurrency=200, **PORTS)
    code, out, _ = plan(capsys, str(bigger), "--server", stack.url)
    assert code == 2, out
    lines = out.splitlines()
    # three tier clusters and the standby's mirror cluster (sized like the background tier)
    assert "pop ewr: 0 to add, 4 to change, 0 to remove (running: capabilities fifo" in out
    at = lines.index("  ~ clusters shop.critical")  # 70% of 120 -> 70% of 200
    assert "      circuit_breakers.thresholds[0].max_requests: 84 -> 140" in lines[at + 1 : at + 8]
    assert "      circuit_breakers.thresholds[0].max_connections: 84 -> 140" in out
    assert "~ endpoints" not in out and "listeners" not in out
    assert lines[-1] == "Plan: 0 to add, 8 to change, 0 to remove in 2 of 2 PoP(s) (ewr, sjc)."

    code, out, _ = plan(capsys, str(bigger), "--server", stack.url, "--pop", "sjc")
    assert code == 2 and "pop ewr" not in out and "pop sjc: 0 to add, 4 to change" in out


def test_added_and_removed_origin_group(
    running: Running, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, stack = running
    base = write_desired(tmp_path / "base.yaml", **PORTS)
    media = write_desired(tmp_path / "media.yaml", media_port=8083, **PORTS)
    code, out, _ = plan(capsys, str(media), "--server", stack.url)
    assert code == 2, out
    for name in ("media.critical", "media.normal", "media.background"):
        assert f"  + clusters {name}" in out and f"  + endpoints {name}" in out
    assert "  ~ routes edge" in out  # the new virtual host
    # the new virtual host's routes, and the listener's overflow replies for its tiers
    assert "pop ewr: 6 to add, 2 to change, 0 to remove" in out

    code, out, _ = plan(capsys, str(base), "--against", str(media))
    assert code == 2, out
    assert "  - clusters media.critical" in out and "  - endpoints media.background" in out
    assert "pop sjc: 0 to add, 2 to change, 6 to remove (starting weights, Envoy 1.40" in out
    assert out.splitlines()[0] == f"ballast plan: {base} against {media}"


def test_offline_against_same_file_and_unknown_pop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_desired(tmp_path / "base.yaml", **PORTS)
    copy = write_desired(tmp_path / "copy.yaml", **PORTS)
    code, out, _ = plan(capsys, str(copy), "--against", str(base))
    assert code == 0 and "No changes" in out
    code, _, err = plan(capsys, str(copy), "--against", str(base), "--pop", "lax")
    assert code == 1 and "--pop lax: no such PoP on either side; known: ewr, sjc" in err


def test_invalid_file_exits_1_with_file_line_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_desired(tmp_path / "bad.yaml", **PORTS)
    bad.write_text(bad.read_text().replace("max_origin_concurrency: 120",
                                           "max_origin_concurrency: -3"))
    code, out, err = plan(capsys, str(bad), "--server", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and out == ""
    assert err.startswith(f"{bad}:") and "max_origin_concurrency" in err
    line, column = err.split(":")[1:3]
    assert line.isdigit() and column.isdigit()
    code, _, err = plan(capsys, str(tmp_path / "missing.yaml"), "--against", str(bad))
    assert code == 1 and "missing.yaml" in err


def test_unreachable_server_and_bad_arguments_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_desired(tmp_path / "base.yaml", **PORTS)
    dead = f"http://127.0.0.1:{free_port()}"
    code, out, err = plan(capsys, str(base), "--server", dead)
    assert code == 1 and out == ""
    assert f"cannot reach the Ballast admin API at {dead}" in err
    for args in (
        [],
        [str(base), "--server", "localhost:18001"],
        [str(base), "--bogus"],
        [str(base), "--server", dead, "--against", str(base)],
    ):
        with pytest.raises(SystemExit) as exited:
            main(["plan", *args])
        assert exited.value.code == 1, args
        assert "ballast plan: error:" in capsys.readouterr().err
