"""Issue 36, break 2 (without a browser; `test_admin_csrf_browser.py` has the real one): the
admin API's browser sessions, its cross-site and CSRF checks, the wrong-token throttle and the
read-only scrape token, against a running service.

Before: `/login` set the admin token itself as the cookie (no expiry, no logout), a page of
another port of 127.0.0.1 could post to `/rollout/abort` with it, the token Prometheus held could
abort or promote, and `/login` took ~7,000 guesses/s without logging one."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from control_plane.admin.auth import AdminAuthError
from control_plane.admin.sessions import (
    CSRF_HEADER,
    SESSION_COOKIE,
    THROTTLE_BURST,
    LoginThrottle,
    Sessions,
    cross_site,
    peer_key,
)
from control_plane.lifecycle.service import BallastService, ServiceConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"


def write_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


@dataclass
class Served:
    service: BallastService
    token: str
    token_file: Path
    scrape: str

    @property
    def url(self) -> str:
        assert self.service.admin is not None
        return self.service.admin.url


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    token_file, scrape_file = tmp_path / "admin.token", tmp_path / "scrape.token"
    token, scrape = write_token(token_file), write_token(scrape_file)
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, admin_token_file=token_file,
        admin_scrape_token_file=scrape_file))
    await service.start()
    yield Served(service, token, token_file, scrape)
    await service.stop(0)


def browser() -> aiohttp.ClientSession:
    """A cookie jar like a browser's (aiohttp's refuses cookies of IP addresses unless told)."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sign_in(http: aiohttp.ClientSession, served: Served) -> str:
    """Signs in; the session's CSRF token."""
    async with http.post(f"{served.url}/login", data={"token": served.token},
                         allow_redirects=False) as response:
        assert response.status == 303
    async with http.get(f"{served.url}/session") as response:
        assert response.status == 200
        shown = await response.json()
    assert shown["who"] == "session" and shown["csrf_header"] == CSRF_HEADER
    csrf: str = shown["csrf"]
    return csrf


async def test_the_cookie_holds_a_session_id_never_the_token(served: Served) -> None:
    async with browser() as http:
        async with http.post(f"{served.url}/login", data={"token": served.token},
                             allow_redirects=False) as response:
            assert response.status == 303
            cookie = response.cookies[SESSION_COOKIE]
            assert served.token not in response.headers.getall("Set-Cookie")[0]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
            assert cookie["path"] == "/" and int(cookie["max-age"]) == 8 * 3600
            assert not cookie["secure"]  # plain HTTP on loopback; HTTPS sets it
        async with http.get(f"{served.url}/dashboard/api/overview") as response:
            assert response.status == 200
        async with http.get(f"{served.url}/dashboard/api/stream") as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
    # the cookie of earlier versions, holding the token itself, opens nothing now
    async with aiohttp.ClientSession(cookies={"ballast_admin_token": served.token}) as http, \
            http.get(f"{served.url}/status") as response:
        assert response.status == 401


async def test_a_session_posts_only_with_its_csrf_token_from_its_own_origin(
    served: Served,
) -> None:
    async with browser() as http:
        csrf = await sign_in(http, served)
        pause = f"{served.url}/rollout/pause"
        async with http.post(pause) as response:  # the cookie alone: a forged form post
            assert response.status == 403
            assert CSRF_HEADER in (await response.json())["error"]
        async with http.post(pause, headers={CSRF_HEADER: "x" * 43}) as response:
            assert response.status == 403
        for hostile in ({"Origin": "http://127.0.0.1:1"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"}):
            async with http.post(pause, headers={CSRF_HEADER: csrf, **hostile}) as response:
                assert response.status == 403, hostile
                assert "cross-site request refused" in (await response.json())["error"]
        # the control: the admin API's own page (same origin, the token) gets through to the
        # rollout, which has nothing to pause here (409), not to the CSRF check (403)
        own = {CSRF_HEADER: csrf, "Origin": served.url, "Sec-Fetch-Site": "same-origin"}
        async with http.post(pause, headers=own) as response:
            assert response.status == 409, await response.text()
        # a bearer token (the CLI: no browser headers) needs no CSRF token
        bearer = {"Authorization": f"Bearer {served.token}"}
        async with aiohttp.ClientSession() as cli, cli.post(pause, headers=bearer) as response:
            assert response.status == 409
        # ... and is refused all the same when a browser says another page sent it
        async with aiohttp.ClientSession() as cli, cli.post(
                pause, headers={**bearer, "Sec-Fetch-Site": "cross-site"}) as response:
            assert response.status == 403
        # /logout needs the token too; then the session is over
        async with http.post(f"{served.url}/logout") as response:
            assert response.status == 403
        async with http.post(f"{served.url}/logout", headers=own) as response:
            assert response.status == 200
        async with http.get(f"{served.url}/status") as response:
            assert response.status == 401


async def test_a_rotated_token_ends_the_sessions_opened_with_the_old_one(
    served: Served,
) -> None:
    async with browser() as http:
        await sign_in(http, served)
        async with http.get(f"{served.url}/status") as response:
            assert response.status == 200
        write_token(served.token_file)
        async with http.get(f"{served.url}/status") as response:
            assert response.status == 401


def test_a_session_expires_and_the_oldest_goes_beyond_the_cap() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, max_sessions=2, clock=lambda: now[0])
    first, _ = sessions.open("t1")
    second, _ = sessions.open("t1")
    assert sessions.get(first, "t1") is not None
    assert sessions.get(second, "t2") is None  # opened with another token: ended
    assert sessions.get(second, "t1") is None
    third, _ = sessions.open("t1")
    fourth, _ = sessions.open("t1")
    assert sessions.get(first, "t1") is None  # the oldest, beyond the cap of 2
    now[0] = 10.0
    assert sessions.get(third, "t1") is None and sessions.get(fourth, "t1") is None
    assert len(sessions) == 0


def test_cross_site_reads_what_browsers_send() -> None:
    own = "http://127.0.0.1:18001"
    assert cross_site("GET", {"Origin": "http://evil"}, own) is None  # reads change nothing
    assert cross_site("POST", {}, own) is None  # not a browser
    assert cross_site("POST", {"Origin": own, "Sec-Fetch-Site": "same-origin"}, own) is None
    assert cross_site("POST", {"Sec-Fetch-Site": "none"}, own) is None  # typed by the user
    assert cross_site("POST", {"Origin": "http://127.0.0.1:8080"}, own) is not None
    assert cross_site("DELETE", {"Sec-Fetch-Site": "same-site"}, own) is not None


def test_wrong_tokens_are_counted_per_address_and_ipv6_per_64() -> None:
    now = [0.0]
    throttle = LoginThrottle(burst=3, refill_s=10, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    assert throttle.retry_after("a") == pytest.approx(10)
    assert throttle.retry_after("b") is None
    now[0] = 10.0
    assert throttle.retry_after("a") is None
    assert peer_key("2001:db8::1") == peer_key("2001:db8::ffff") == "2001:db8::/64"
    assert peer_key("::ffff:10.0.0.1") == "10.0.0.1"


async def test_sign_in_is_throttled_per_address_and_every_wrong_token_logged(
    served: Served, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "control_plane.admin.auth")
    async with browser() as http:
        for _ in range(THROTTLE_BURST):
            async with http.post(f"{served.url}/login", data={"token": "wrong-token-" * 3},
                                 allow_redirects=False) as response:
                assert response.status == 401
        # over the burst: refused unchecked, even with the right token
        async with http.post(f"{served.url}/login", data={"token": served.token},
                             allow_redirects=False) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1
        bearer = {"Authorization": f"Bearer {served.token}"}
        async with http.get(f"{served.url}/status", headers=bearer) as response:
            assert response.status == 429
    wrong = [r for r in caplog.records if "wrong token from 127.0.0.1" in r.getMessage()]
    assert len(wrong) == THROTTLE_BURST
    assert wrong[-1].getMessage().endswith(f"{THROTTLE_BURST} wrong from this address)")


async def test_malformed_sign_in_forms_are_400(served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("token", served.token)
        form.add_field("file", b"x", filename="x")  # multipart: not what the page posts
        async with http.post(f"{served.url}/login", data=form) as response:
            assert response.status == 400
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"token=" + b"a" * 4000
        async with http.post(f"{served.url}/login", data=chunks(), headers={
                "Content-Type": "application/x-www-form-urlencoded"}) as response:
            assert response.status == 400  # chunked, over the bound
            assert "over 8192 bytes" in (await response.json())["error"]


async def test_the_scrape_token_reads_metrics_and_nothing_else(served: Served) -> None:
    scrape = {"Authorization": f"Bearer {served.scrape}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{served.url}/metrics", headers=scrape) as response:
            assert response.status == 200
            assert "ballast_" in await response.text()
        for method, path in (("GET", "/status"), ("GET", "/resources?pop=ewr"),
                             ("POST", "/rollout/abort"), ("POST", "/rollout/apply")):
            async with http.request(method, f"{served.url}{path}", headers=scrape) as response:
                assert response.status == 401, path
        # the control: the admin token reads /metrics too
        admin = {"Authorization": f"Bearer {served.token}"}
        async with http.get(f"{served.url}/metrics", headers=admin) as response:
            assert response.status == 200


async def test_a_scrape_token_equal_to_the_admin_token_or_without_one_refuses_the_start(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "admin.token"
    write_token(token_file)
    for config, why in (
            (dict(admin_token_file=token_file, admin_scrape_token_file=token_file),
             "must not be the admin token"),
            (dict(admin_scrape_token_file=token_file), "goes with --admin-token-file")):
        service = BallastService(ServiceConfig(
            desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
            admin_address="127.0.0.1:0", probes=False, **config))  # type: ignore[arg-type]
        with pytest.raises(AdminAuthError, match=why):
            await service.start()


async def test_open_mode_refuses_cross_site_posts_too(tmp_path: Path) -> None:
    """No authentication (loopback only): any web page the operator opens could post to it, so
    the cross-site check applies all the same."""
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False))
    await service.start()
    try:
        assert service.admin is not None
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{service.admin.url}/rollout/abort",
                                 headers={"Origin": "https://evil.example"}) as response:
                assert response.status == 403
            async with http.post(f"{service.admin.url}/rollout/abort") as response:
                assert response.status == 409  # the control: the CLI's post reaches it
    finally:
        await asyncio.wait_for(service.stop(0), 30)
