"""A real Envoy 1.40's own xDS client certificate, renewed in place, is used without a restart;
and its certificate, key and CA, replaced together in one rename, too.

`ballast bootstrap --tls-*` gives Envoy its certificate through file-based SDS (a watched
folder). The node's certificate is renewed in place by `ballast certs --node` (key and
certificate renamed into the folder) under a new CA, and Ballast is restarted trusting only that
new CA: the Envoy, the same process all along, reconnects and syncs, which it can only do by
presenting the renewed certificate; its admin `/certs` lists the new serial number.

The runbook's way (deploy/README.md, "Rotate certificates", issue 37): the node's files in a
directory of their own reached through a symbolic link, replaced by one rename of the link.
Renaming the key and the certificate one after the other, in either order, leaves Envoy a moment
with a pair that does not match: it logs KEY_VALUES_MISMATCH and counts `key_rotation_failed`
(measured with Envoy 1.40); one rename never does, and a new CA comes with them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from control_plane.cli.main import main
from control_plane.security.cert_dir import CertDir, Pair, write_pair
from control_plane.security.certs import make_ca
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.background_loop import BackgroundLoop
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking

pytestmark = pytest.mark.envoy


def node_serials(proxy: EnvoyProcess) -> set[int]:
    """Serial numbers of the certificates Envoy holds for its own TLS contexts."""
    dump = proxy.admin_json("/certs")
    return {int(cert["serial_number"], 16) for context in dump.get("certificates", [])
            for cert in context.get("cert_chain", [])}


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def synced(bg: BackgroundLoop, ballast: BallastServer, node: str) -> Callable[[], bool]:
    def check() -> bool:
        nodes = [s.as_dict() for s in bg.call(ballast.nodes.statuses)]
        return any(n["node_id"] == node and n["status"] == "SYNCED" for n in nodes)
    return check


def bootstrap_for(capsys: pytest.CaptureFixture[str], xds: int, admin: int, cert: Path,
                  key: Path, ca: Path) -> dict[str, Any]:
    """`ballast bootstrap`'s for node ewr-1 with mTLS from these files."""
    capsys.readouterr()
    assert main(["bootstrap", "--pop", "ewr", "--node-id", "ewr-1", "--format", "json",
                 "--xds", f"127.0.0.1:{xds}", "--admin-port", str(admin),
                 "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca)]) == 0
    return json.loads(capsys.readouterr().out)


def ballast_on(xds: int, server: Pair, clients: Path) -> BallastServer:
    """Ballast serving xDS on `xds` with `server`'s pair, to nodes of the CA in `clients`."""
    return BallastServer(
        desired(listener_port=free_port(), sjc_offset=1, primary_port=free_port(),
                secondary_port=free_port()),
        xds_address=f"127.0.0.1:{xds}",
        tls=ReloadingCredentials(TlsFiles(server.cert, server.key, clients)))


def assert_reconnected(bg: BackgroundLoop, ballast: BallastServer, proxy: EnvoyProcess,
                       pid: int | None) -> None:
    """`ballast` (trusting only the new CA) started: the same Envoy process reconnects to it
    and syncs, which it can only do with its new certificate."""
    bg.run(ballast.start())
    eventually_blocking(synced(bg, ballast, "ewr-1"), 20,
                        "ewr-1 reconnected and SYNCED with its new certificate")
    assert proxy.proc is not None and proxy.proc.pid == pid and proxy.proc.poll() is None


def test_renewed_xds_client_certificate_is_used_without_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    certs = CertDir(tmp_path / "certs")
    assert main(["certs", str(certs.root), "--node", "ewr/ewr-1", "--days", "1"]) == 0
    clients = tmp_path / "client-ca.pem"  # the CA Ballast accepts node certificates from
    clients.write_bytes(certs.ca.cert.read_bytes())
    server_ca = tmp_path / "server-ca.pem"  # the CA Envoy checks Ballast's certificate with
    server_ca.write_bytes(certs.ca.cert.read_bytes())
    node = certs.node("ewr", "ewr-1")
    admin, xds = free_port(), free_port()
    bootstrap = bootstrap_for(capsys, xds, admin, node.cert, node.key, server_ca)
    bg = BackgroundLoop()
    ballast = ballast_on(xds, certs.server, clients)
    try:
        bg.run(ballast.start())
        with EnvoyProcess(bootstrap, admin) as proxy:
            proxy.wait_ready()
            eventually_blocking(synced(bg, ballast, "ewr-1"), 10, "ewr-1 SYNCED over mTLS")
            pid = proxy.proc.pid if proxy.proc else None
            first = serial_of(node.cert)
            assert first in node_serials(proxy)
            # the fleet's CA is replaced (Ballast's own certificate stays, signed by the old
            # one, which Envoy trusts in its own copy), then the node's certificate is renewed
            # in place under it
            write_pair(certs.ca, make_ca("ballast CA 2", days=1))
            assert main(["certs", str(certs.root), "--node", "ewr/ewr-1", "--days", "1"]) == 0
            renewed = serial_of(node.cert)
            assert renewed != first
            eventually_blocking(lambda: renewed in node_serials(proxy), 10,
                       "Envoy holds the renewed certificate (file-based SDS)")
            # Ballast now trusts only the new CA: a reconnect works only with the new cert
            clients.write_bytes(certs.ca.cert.read_bytes())
            bg.run(ballast.stop(0.2))
            ballast = ballast_on(xds, certs.server, clients)
            assert_reconnected(bg, ballast, proxy, pid)
    finally:
        bg.run(ballast.stop(0.2))
        bg.close()


def _install(pair_dir: Path, certs: CertDir, ca_pem: bytes) -> None:
    """A node's directory as the runbook makes it: the CA, the certificate, the key."""
    pair_dir.mkdir()
    node = certs.node("ewr", "ewr-1")
    (pair_dir / "ca.pem").write_bytes(ca_pem)
    shutil.copy(node.cert, pair_dir / "ewr-1.pem")
    shutil.copy(node.key, pair_dir / "ewr-1.key")


def _stat(proxy: EnvoyProcess, name: str) -> int:
    for line in proxy.admin("/stats").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise AssertionError(f"no stat {name}")


def test_a_directory_swap_replaces_certificate_key_and_ca_in_one_rename(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    old, new = CertDir(tmp_path / "old"), CertDir(tmp_path / "new")
    for certs in (old, new):
        assert main(["certs", str(certs.root), "--node", "ewr/ewr-1", "--days", "1"]) == 0
    tls = tmp_path / "envoy-tls"
    tls.mkdir()
    _install(tls / "node.1", old, old.ca.cert.read_bytes())
    (tls / "node").symlink_to("node.1")
    clients = tmp_path / "client-ca.pem"
    clients.write_bytes(old.ca.cert.read_bytes())
    admin, xds = free_port(), free_port()
    bootstrap = bootstrap_for(capsys, xds, admin, tls / "node/ewr-1.pem",
                              tls / "node/ewr-1.key", tls / "node/ca.pem")
    # the SDS files beside the link, its parent watched
    assert sorted(p.name for p in tls.iterdir()) == [
        "ewr-1.ca.sds.json", "ewr-1.sds.json", "node", "node.1"]
    bg = BackgroundLoop()
    ballast = ballast_on(xds, old.server, clients)
    try:
        bg.run(ballast.start())
        with EnvoyProcess(bootstrap, admin) as proxy:
            proxy.wait_ready()
            eventually_blocking(synced(bg, ballast, "ewr-1"), 10, "ewr-1 SYNCED over mTLS")
            pid = proxy.proc.pid if proxy.proc else None
            assert serial_of(old.node("ewr", "ewr-1").cert) in node_serials(proxy)
            # everything from the new CA, in a directory of its own; then one rename
            _install(tls / "node.2", new, new.ca.cert.read_bytes())
            (tls / "node.next").symlink_to("node.2")
            os.rename(tls / "node.next", tls / "node")
            renewed = serial_of(new.node("ewr", "ewr-1").cert)
            eventually_blocking(lambda: renewed in node_serials(proxy), 10,
                                "Envoy holds the new certificate")
            assert _stat(proxy, "sds.ballast_xds_client.key_rotation_failed") == 0
            assert _stat(proxy, "sds.ballast_xds_ca.key_rotation_failed") == 0
            assert "KEY_VALUES_MISMATCH" not in proxy.log_tail(200)
            # Ballast on the new CA only: the Envoy reconnects only if it presents the new
            # certificate and trusts the new CA, both read through the swap
            clients.write_bytes(new.ca.cert.read_bytes())
            bg.run(ballast.stop(0.2))
            ballast = ballast_on(xds, new.server, clients)
            assert_reconnected(bg, ballast, proxy, pid)
    finally:
        bg.run(ballast.stop(0.2))
        bg.close()
