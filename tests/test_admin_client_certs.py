"""The admin API over HTTPS (`--admin-tls`): a client certificate naming an admin identity is
accepted like the token; a node's certificate or none gets 401; the files rotate like xDS's."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from control_plane.admin.auth import AdminAuthError
from control_plane.cli.main import main
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir, Pair, write_pair
from control_plane.security.certs import make_ca
from control_plane.security.tls import TlsFiles

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"


@pytest.fixture
def certs(tmp_path: Path) -> CertDir:
    certs = CertDir(tmp_path / "certs")
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    certs.make_admin(authority, "oncall", 1)
    certs.make_node(authority, "ewr", "ewr-1", 1)
    return certs


def config(tmp_path: Path, certs: CertDir) -> ServiceConfig:
    return ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False,
        tls=TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert), admin_tls=True,
    )


@pytest.fixture
async def served(tmp_path: Path, certs: CertDir) -> AsyncIterator[BallastService]:
    service = BallastService(config(tmp_path, certs))
    await service.start()
    yield service
    await service.stop(0)


def client(certs: CertDir, pair: Pair | None, server_ca: bytes | None = None) -> ssl.SSLContext:
    """A client trusting `server_ca` (default: the CA file now) for the server's certificate,
    presenting `pair`."""
    context = ssl.create_default_context(
        cadata=(server_ca or certs.ca.cert.read_bytes()).decode())
    if pair is not None:
        context.load_cert_chain(pair.cert, pair.key)
    return context


async def get(service: BallastService, path: str, context: ssl.SSLContext) -> int:
    assert service.admin is not None and service.admin.url.startswith("https://")
    async with aiohttp.ClientSession() as http, \
            http.get(service.admin.url + path, ssl=context) as response:
        return response.status


async def test_admin_certificate_is_accepted_node_certificate_or_none_is_not(
    served: BallastService, certs: CertDir,
) -> None:
    admin = client(certs, certs.admin("oncall"))
    node = client(certs, certs.node("ewr", "ewr-1"))
    anonymous = client(certs, None)
    for path in ("/status", "/nodes", "/dashboard/api/overview", "/metrics"):
        assert await get(served, path, admin) == 200, path
        assert await get(served, path, node) == 401, path
        assert await get(served, path, anonymous) == 401, path
    for path in ("/healthz", "/readyz"):
        assert await get(served, path, anonymous) == 200
    a_stranger = CertDir(certs.root / "stranger")
    stranger_ca, _ = a_stranger.load_or_make_ca(1)
    impostor = a_stranger.make_admin(stranger_ca, "oncall", 1)  # right name, wrong CA
    with pytest.raises(aiohttp.ClientError):
        await get(served, "/status", client(certs, impostor))


async def test_cli_presents_the_admin_certificate(
    served: BallastService, certs: CertDir, capsys: pytest.CaptureFixture[str],
) -> None:
    assert served.admin is not None
    admin = certs.admin("oncall")
    args = ["status", "--server", served.admin.url, "--cacert", str(certs.ca.cert)]
    assert await asyncio.to_thread(main, args) == 1
    assert "wants authentication" in capsys.readouterr().err
    assert await asyncio.to_thread(
        main, [*args, "--cert", str(admin.cert), "--key", str(admin.key)]) == 0
    assert "no nodes connected" in capsys.readouterr().out
    assert await asyncio.to_thread(main, [*args, "--cert", str(admin.cert)]) == 1
    assert "--cert and --key together" in capsys.readouterr().err


def served_serial(port: int, certs: CertDir, pair: Pair) -> int:
    context = client(certs, pair)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_rotated_files_serve_the_next_admin_connection(
    served: BallastService, certs: CertDir,
) -> None:
    assert served.admin is not None
    port = served.admin.port
    old_ca = certs.ca.cert.read_bytes()  # signs the server's certificates throughout
    admin = certs.admin("oncall")
    before = await asyncio.to_thread(served_serial, port, certs, admin)
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    after = await asyncio.to_thread(served_serial, port, certs, admin)
    assert after != before
    assert after == x509.load_pem_x509_certificate(certs.server.cert.read_bytes()).serial_number
    # a new client CA: admin certificates of the old one stop working at the next connection
    new_ca = make_ca("ballast CA 2")
    next_dir = CertDir(certs.root / "next")
    write_pair(next_dir.ca, new_ca)
    new_admin = next_dir.make_admin(new_ca, "oncall", 1)
    certs.ca.cert.write_bytes(certs.ca.cert.read_bytes() + new_ca.cert_pem)  # both trusted
    assert await get(served, "/status", client(certs, new_admin, old_ca)) == 200
    assert await get(served, "/status", client(certs, admin, old_ca)) == 200
    certs.ca.cert.write_bytes(new_ca.cert_pem)  # only the new one
    assert await get(served, "/status", client(certs, new_admin, old_ca)) == 200
    with pytest.raises(aiohttp.ClientError):
        await get(served, "/status", client(certs, admin, old_ca))


async def test_admin_tls_needs_the_tls_files(tmp_path: Path, certs: CertDir) -> None:
    bad = dataclasses.replace(config(tmp_path, certs), tls=None)
    with pytest.raises(AdminAuthError, match="--tls-cert, --tls-key and --client-ca"):
        await BallastService(bad).start()


async def test_over_https_the_session_cookie_is_secure_and_a_certificate_needs_no_csrf_token(
    tmp_path: Path, certs: CertDir,
) -> None:
    token = tmp_path / "admin.token"
    token.write_text("https-session-token-0123456789\n")
    token.chmod(0o600)
    service = BallastService(dataclasses.replace(config(tmp_path, certs),
                                                 admin_token_file=token))
    await service.start()
    try:
        assert service.admin is not None
        anonymous = client(certs, None)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http, \
                http.post(f"{service.admin.url}/login", ssl=anonymous, allow_redirects=False,
                          data={"token": "https-session-token-0123456789"}) as response:
            assert response.status == 303
            assert response.cookies["ballast_admin_session"]["secure"]
        # an admin certificate (the CLI's, or a browser's) acts without a CSRF token, from
        # its own origin; from another page it is refused like a session
        admin = client(certs, certs.admin("oncall"))
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{service.admin.url}/rollout/pause", ssl=admin) as response:
                assert response.status == 409  # no rollout to pause: past authentication
            async with http.post(f"{service.admin.url}/rollout/pause", ssl=admin,
                                 headers={"Origin": "https://evil.example"}) as response:
                assert response.status == 403
    finally:
        await service.stop(0)
