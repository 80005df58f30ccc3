"""Who may use the admin API: one middleware every route goes through (the dashboard's too).

Open to anyone who can reach the port: `/healthz`, `/readyz` (probes) and `/login` (the form
that turns a token into a browser cookie). Everything else, unknown paths included, needs one of:

- `Authorization: Bearer <token>` with the token of `--admin-token-file` (the file is re-read
  when it changes; compared in constant time);
- the `ballast_admin_token` cookie holding that token (set by `/login`: HttpOnly,
  SameSite=Strict) — how a browser reaches the dashboard and its event stream;
- with the admin API on HTTPS, a client certificate that chains to the client CA and names an
  admin identity (`spiffe://ballast/admin/<name>`).

Otherwise: 401 with `WWW-Authenticate: Bearer` (a JSON error; for a browser asking for a
page, a page pointing at `/login`). With no authentication configured the API is
open, and then it may only listen on a loopback address; off loopback it must be HTTPS
(`check_bind`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from control_plane.security.identity import AdminIdentity, identities

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/login"})
TOKEN_COOKIE = "ballast_admin_token"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
LOGIN_FIELD_BYTES = 8192

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAuthError(ValueError):
    """The admin authentication cannot be set up as asked; the message says why."""


def read_token(path: Path) -> str:
    """The token in `path` (surrounding whitespace dropped); AdminAuthError says what is wrong."""
    if not path.is_file():
        raise AdminAuthError(f"admin token file {path}: not a regular file")
    with path.open("rb") as f:
        data = f.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise AdminAuthError(f"admin token file {path}: longer than {MAX_TOKEN_BYTES} bytes")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise AdminAuthError(f"admin token file {path}: not ASCII text") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise AdminAuthError(
            f"admin token file {path}: the token must be one word of at least "
            f"{MIN_TOKEN_CHARS} characters"
        )
    return token


class TokenFile:
    """The admin token, re-read when its file changes; a broken rewrite keeps the last good
    token (logged once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._token = read_token(path)
        self.last_error: str | None = None
        mode = path.stat().st_mode
        if mode & 0o077:
            log.warning("admin token file %s is readable by others (mode %o)", path, mode & 0o777)

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def current(self) -> str:
        with self._lock:
            try:
                signature = self._stat()
                if signature != self._signature:
                    self._token = read_token(self.path)
                    self._signature = signature
                    self.last_error = None
                    log.info("admin token file %s re-read", self.path)
            except (OSError, AdminAuthError) as err:
                if str(err) != self.last_error:
                    log.error("admin token not re-read, the last good one stays: %s", err)
                self.last_error = str(err)
            return self._token

    def matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode("utf-8", "replace"),
                                   self.current().encode("ascii"))


@dataclass(frozen=True)
class AdminAuth:
    token: TokenFile | None = None
    client_certs: bool = False  # HTTPS with client certificates naming an admin identity

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.client_certs

    def who(self, request: web.Request) -> str | None:
        """`token`, `cookie` or `cert:<name>` for an authenticated request, else None."""
        if self.token is not None:
            scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer" and presented and self.token.matches(presented.strip()):
                return "token"
            cookie = request.cookies.get(TOKEN_COOKIE)
            if cookie and self.token.matches(cookie):
                return "cookie"
        if self.client_certs:
            name = admin_name(request)
            if name is not None:
                return f"cert:{name}"
        return None


def admin_name(request: web.Request) -> str | None:
    """The admin identity in the request's verified client certificate, if any."""
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    if not peer:
        return None
    uris = [value for kind, value in peer.get("subjectAltName", ()) if kind == "URI"]
    admins = [i for i in identities(uris) if isinstance(i, AdminIdentity)]
    return admins[0].name if len(admins) == 1 else None


def unauthorized(message: str) -> web.Response:
    return web.json_response(
        {"error": message}, status=401,
        headers={"WWW-Authenticate": 'Bearer realm="ballast admin"'},
    )


def auth_middleware(auth: AdminAuth) -> Callable[[web.Request, Handler], Awaitable[
        web.StreamResponse]]:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not auth.enabled or request.path in OPEN_PATHS or auth.who(request) is not None:
            return await handler(request)
        ways = []
        if auth.token is not None:
            ways.append("an Authorization: Bearer token (ballast --token-file or "
                        "$BALLAST_ADMIN_TOKEN)")
        if auth.client_certs:
            ways.append("a client certificate with an admin identity")
        if auth.token is not None and "text/html" in request.headers.get("Accept", ""):
            return web.Response(status=401, text=SIGN_IN_FIRST, content_type="text/html",
                                headers={"WWW-Authenticate": 'Bearer realm="ballast admin"',
                                         "Content-Security-Policy": LOGIN_CSP})
        return unauthorized(f"authentication required: {' or '.join(ways)}")

    return authenticate


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: AdminAuth) -> None:
    """Off loopback the admin API is HTTPS (`--admin-tls`): a bearer token over plain HTTP
    would cross the network readable by anyone on the path. On loopback it may be open."""
    if is_loopback(host):
        return
    if not auth.enabled:
        raise AdminAuthError(
            f"refusing to serve the admin API on {host} without authentication: give "
            "--admin-tls (HTTPS, with --admin-token-file for a token), or bind 127.0.0.1"
        )
    if not auth.client_certs:
        raise AdminAuthError(
            f"refusing to serve the admin API on {host} over plain HTTP: the bearer token would "
            "cross the network in clear text; give --admin-tls (HTTPS with the --tls-* files), "
            "or bind 127.0.0.1"
        )


LOGIN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Ballast admin: sign in</title></head>
<body><form method="post" action="/login">
<label>Admin token <input type="password" name="token" autocomplete="current-password"></label>
<button type="submit">Sign in</button></form></body></html>
"""
LOGIN_CSP = "default-src 'none'; form-action 'self'"
SIGN_IN_FIRST = """<!doctype html>
<html><head><meta charset="utf-8"><title>Ballast admin: sign in</title></head>
<body><p>This page needs the admin token: <a href="/login">sign in</a>.</p></body></html>
"""


class Login:
    """`/login`: a form whose POST checks the token and sets it as an HttpOnly cookie."""

    def __init__(self, auth: AdminAuth) -> None:
        self.auth = auth

    def register(self, app: web.Application) -> None:
        app.router.add_get("/login", self.form)
        app.router.add_post("/login", self.submit)

    async def form(self, request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_PAGE, content_type="text/html",
                            headers={"Content-Security-Policy": LOGIN_CSP,
                                     "Cache-Control": "no-store"})

    async def submit(self, request: web.Request) -> web.StreamResponse:
        if self.auth.token is None:
            return web.json_response({"error": "no admin token is configured"}, status=404)
        if (request.content_length or 0) > LOGIN_FIELD_BYTES:
            return web.json_response({"error": "login form too large"}, status=413)
        form = await request.post()
        presented = form.get("token")
        if not isinstance(presented, str) or not self.auth.token.matches(presented.strip()):
            return unauthorized("wrong admin token")
        response = web.Response(status=303, headers={"Location": "/dashboard/"})
        response.set_cookie(TOKEN_COOKIE, presented.strip(), httponly=True, samesite="Strict",
                            secure=request.secure, path="/")
        return response
