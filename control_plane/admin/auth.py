"""Who may use the admin API: one middleware every route goes through (the dashboard's too).

Open to anyone who can reach the port: `/healthz`, `/readyz` (probes) and `/login` (the form
that opens a browser session). Everything else, unknown paths included, needs one of:

- `Authorization: Bearer <token>` with the token of `--admin-token-file` (the file is re-read
  when it changes; compared in constant time);
- a browser session (`admin/sessions.py`): the cookie `/login` sets holds a random session id,
  never the token;
- with the admin API on HTTPS, a client certificate that chains to the client CA and names an
  admin identity (`spiffe://ballast/admin/<name>`).

`GET /metrics` also takes the scrape token (`--admin-scrape-token-file`): read-only, it opens no
other route, so the token Prometheus holds cannot act on a rollout.

Otherwise: 401 with `WWW-Authenticate: Bearer` (a JSON error; for a browser asking for a
page, a page pointing at `/login`). Before any of it, a state-changing request a browser says
comes from another page is refused (403), and one a session authenticates needs the session's
CSRF token (`sessions.py`); a peer presenting wrong tokens is slowed down (429), each wrong one
logged (on this module's logger, under its log rate limit: `lifecycle/log_rate_limit.py`). With no
authentication configured the API is open, and then it may only listen on a loopback address;
off loopback it must be HTTPS (`check_bind`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from control_plane.admin.sessions import (
    CSRF_HEADER,
    SESSION_COOKIE,
    UNSAFE_METHODS,
    LoginThrottle,
    Session,
    Sessions,
    cross_site,
    csrf_matches,
    peer_key,
)
from control_plane.security.identity import AdminIdentity, identities
from control_plane.security.terminal import escape

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/login"})
SCRAPE_PATH = "/metrics"
WHO = web.RequestKey("ballast_admin_who", str)  # who the request was authenticated as
OLD_TOKEN_COOKIE = "ballast_admin_token"  # earlier versions kept the token itself in it
MIN_TOKEN_CHARS = 16
MAX_TOKEN_BYTES = 4096
LOGIN_FIELD_BYTES = 8192
LOGIN_FORM = "application/x-www-form-urlencoded"

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


    def fingerprint(self) -> str:
        """Which token is current, without it (sessions remember the token they were opened
        with: a rotation ends them)."""
        return hashlib.sha256(self.current().encode("ascii")).hexdigest()[:16]


@dataclass(frozen=True)
class AdminAuth:
    token: TokenFile | None = None
    client_certs: bool = False  # HTTPS with client certificates naming an admin identity
    scrape_token: TokenFile | None = None  # `GET /metrics` only
    sessions: Sessions = field(default_factory=Sessions)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.client_certs

    def who(self, request: web.Request) -> str | None:
        """`token`, `session` or `cert:<name>`: how the middleware authenticated the request
        (None: the API is open, or the route is)."""
        who: str | None = request.get(WHO)
        return who

    def session(self, request: web.Request) -> Session | None:
        """The live session the request's cookie names, if any."""
        if self.token is None:
            return None
        return self.sessions.get(request.cookies.get(SESSION_COOKIE), self.token.fingerprint())


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


def forbidden(message: str) -> web.Response:
    return web.json_response({"error": message}, status=403)


def too_many(wait_s: float) -> web.Response:
    return web.json_response(
        {"error": f"too many wrong tokens from this address: try again in {wait_s:.0f} s"},
        status=429, headers={"Retry-After": str(max(1, round(wait_s)))})


def own_origin(request: web.Request) -> str:
    """The admin API's origin as the request reached it: its scheme and `Host`."""
    return f"{request.scheme}://{request.host}"


def bearer(request: web.Request) -> str | None:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return presented.strip() or None if scheme.lower() == "bearer" else None


def refuse_wrong_token(auth: AdminAuth, request: web.Request, where: str) -> None:
    """Count a wrong token against its peer, and log it (the log rate limit bounds the lines)."""
    peer = peer_key(request.remote)
    count = auth.throttle.failed(peer)
    log.warning("admin API: wrong token from %s (%s; %d wrong from this address)",
                escape(peer), where, count)


def auth_middleware(auth: AdminAuth) -> Callable[[web.Request, Handler], Awaitable[
        web.StreamResponse]]:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        why = cross_site(request.method, request.headers, own_origin(request))
        if why is not None:
            log.warning("admin API: refused a cross-site %s %s from %s: %s", request.method,
                        escape(request.path[:100]), escape(str(request.remote)), escape(why))
            return forbidden(f"cross-site request refused ({why}): the admin API acts only "
                             "on requests from its own pages or from clients that are not "
                             "browsers")
        if not auth.enabled or request.path in OPEN_PATHS:
            return await handler(request)
        presented = bearer(request)
        if presented is not None and (auth.token or auth.scrape_token) is not None:
            wait = auth.throttle.retry_after(peer_key(request.remote))
            if wait is not None:
                return too_many(wait)
            if auth.token is not None and auth.token.matches(presented):
                request[WHO] = "token"
                return await handler(request)
            if (auth.scrape_token is not None and request.path == SCRAPE_PATH
                    and request.method in ("GET", "HEAD") and auth.scrape_token.matches(presented)):
                return await handler(request)
            refuse_wrong_token(auth, request, f"bearer token, {request.method} "
                               f"{escape(request.path[:100])}")
            return unauthorized("the bearer token was refused")
        session = auth.session(request)
        if session is not None:
            if request.method in UNSAFE_METHODS and not csrf_matches(
                    session, request.headers.get(CSRF_HEADER)):
                return forbidden(f"a session's {request.method} needs its CSRF token in "
                                 f"{CSRF_HEADER} (the dashboard sends it: GET /session)")
            request[WHO] = "session"
            return await handler(request)
        name = admin_name(request) if auth.client_certs else None
        if name is not None:
            request[WHO] = f"cert:{name}"
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


class BadForm(ValueError):
    """A sign-in form that cannot be read; answered 400 with this message."""


async def login_token(request: web.Request) -> str | None:
    """The `token` field of a sign-in form: URL-encoded (what the login page posts), read
    bounded whatever the framing (chunked included); BadForm for anything else."""
    if request.content_type != LOGIN_FORM:
        raise BadForm(f"the sign-in form is {LOGIN_FORM}, not {request.content_type[:64]!r}")
    body = b""
    while len(body) <= LOGIN_FIELD_BYTES:
        chunk = await request.content.read(LOGIN_FIELD_BYTES + 1 - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) > LOGIN_FIELD_BYTES:
        raise BadForm(f"the sign-in form is over {LOGIN_FIELD_BYTES} bytes")
    try:
        fields = urllib.parse.parse_qs(body.decode("ascii"), max_num_fields=4, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise BadForm("the sign-in form is not ASCII URL-encoded fields") from None
    values = fields.get("token", [])
    return values[0].strip() if len(values) == 1 else None


class Login:
    """`/login` (the form; its POST opens a session), `/logout` (ends it) and `/session` (the
    session's CSRF token, for the dashboard's own pages)."""

    def __init__(self, auth: AdminAuth) -> None:
        self.auth = auth

    def register(self, app: web.Application) -> None:
        """`/session` always (the dashboard asks it in every mode); the others with a token."""
        app.router.add_get("/session", self.shown)
        if self.auth.token is not None:
            app.router.add_get("/login", self.form)
            app.router.add_post("/login", self.submit)
            app.router.add_post("/logout", self.logout)

    async def form(self, request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_PAGE, content_type="text/html",
                            headers={"Content-Security-Policy": LOGIN_CSP,
                                     "Cache-Control": "no-store"})

    async def submit(self, request: web.Request) -> web.StreamResponse:
        token = self.auth.token
        assert token is not None, "registered with a token only"
        wait = self.auth.throttle.retry_after(peer_key(request.remote))
        if wait is not None:
            return too_many(wait)
        if (request.content_length or 0) > LOGIN_FIELD_BYTES:
            return web.json_response({"error": "login form too large"}, status=413)
        try:
            presented = await login_token(request)
        except BadForm as err:
            return web.json_response({"error": str(err)}, status=400)
        if presented is None or not token.matches(presented):
            refuse_wrong_token(self.auth, request, "sign-in")
            return unauthorized("wrong admin token")
        session_id, _ = self.auth.sessions.open(token.fingerprint())
        log.info("admin API: signed in from %s (%d sessions)", escape(str(request.remote)),
                 len(self.auth.sessions))
        response = web.Response(status=303, headers={"Location": "/dashboard/",
                                                     "Cache-Control": "no-store"})
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="Strict",
                            secure=request.secure, path="/",
                            max_age=int(self.auth.sessions.ttl_s))
        response.del_cookie(OLD_TOKEN_COOKIE, path="/")
        return response

    async def logout(self, request: web.Request) -> web.Response:
        """Ends the request's session (the middleware checked its CSRF token)."""
        self.auth.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = web.json_response({"signed_out": True}, headers={"Cache-Control": "no-store"})
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def shown(self, request: web.Request) -> web.Response:
        """Who the request is, and for a session its CSRF token (JSON; read by the admin API's
        own pages: a page of another origin cannot read it, no CORS header is ever sent)."""
        session = self.auth.session(request) if self.auth.who(request) == "session" else None
        return web.json_response(
            {"who": self.auth.who(request) or "open",
             "csrf": session.csrf if session is not None else None,
             "csrf_header": CSRF_HEADER},
            headers={"Cache-Control": "no-store"})
