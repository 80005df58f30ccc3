"""`ballast render`: the example's JSON per PoP, capabilities and weights options, bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control_plane.cli.main import main

EXAMPLE = "examples/desired.yaml"
FIXTURES = Path(__file__).parent / "fixtures"


def render(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["render", EXAMPLE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def pending_policy(rendered: dict, cluster: str) -> str:
    return rendered["clusters"][cluster]["queuing_policies"]["pending_rq_policy"]["name"]


def test_render_prints_the_pops_resources_as_json(capsys) -> None:
    code, out, err = render(capsys, "--pop", "sjc")
    assert code == 0, err
    rendered = json.loads(out)
    assert list(rendered["clusters"]) == [
        "shop.critical", "shop.normal", "shop.background", "shop.mirror-secondary"]
    port = rendered["listeners"]["edge"]["address"]["socket_address"]["port_value"]
    assert port == 10001
    assert pending_policy(rendered, "shop.critical") == "envoy.queue_policy.fifo"
    assert "note: shop.critical: adaptive_lifo requested" in err


def test_node_with_adaptive_lifo_gets_watermarks(capsys, tmp_path: Path) -> None:
    node = json.loads((FIXTURES / "envoy-1.40-node.json").read_text())
    node["extensions"].append({"name": "envoy.queue_policy.adaptive_lifo"})
    path = tmp_path / "node.json"
    path.write_text(json.dumps(node))
    code, out, err = render(capsys, "--pop", "ewr", "--extensions-from-node", str(path))
    assert code == 0, err
    policy = json.loads(out)["clusters"]["shop.normal"]["queuing_policies"]["pending_rq_policy"]
    assert policy["typed_config"]["high_watermark"] == 80
    assert policy["typed_config"]["low_watermark"] == 60
    assert "note:" not in err


def test_real_envoy_1_40_node_gets_fifo(capsys) -> None:
    node = str(FIXTURES / "envoy-1.40-node.json")
    code, out, _ = render(capsys, "--pop", "ewr", "--extensions-from-node", node)
    assert code == 0
    assert pending_policy(json.loads(out), "shop.background") == "envoy.queue_policy.fifo"


def test_weights_option_sets_locality_weights(capsys) -> None:
    code, out, _ = render(capsys, "--pop", "ewr", "--weights", "shop.primary=80,shop.secondary=20")
    assert code == 0
    localities = json.loads(out)["endpoints"]["shop.critical"]["endpoints"]
    assert [(x["locality"]["zone"], x["load_balancing_weight"]) for x in localities] == [
        ("primary", 80),
        ("secondary", 20),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pop", "lhr"], "--pop: unknown PoP 'lhr'; known: ewr, sjc"),
        (
            ["--pop", "ewr", "--weights", "shop.primary=80,shop.secondary=30"],
            "--weights: origin group shop: weights sum to 110, not 100",
        ),
        (
            ["--pop", "ewr", "--weights", "shop.primary=80,shop.tertiary=20"],
            "--weights: origin group shop has no origin(s) tertiary",
        ),
        (
            ["--pop", "ewr", "--weights", "shop.primary"],
            "'shop.primary' is not GROUP.ORIGIN=WEIGHT",
        ),
        (["--pop", "ewr", "--weights", "shop.primary=x"], "weight of shop.primary is 'x'"),
        (
            ["--pop", "ewr", "--envoy-version", "1.12"],
            "--envoy-version 1.12: unknown Envoy release",
        ),
        (
            ["--pop", "ewr", "--extensions-from-node", "no/such/node.json"],
            "--extensions-from-node no/such/node.json: cannot read",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(capsys, args: list[str], message: str) -> None:
    code, out, err = render(capsys, *args)
    assert code == 2
    assert out == ""
    assert message in err


def test_node_file_that_is_not_a_node(capsys, tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text('{"id": "x", "extensions": 3}')
    code, _, err = render(capsys, "--pop", "ewr", "--extensions-from-node", str(path))
    assert code == 2
    assert "not an envoy.config.core.v3.Node" in err


def test_bad_desired_file_prints_problems_and_exits_1(capsys, tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text("pops: [\n")
    code = main(["render", str(path), "--pop", "ewr"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith(f"{path}:")
