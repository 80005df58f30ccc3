"""The admin API behind a bearer token: every route but /healthz and /readyz (the dashboard's
included) answers 401 without it; the CLI sends it from a file or the environment."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from control_plane.admin.auth import (
    AdminAuth,
    AdminAuthError,
    TokenFile,
    check_bind,
    read_token,
)
from control_plane.cli.main import main
from control_plane.lifecycle.service import BallastService, ServiceConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"
PROTECTED = ("/status", "/nodes", "/decisions", "/weights", "/tier-actions", "/metrics",
             "/resources?pop=ewr", "/dashboard/", "/dashboard/api/overview", "/nope")


def write_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[BallastService, Path, str]]:
    token_file = tmp_path / "admin.token"
    token = write_token(token_file)
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, admin_token_file=token_file,
    ))
    await service.start()
    yield service, token_file, token
    await service.stop(0)


def url(service: BallastService, path: str) -> str:
    assert service.admin is not None
    return f"{service.admin.url}{path}"


async def test_without_a_token_everything_but_the_probes_is_401(
    served: tuple[BallastService, Path, str],
) -> None:
    service, _, token = served
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz"):
            async with http.get(url(service, path)) as response:
                assert response.status == 200, path
        for path in PROTECTED:
            async with http.get(url(service, path)) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                assert "authentication required" in (await response.json())["error"]
        wrong = {"Authorization": "Bearer " + "x" * 43}
        for path in PROTECTED[:3]:  # a few: more would slow this address down (429)
            async with http.get(url(service, path), headers=wrong) as response:
                assert response.status == 401, path
        good = {"Authorization": f"Bearer {token}"}
        for path in PROTECTED:
            async with http.get(url(service, path), headers=good) as response:
                assert response.status == (404 if path == "/nope" else 200), path
        async with http.get(url(service, "/status"), headers=good) as response:
            assert (await response.json())["admin_auth"] == "token"
        browser = {"Accept": "text/html,application/xhtml+xml"}
        async with http.get(url(service, "/dashboard/"), headers=browser) as response:
            assert response.status == 401
            assert 'href="/login"' in await response.text()


async def test_a_rewritten_token_file_takes_over(
    served: tuple[BallastService, Path, str],
) -> None:
    service, token_file, old = served
    new = write_token(token_file)
    async with aiohttp.ClientSession() as http:
        for token, status in ((old, 401), (new, 200)):
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(url(service, "/status"), headers=headers) as response:
                assert response.status == status
        token_file.write_text("short")  # a broken rewrite: the last good token stays
        headers = {"Authorization": f"Bearer {new}"}
        async with http.get(url(service, "/status"), headers=headers) as response:
            assert response.status == 200


async def test_login_sets_a_cookie_the_dashboard_and_its_stream_accept(
    served: tuple[BallastService, Path, str],
) -> None:
    service, _, token = served
    # a browser's cookie jar (aiohttp's refuses cookies of IP addresses unless told)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(url(service, "/login")) as response:
            assert response.status == 200
            assert 'name="token"' in await response.text()
        async with http.post(url(service, "/login"), data={"token": "wrong" * 5},
                             allow_redirects=False) as response:
            assert response.status == 401
        assert not http.cookie_jar.filter_cookies(url(service, "/"))
        async with http.post(url(service, "/login"), data={"token": token},
                             allow_redirects=False) as response:
            assert response.status == 303
            assert response.headers["Location"] == "/dashboard/"
            cookie = response.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        async with http.get(url(service, "/dashboard/api/overview")) as response:
            assert response.status == 200
        async with http.get(url(service, "/dashboard/api/stream")) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")


def run_cli(*args: str) -> int:
    return main(list(args))


async def test_cli_reads_the_token_from_a_file_or_the_environment(
    served: tuple[BallastService, Path, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, token_file, token = served
    server = url(service, "")
    for name in ("BALLAST_ADMIN_TOKEN", "BALLAST_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert await asyncio.to_thread(run_cli, "status", "--server", server) == 1
    err = capsys.readouterr().err
    assert "wants authentication (no token was given)" in err and "--token-file" in err
    assert await asyncio.to_thread(
        run_cli, "status", "--server", server, "--token-file", str(token_file)) == 0
    assert "no nodes connected" in capsys.readouterr().out
    assert await asyncio.to_thread(
        run_cli, "decisions", "--server", server, "--token-file", str(token_file)) == 0
    assert "startup" in capsys.readouterr().out
    monkeypatch.setenv("BALLAST_ADMIN_TOKEN", token)
    assert await asyncio.to_thread(
        run_cli, "explain", "--server", server, "--pop", "ewr", "--group", "shop") == 0
    monkeypatch.setenv("BALLAST_ADMIN_TOKEN", "not-the-token-at-all")
    assert await asyncio.to_thread(run_cli, "status", "--server", server) == 1
    assert "the token given was refused" in capsys.readouterr().err
    monkeypatch.delenv("BALLAST_ADMIN_TOKEN")
    monkeypatch.setenv("BALLAST_ADMIN_TOKEN_FILE", str(token_file))
    assert await asyncio.to_thread(run_cli, "status", "--server", server) == 0


async def test_open_admin_api_only_on_loopback(tmp_path: Path) -> None:
    check_bind("127.0.0.1", AdminAuth())
    check_bind("::1", AdminAuth())
    check_bind("localhost", AdminAuth())
    with pytest.raises(AdminAuthError, match="without authentication"):
        check_bind("0.0.0.0", AdminAuth())
    token_file = tmp_path / "admin.token"
    token_file.write_text("a-token-long-enough-to-use\n")
    token_file.chmod(0o600)
    with pytest.raises(AdminAuthError, match=r"on 0\.0\.0\.0 over plain HTTP.*--admin-tls"):
        check_bind("0.0.0.0", AdminAuth(token=TokenFile(token_file)))  # a token in clear text
    check_bind("0.0.0.0", AdminAuth(token=TokenFile(token_file), client_certs=True))
    config = ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path / "state",
                           xds_address="127.0.0.1:0", admin_address="10.1.2.3:18001",
                           probes=False)
    with pytest.raises(AdminAuthError, match=r"on 10\.1\.2\.3 without authentication"):
        await BallastService(config).start()
    assert not (tmp_path / "state" / "state.db").exists()  # refused before anything opened


def test_weak_or_odd_token_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    for content, why in ((b"short", "at least 16"), (b"two words here and more", "one word"),
                         (b"\xff" * 20, "not ASCII"), (b"x" * 5000, "longer than")):
        path.write_bytes(content)
        with pytest.raises(AdminAuthError, match=why):
            read_token(path)
    with pytest.raises(AdminAuthError, match="not a regular file"):
        read_token(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(AdminAuthError, match="not a regular file"):
        read_token(tmp_path / "fifo")
