"""`ballast certs` and `ballast bootstrap --tls-*`: the files mTLS needs, and the Envoy side."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography import x509

from control_plane.admin.auth import read_token
from control_plane.cli.envoy_validate import find_envoy, validate_bootstrap
from control_plane.cli.main import main
from control_plane.security.certs import uri_sans
from control_plane.security.tls import TlsConfigError, TlsFiles, load_tls


def test_certs_makes_a_ca_a_server_and_node_certificates(tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "pki"
    code = main(["certs", str(out_dir), "--node", "ewr/ewr-edge-1", "--node", "sjc/a b",
                 "--admin", "oncall", "--host", "127.0.0.1", "--host", "ballast.internal"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"--tls-cert {out_dir / 'server.pem'}" in out
    ca = x509.load_pem_x509_certificate((out_dir / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((out_dir / "server.pem").read_bytes())
    assert server.issuer == ca.subject
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["ballast.internal"]
    node = (out_dir / "nodes" / "ewr" / "ewr-edge-1.pem").read_bytes()
    assert uri_sans(node) == ["spiffe://ballast/pop/ewr/node/ewr-edge-1"]
    spaced = (out_dir / "nodes" / "sjc" / "a%20b.pem").read_bytes()
    assert uri_sans(spaced) == ["spiffe://ballast/pop/sjc/node/a%20b"]
    assert uri_sans((out_dir / "admin" / "oncall.pem").read_bytes()) == [
        "spiffe://ballast/admin/oncall"
    ]
    for key in out_dir.rglob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    load_tls(TlsFiles(out_dir / "server.pem", out_dir / "server.key", out_dir / "ca.pem"))

    # a second run keeps the CA and the server certificate, unless asked to renew it
    assert main(["certs", str(out_dir), "--node", "ewr/ewr-edge-2"]) == 0
    assert x509.load_pem_x509_certificate((out_dir / "ca.pem").read_bytes()) == ca
    assert x509.load_pem_x509_certificate((out_dir / "server.pem").read_bytes()) == server
    assert main(["certs", str(out_dir), "--renew-server"]) == 0
    renewed = x509.load_pem_x509_certificate((out_dir / "server.pem").read_bytes())
    assert renewed.serial_number != server.serial_number and renewed.issuer == ca.subject


def test_certs_refuses_a_node_without_pop(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["certs", str(tmp_path), "--node", "ewr-edge-1"])
    assert "expected POP/NODE_ID" in capsys.readouterr().err


def test_tls_files_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    assert main(["certs", str(tmp_path / "a")]) == 0
    assert main(["certs", str(tmp_path / "b")]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(TlsConfigError, match="is not the key of"):
        load_tls(TlsFiles(a / "server.pem", b / "server.key", a / "ca.pem"))
    with pytest.raises(TlsConfigError, match="not PEM certificates"):
        load_tls(TlsFiles(a / "server.pem", a / "server.key", a / "server.key"))
    with pytest.raises(TlsConfigError, match="not a regular file"):
        load_tls(TlsFiles(a, a / "server.key", a / "ca.pem"))


def test_serve_wants_all_three_tls_files(tmp_path: Path, capsys) -> None:
    code = main(["serve", str(tmp_path / "desired.yaml"), "--tls-cert", "x.pem"])
    assert code == 2
    assert "--tls-cert, --tls-key and --client-ca together" in capsys.readouterr().err


@pytest.mark.envoy
def test_bootstrap_with_tls_has_the_transport_socket(tmp_path: Path, capsys) -> None:
    assert main(["certs", str(tmp_path), "--node", "ewr/ewr-1"]) == 0
    capsys.readouterr()
    code = main(["bootstrap", "--pop", "ewr", "--node-id", "ewr-1", "--format", "json",
                 "--tls-cert", str(tmp_path / "nodes/ewr/ewr-1.pem"),
                 "--tls-key", str(tmp_path / "nodes/ewr/ewr-1.key"),
                 "--tls-ca", str(tmp_path / "ca.pem")])
    assert code == 0
    config = json.loads(capsys.readouterr().out)
    (cluster,) = config["static_resources"]["clusters"]
    socket = cluster["transport_socket"]
    assert socket["name"] == "envoy.transport_sockets.tls"
    context = socket["typed_config"]["common_tls_context"]
    # the certificate through file-based SDS: the file written next to it, its folder watched
    sds_file = tmp_path / "nodes/ewr/ewr-1.sds.json"
    assert context["tls_certificate_sds_secret_configs"] == [{
        "name": "ballast_xds_client",
        "sds_config": {"path_config_source": {
            "path": str(sds_file), "watched_directory": {"path": str(sds_file.parent)}},
            "resource_api_version": "V3"},
    }]
    (secret,) = json.loads(sds_file.read_text())["resources"]
    assert secret["tls_certificate"] == {
        "certificate_chain": {"filename": str(tmp_path / "nodes/ewr/ewr-1.pem")},
        "private_key": {"filename": str(tmp_path / "nodes/ewr/ewr-1.key")},
        "watched_directory": {"path": str(tmp_path / "nodes/ewr")},
    }
    # the CA through file-based SDS too (a CA rollover without a restart); the names checked
    # against the replica dialled stay in the bootstrap
    validation = context["combined_validation_context"]
    assert validation["default_validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}
    ]
    ca_sds_file = tmp_path / "nodes/ewr/ewr-1.ca.sds.json"
    assert validation["validation_context_sds_secret_config"]["sds_config"][
        "path_config_source"]["path"] == str(ca_sds_file)
    (ca_secret,) = json.loads(ca_sds_file.read_text())["resources"]
    assert ca_secret["validation_context"] == {
        "trusted_ca": {"filename": str(tmp_path / "ca.pem")},
        "watched_directory": {"path": str(tmp_path)},
    }
    find_envoy()
    ok, output = validate_bootstrap(config)
    assert ok, output


def test_bootstrap_wants_all_three_tls_files(capsys) -> None:
    code = main(["bootstrap", "--pop", "ewr", "--node-id", "n", "--tls-cert", "a.pem"])
    assert code == 2
    assert "--tls-cert, --tls-key and --tls-ca together (given: --tls-cert)" in \
        capsys.readouterr().err


def test_certs_writes_an_admin_token_the_server_accepts(tmp_path: Path, capsys) -> None:
    assert main(["certs", str(tmp_path), "--admin-token"]) == 0
    out = capsys.readouterr().out
    assert f"--admin-token-file {tmp_path / 'admin.token'}" in out
    token = read_token(tmp_path / "admin.token")
    assert len(token) >= 40
    assert stat.S_IMODE((tmp_path / "admin.token").stat().st_mode) == 0o600
    # and a read-only scrape token beside it (Prometheus's), never the admin token
    assert f"--admin-scrape-token-file {tmp_path / 'scrape.token'}" in out
    assert read_token(tmp_path / "scrape.token") != token
    assert stat.S_IMODE((tmp_path / "scrape.token").stat().st_mode) == 0o600
    assert main(["certs", str(tmp_path), "--admin-token"]) == 0
    assert read_token(tmp_path / "admin.token") != token  # a new one each time: rotation


def test_etcd_certificates_come_from_a_ca_of_their_own(tmp_path: Path, capsys) -> None:
    pki = tmp_path / "pki"
    assert main(["certs", str(pki), "--etcd-member", "10.0.0.1", "--etcd-member", "etcd-b",
                 "--etcd-client", "ballast"]) == 0
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    etcd_ca = x509.load_pem_x509_certificate((pki / "etcd/ca.pem").read_bytes())
    assert etcd_ca.subject != ca.subject  # a Ballast node certificate is never an etcd user
    member = x509.load_pem_x509_certificate((pki / "etcd/member.pem").read_bytes())
    client = x509.load_pem_x509_certificate((pki / "etcd/clients/ballast.pem").read_bytes())
    assert member.issuer == client.issuer == etcd_ca.subject
    names = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["etcd-b"]
    usage = member.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                          x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH}  # members dial each other
    common_name = client.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert common_name[0].value == "ballast"  # etcd's user
    assert stat.S_IMODE((pki / "etcd/clients/ballast.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((pki / "etcd/ca.key").stat().st_mode) == 0o600
    # a second run reuses etcd's CA
    before = (pki / "etcd/ca.pem").read_bytes()
    assert main(["certs", str(pki), "--etcd-client", "root"]) == 0
    assert (pki / "etcd/ca.pem").read_bytes() == before
