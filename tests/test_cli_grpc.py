"""The CLI for proxyless gRPC clients and load reports: `ballast bootstrap --grpc` (a client's
GRPC_XDS_BOOTSTRAP), `--load-reports` (Envoy's load_stats_config, checked by the real `envoy
--mode validate`), `ballast render --grpc-client` / `--extensions-from-node` with a gRPC node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from control_plane.cli.envoy_validate import validate_bootstrap
from control_plane.cli.main import main


def bootstrap(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bootstrap", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_grpc_bootstrap_names_ballast_the_node_and_its_pop(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bootstrap(capsys, "--grpc", "--pop", "ewr", "--node-id", "svc-1",
                             "--xds", "10.0.0.5:18000", "--xds", "[::1]:18000")
    assert code == 0
    config = json.loads(out)
    assert [s["server_uri"] for s in config["xds_servers"]] == ["10.0.0.5:18000", "[::1]:18000"]
    assert all(s["channel_creds"] == [{"type": "insecure"}] and s["server_features"] == [
        "xds_v3", "ignore_resource_deletion"] for s in config["xds_servers"])
    assert config["node"] == {"id": "svc-1", "locality": {"zone": "ewr"},
                              "metadata": {"ballast_client": "grpc"}}
    assert "certificate_providers" not in config


def test_grpc_bootstrap_with_mtls_uses_certificate_providers(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bootstrap(capsys, "--grpc", "--pop", "ewr", "--node-id", "svc-1",
                             "--tls-cert", "/certs/n.pem", "--tls-key", "/certs/n-key.pem",
                             "--tls-ca", "/certs/ca.pem")
    assert code == 0
    config = json.loads(out)
    files = {"certificate_file": "/certs/n.pem", "private_key_file": "/certs/n-key.pem",
             "ca_certificate_file": "/certs/ca.pem", "refresh_interval": "60s"}
    assert config["xds_servers"][0]["channel_creds"] == [{"type": "tls", "config": files}]
    assert config["certificate_providers"] == {
        "ballast": {"plugin_name": "file_watcher", "config": files}}


def test_envoy_options_are_refused_with_grpc(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = bootstrap(capsys, "--grpc", "--pop", "ewr", "--node-id", "n",
                               "--metrics-sink", "--delta")
    assert code == 2 and not out
    assert "--delta, --metrics-sink: Envoy options, not for --grpc" in err


@pytest.mark.envoy
def test_envoy_with_load_reports_loads_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bootstrap(capsys, "--pop", "ewr", "--node-id", "e1", "--load-reports")
    assert code == 0
    config = yaml.safe_load(out)
    assert config["cluster_manager"]["load_stats_config"] == {
        "api_type": "GRPC", "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": "ballast_xds"}}]}
    assert config["node"]["metadata"]["ballast_load_reports"] is True
    ok, output = validate_bootstrap(config)
    assert ok, output


def test_render_what_a_grpc_client_gets(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    from tests.test_translate_grpc import TEXT

    desired = tmp_path / "desired.yaml"
    desired.write_text(TEXT)
    assert main(["render", str(desired), "--pop", "ewr", "--grpc-client"]) == 0
    out, err = capsys.readouterr()
    rendered = json.loads(out)
    assert sorted(rendered["listeners"]) == [
        "cart.internal", "cart.internal:443", "shop-api", "shop-api:50051"]
    assert not err
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"id": "g", "userAgentName": "gRPC Java",
                                "userAgentVersion": "1.38.0"}))
    assert main(["render", str(desired), "--pop", "ewr", "--extensions-from-node",
                 str(node)]) == 0
    out, err = capsys.readouterr()
    assert sorted(json.loads(out)["clusters"]) == ["shop-api"]  # no TLS before 1.41
    assert "note: cart-api: not sent" in err
