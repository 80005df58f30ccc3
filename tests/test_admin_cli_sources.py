"""`ballast decisions` and `ballast explain` with `--server`: the same records and words as from
the local state directory, read over a running Ballast's admin API (`/decisions`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.cli.admin_client import AdminClient, ServerSource
from control_plane.cli.main import main
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import Query
from harness.ads_desired import desired
from harness.envoy_process import free_port
from tests.support.admin_stack import AdminStack, serving
from tests.support.decision_records import write_records


@pytest.fixture
def served(tmp_path: Path) -> Iterator[AdminStack]:
    the_desired = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    with serving(the_desired, write_records(tmp_path, "shop")) as (_, stack):
        yield stack


def out_of(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    "filters",
    [
        [],
        ["--pop", "ewr", "--json"],
        ["--kind", "weight_shift,hold", "--limit", "1"],
        ["--since", "2024-05-01T16:02:40Z", "--group", "shop"],
        ["--pop", "lax"],
    ],
)
def test_decisions_from_the_server_match_the_state_dir(
    served: AdminStack, capsys: pytest.CaptureFixture[str], filters: list[str]
) -> None:
    local = out_of(capsys, "decisions", "--state-dir", str(served.state_dir), *filters)
    remote = main(["decisions", "--server", served.url, *filters])
    out, err = capsys.readouterr()
    if filters == ["--pop", "lax"]:  # no record names it: not found, from either source
        assert remote == local[0] == 3
        assert err == (f"ballast decisions: not found: no record names pop 'lax' in "
                       f"{served.url}/decisions\n")
    else:
        assert remote == local[0] == 0
        assert out == local[1] and out


def test_explain_from_the_server(served: AdminStack, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--pop", "ewr", "--group", "shop"]
    local = out_of(capsys, "explain", "--state-dir", str(served.state_dir), *where)
    remote = out_of(capsys, "explain", "--server", served.url, *where)
    assert remote == local
    assert remote[1].startswith("pop ewr, group shop: weights now primary 85, secondary 15")


def test_follow_polls_for_newer_records(served: AdminStack) -> None:
    source = ServerSource(AdminClient(served.url))
    stream = source.follow(Query(pop="ewr"), after_seq=4, poll_s=0.05, stop=lambda: False)
    with DecisionLog(served.state_dir) as log:
        log.record("hold", pop="sjc", group="shop", rule="other PoP")
        log.record("return", pop="ewr", group="shop", rule="healthy again")
    record = next(stream)
    assert (record["seq"], record["kind"], record["pop"]) == (6, "return", "ewr")


def test_unreachable_server_and_conflicting_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["decisions", "--server", dead]) == 1
    assert f"ballast decisions: cannot reach the Ballast admin API at {dead}" in (
        capsys.readouterr().err
    )
    assert main(["explain", "--server", dead, "--pop", "ewr", "--group", "shop"]) == 1
    assert "ballast explain: cannot reach" in capsys.readouterr().err
    for args in (["--server", dead, "--state-dir", str(tmp_path)], ["--server", "nope"]):
        with pytest.raises(SystemExit) as exited:
            main(["decisions", *args])
        assert exited.value.code == 2
