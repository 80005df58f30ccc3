"""`ballast bootstrap`: a ready ADS bootstrap (edge or sidecar) that real Envoy 1.40 accepts."""

from __future__ import annotations

import json

import pytest
import yaml

from control_plane.cli.envoy_validate import find_envoy, validate_bootstrap
from control_plane.cli.main import main


def bootstrap(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["bootstrap", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_yaml_bootstrap_with_pop_zone_and_ads_address(capsys) -> None:
    code, out, _ = bootstrap(
        capsys, "--pop", "ewr", "--node-id", "ewr-1", "--xds", "10.1.2.3:18001", "--admin-port", "0"
    )
    assert code == 0
    config = yaml.safe_load(out)
    assert config["node"]["id"] == "ewr-1"
    assert config["node"]["locality"] == {"zone": "ewr"}
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 0}
    assert config["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    (cluster,) = config["static_resources"]["clusters"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "10.1.2.3", "port_value": 18001}
    assert "stats_sinks" not in config


def test_json_delta_with_metrics_sink(capsys) -> None:
    code, out, _ = bootstrap(
        capsys, "--pop", "sjc", "--node-id", "n", "--delta", "--metrics-sink", "--format", "json"
    )
    assert code == 0
    config = json.loads(out)
    assert config["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert config["stats_sinks"][0]["name"] == "envoy.stat_sinks.metrics_service"


def test_ipv6_xds_address(capsys) -> None:
    code, out, _ = bootstrap(capsys, "--pop", "ewr", "--node-id", "n", "--xds", "[::1]:18000")
    assert code == 0
    assert "address: ::1" in out


@pytest.mark.envoy
@pytest.mark.parametrize("template", ["edge", "sidecar"])
def test_real_envoy_accepts_each_template(capsys, template: str) -> None:
    find_envoy()
    code, out, _ = bootstrap(
        capsys, "--pop", "ewr", "--node-id", "n", "--template", template, "--format", "json",
        "--metrics-sink",
    )
    assert code == 0
    config = json.loads(out)
    ok, output = validate_bootstrap(config)
    assert ok, output
    # --metrics-sink asks Ballast for listeners with the sampled access log
    assert config["node"]["metadata"]["ballast_access_log"] is True
    if template == "sidecar":
        assert config["node"]["metadata"] == {"role": "sidecar", "ballast_access_log": True}
        assert "overload_manager" in config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--xds", "localhost"], "--xds 'localhost': expected HOST:PORT"),
        (["--xds", "localhost:0"], "--xds: port '0' must be 1..65535"),
        (["--admin-port", "99999"], "--admin-port: port '99999' must be 0..65535"),
        (["--admin-port", "x"], "--admin-port: port 'x' must be 0..65535"),
    ],
)
def test_bad_arguments_exit_2(capsys, args: list[str], message: str) -> None:
    code, out, err = bootstrap(capsys, "--pop", "ewr", "--node-id", "n", *args)
    assert code == 2
    assert out == ""
    assert message in err


def test_pop_must_be_a_plain_name(capsys) -> None:
    code, _, err = bootstrap(capsys, "--pop", "e.wr", "--node-id", "n")
    assert code == 2
    assert "--pop 'e.wr'" in err


def test_unknown_template_is_refused_by_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bootstrap", "--pop", "ewr", "--node-id", "n", "--template", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_several_replicas_preferred_first_with_health_checked_failover(capsys) -> None:
    code, out, _ = bootstrap(
        capsys, "--pop", "ewr", "--node-id", "ewr-1", "--admin-port", "0",
        "--xds", "127.0.0.1:18000", "--xds", "127.0.0.1:18010", "--xds", "127.0.0.1:18020",
    )
    assert code == 0
    config = yaml.safe_load(out)
    (cluster,) = config["static_resources"]["clusters"]
    by_priority = {
        entry.get("priority", 0): [e["endpoint"]["address"]["socket_address"]["port_value"]
                                   for e in entry["lb_endpoints"]]
        for entry in cluster["load_assignment"]["endpoints"]
    }
    assert by_priority == {0: [18000], 1: [18010, 18020]}
    (check,) = cluster["health_checks"]
    assert "tcp_health_check" in check and check["no_traffic_interval"] == "1s"
    (service,) = config["dynamic_resources"]["ads_config"]["grpc_services"]
    assert service["envoy_grpc"]["retry_policy"]["retry_back_off"]["max_interval"] == "2s"
    find_envoy()
    ok, message = validate_bootstrap(config)
    assert ok, message


def test_one_replica_has_no_health_check_and_too_many_are_refused(capsys) -> None:
    code, out, _ = bootstrap(capsys, "--pop", "ewr", "--node-id", "n")
    assert code == 0
    assert "health_checks" not in yaml.safe_load(out)["static_resources"]["clusters"][0]
    many = [arg for i in range(17) for arg in ("--xds", f"127.0.0.1:{18000 + i}")]
    code, _, err = bootstrap(capsys, "--pop", "ewr", "--node-id", "n", *many)
    assert code == 2 and "at most 16 replicas" in err
