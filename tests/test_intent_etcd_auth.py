"""The intent store against a real etcd with client TLS and authentication (issue 25).

etcd serves TLS only, requires a client certificate of its own CA (`--client-cert-auth`, the
certificate's CN is the user) and has authentication on; the user `ballast` has one role, read
and write under `/ballast/`. Set up with `etcdctl` as deploy/README.md does. Ballast with its
certificate (or a password) works; without credentials, with a certificate of another CA, or
outside its prefix, it is refused and nothing is written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.intent.etcd_store import (
    EtcdStore,
    IntentWrite,
    StoreCredentials,
    StoreUnavailable,
)
from harness.etcd import EtcdServer, EtcdTls, etcd_binary

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(etcd_binary() is None or shutil.which("etcdctl") is None,
                       reason="etcd and etcdctl needed"),
]

PASSWORD = "a-password-for-the-test"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("certs")
    assert main(["certs", str(root), "--etcd-member", "127.0.0.1", "--etcd-client", "root",
                 "--etcd-client", "ballast"]) == 0
    assert main(["certs", str(root / "other"), "--etcd-member", "127.0.0.1",
                 "--etcd-client", "ballast"]) == 0  # same user name, another etcd CA
    return root


def etcdctl(etcd: EtcdServer, certs: Path, *args: str) -> str:
    env = {**os.environ, "ETCDCTL_API": "3",
           "ETCDCTL_ENDPOINTS": f"https://{etcd.endpoint}",
           "ETCDCTL_CACERT": str(certs / "etcd/ca.pem"),
           "ETCDCTL_CERT": str(certs / "etcd/clients/root.pem"),
           "ETCDCTL_KEY": str(certs / "etcd/clients/root.key")}
    done = subprocess.run(["etcdctl", *args], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def etcd(certs: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(EtcdTls(certs / "etcd/ca.pem", certs / "etcd/member.pem",
                                certs / "etcd/member.key")).start()
    try:
        etcdctl(server, certs, "user", "add", "root", "--no-password")
        etcdctl(server, certs, "user", "grant-role", "root", "root")
        etcdctl(server, certs, "user", "add", f"ballast:{PASSWORD}")
        etcdctl(server, certs, "role", "add", "ballast")
        etcdctl(server, certs, "role", "grant-permission", "ballast", "--prefix=true",
                "readwrite", "/ballast/")
        etcdctl(server, certs, "user", "grant-role", "ballast", "ballast")
        etcdctl(server, certs, "auth", "enable")
        yield server
    finally:
        server.cleanup()


def _store(etcd: EtcdServer, credentials: StoreCredentials, prefix: str = "/ballast/"
           ) -> EtcdStore:
    host, port = etcd.endpoint.split(":")
    return EtcdStore([(host, int(port))], prefix=prefix, timeout_s=2, credentials=credentials)


@pytest.fixture
async def stores() -> AsyncIterator[list[EtcdStore]]:
    made: list[EtcdStore] = []
    yield made
    for store in made:
        await store.close()


async def _lead_and_write(store: EtcdStore, replica: str) -> dict[str, object]:
    lease = await store.grant_lease(5)
    leadership = await store.campaign(replica, lease)
    assert leadership is not None
    await store.commit(leadership, IntentWrite(put={f"groups/ewr/{replica}": {"w": 1}}))
    _, values = await store.load()
    await store.revoke_lease(lease)
    return values


async def test_client_certificate_of_etcds_ca_is_the_user(
        etcd: EtcdServer, certs: Path, stores: list[EtcdStore]) -> None:
    store = _store(etcd, StoreCredentials(ca=certs / "etcd/ca.pem",
                                          cert=certs / "etcd/clients/ballast.pem",
                                          key=certs / "etcd/clients/ballast.key"))
    stores.append(store)
    values = await _lead_and_write(store, "by-cert")
    assert values["groups/ewr/by-cert"] == {"w": 1}
    assert '"w":1' in etcdctl(etcd, certs, "get", "/ballast/intent/groups/ewr/by-cert")


async def test_password_over_tls_works_too(
        etcd: EtcdServer, certs: Path, stores: list[EtcdStore], tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    store = _store(etcd, StoreCredentials(ca=certs / "etcd/ca.pem",
                                          cert=certs / "etcd/clients/ballast.pem",
                                          key=certs / "etcd/clients/ballast.key",
                                          user="ballast", password_file=password))
    stores.append(store)
    values = await _lead_and_write(store, "by-password")
    assert values["groups/ewr/by-password"] == {"w": 1}


async def test_without_credentials_etcd_refuses(
        etcd: EtcdServer, certs: Path, stores: list[EtcdStore], tmp_path: Path) -> None:
    ca = certs / "etcd/ca.pem"
    password = tmp_path / "password"
    password.write_text("not-the-password\n")
    refused = {
        "plaintext": StoreCredentials(),
        "TLS without a client certificate": StoreCredentials(ca=ca),
        "a certificate of another CA": StoreCredentials(
            ca=ca, cert=certs / "other/etcd/clients/ballast.pem",
            key=certs / "other/etcd/clients/ballast.key"),
        "a wrong password": StoreCredentials(
            ca=ca, cert=certs / "etcd/clients/ballast.pem",
            key=certs / "etcd/clients/ballast.key", user="ballast", password_file=password),
    }
    messages: dict[str, str] = {}
    for why, credentials in refused.items():
        store = _store(etcd, credentials)
        stores.append(store)
        with pytest.raises(StoreUnavailable) as refusal:
            await store.load()
            pytest.fail(f"{why}: etcd answered")
        messages[why] = str(refusal.value)
    # refused at once (not a timeout) and, for the password, named as such
    assert "authentication failed" in messages["a wrong password"], messages
    assert not any("Timeout" in m for m in messages.values()), messages


async def test_the_role_stops_at_the_prefix(
        etcd: EtcdServer, certs: Path, stores: list[EtcdStore]) -> None:
    store = _store(etcd, StoreCredentials(ca=certs / "etcd/ca.pem",
                                          cert=certs / "etcd/clients/ballast.pem",
                                          key=certs / "etcd/clients/ballast.key"),
                   prefix="/elsewhere/")
    stores.append(store)
    with pytest.raises(StoreUnavailable, match="permission denied"):
        await store.load()
    lease = await store.grant_lease(5)
    with pytest.raises(StoreUnavailable, match="permission denied"):
        await store.campaign("intruder", lease)
    assert etcdctl(etcd, certs, "get", "--prefix", "/elsewhere/") == ""


@pytest.mark.parametrize(("extra", "message"), [
    (["--store-cert", "c.pem"], "--store-cert and --store-key go together"),
    (["--store-cert", "c.pem", "--store-key", "c.key"],
     "--store-cert needs --store-ca (a client certificate is only sent over TLS)"),
    (["--store-user", "ballast"], "--store-user and --store-password-file go together"),
])
def test_store_credentials_that_cannot_work_are_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["serve", "examples/desired.yaml", "--state-dir", str(tmp_path / "state"),
            "--store", "etcd://127.0.0.1:2379", "--metrics-source", "prometheus",
            "--prometheus-url", "http://127.0.0.1:9090", *extra]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"ballast serve: {message}\n"
    assert main(["serve", "examples/desired.yaml", "--store-ca", "ca.pem"]) == 2
    assert "the --store-* credentials need --store" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
