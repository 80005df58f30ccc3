"""Browser sessions of the admin API, the checks that keep other pages from acting through them,
and how often a peer may present a wrong token.

**Sessions.** `/login` checks the admin token once and opens a session: a random 256-bit id in
the cookie `ballast_admin_session` (`HttpOnly`, `SameSite=Strict`, `Path=/`, `Secure` on HTTPS,
`Max-Age` the session's lifetime), never the token itself. A session ends at its expiry
(`SESSION_TTL_S`, a shift), at `/logout`, when the token is rotated (it remembers the token it
was opened with) and when the replica restarts (sessions live in its memory only). At most
`MAX_SESSIONS` are held; a new one beyond ends the oldest. Ids are looked up by their SHA-256,
so the lookup's timing says nothing about a valid id.

**Cross-site requests.** A browser sends cookies to every port of a host: a page served from
another port of 127.0.0.1 is *same-site* with the admin API, so `SameSite=Strict` does not keep
its form posts from carrying the cookie. So every state-changing request (`POST`, `PUT`,
`PATCH`, `DELETE`, whatever authenticates it, open mode included) is refused (403) when the
browser says it comes from elsewhere: a `Sec-Fetch-Site` other than `same-origin` or `none`, or
an `Origin` that is not the admin API's own (scheme and `Host`), `null` included. A request with
neither header (the CLI, curl) is not a browser's cross-site request. A request authenticated
by the session cookie must also carry the session's CSRF token in `X-Ballast-CSRF`, which only
the admin API's own pages can read (`GET /session`, same-origin only: no CORS). The dashboard
sends it with its actions.

**Wrong tokens.** Each peer (its address; IPv6 by its /64) may present `THROTTLE_BURST` wrong
tokens — at `/login` or as a bearer token — then one per `THROTTLE_REFILL_S`; beyond, its
attempts are answered 429 without being checked. At most `MAX_PEERS` peers are remembered (the
oldest forgotten first).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

SESSION_COOKIE = "ballast_admin_session"
CSRF_HEADER = "X-Ballast-CSRF"
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 1024
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SAME_ORIGIN_SITES = frozenset({"same-origin", "none"})
THROTTLE_BURST = 10
THROTTLE_REFILL_S = 6.0
MAX_PEERS = 4096


@dataclass
class Session:
    csrf: str
    expires: float  # on the sessions' clock
    token_id: str  # which admin token opened it (a rotation ends it)


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


class Sessions:
    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._held: OrderedDict[str, Session] = OrderedDict()  # SHA-256 of the id -> session

    def __len__(self) -> int:
        return len(self._held)

    def open(self, token_id: str) -> tuple[str, Session]:
        """A new session (its id, for the cookie, and what is kept of it)."""
        session_id = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), self._clock() + self.ttl_s, token_id)
        self._held[_key(session_id)] = session
        while len(self._held) > self.max_sessions:
            self._held.popitem(last=False)
        return session_id, session

    def get(self, session_id: str | None, token_id: str | None) -> Session | None:
        """The live session of `session_id` opened with the token `token_id` now has; one that
        expired or whose token was rotated is ended."""
        if not session_id:
            return None
        key = _key(session_id)
        session = self._held.get(key)
        if session is None:
            return None
        if session.expires <= self._clock() or session.token_id != token_id:
            del self._held[key]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._held.pop(_key(session_id), None)


def cross_site(method: str, headers: Mapping[str, str], own_origin: str) -> str | None:
    """Why a state-changing request comes from another page than the admin API's own (a
    browser says so in `Sec-Fetch-Site` or `Origin`), or None."""
    if method not in UNSAFE_METHODS:
        return None
    get = headers.get
    site = get("Sec-Fetch-Site")
    if site is not None and site.lower() not in SAME_ORIGIN_SITES:
        return f"Sec-Fetch-Site {site[:32]!r}"
    origin = get("Origin")
    if origin is not None and origin.lower() != own_origin.lower():
        return f"Origin {origin[:100]!r} is not {own_origin!r}"
    return None


def csrf_matches(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(
        presented.encode("utf-8", "replace"), session.csrf.encode("ascii"))


def peer_key(address: str | None) -> str:
    """Whom a wrong token is counted against: the peer's address, an IPv6 one by its /64."""
    if not address:
        return "?"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _Bucket:
    tokens: float
    at: float
    failures: int = 0  # wrong tokens in all, for the log line


class LoginThrottle:
    """Wrong tokens per peer: `THROTTLE_BURST`, then one per `THROTTLE_REFILL_S`."""

    def __init__(self, burst: int = THROTTLE_BURST, refill_s: float = THROTTLE_REFILL_S,
                 max_peers: int = MAX_PEERS, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.refill_s, self.max_peers = burst, refill_s, max_peers
        self._clock = clock
        self._peers: OrderedDict[str, _Bucket] = OrderedDict()
        self.refused = 0  # attempts answered 429

    def _bucket(self, peer: str) -> _Bucket | None:
        bucket = self._peers.get(peer)
        if bucket is not None:
            now = self._clock()
            bucket.tokens = min(float(self.burst),
                                bucket.tokens + (now - bucket.at) / self.refill_s)
            bucket.at = now
        return bucket

    def retry_after(self, peer: str) -> float | None:
        """Seconds until `peer` may try again, or None when it may now."""
        bucket = self._bucket(peer)
        if bucket is None or bucket.tokens >= 1:
            return None
        self.refused += 1
        return (1 - bucket.tokens) * self.refill_s

    def failed(self, peer: str) -> int:
        """Count a wrong token of `peer`; how many it presented in all."""
        bucket = self._bucket(peer)
        if bucket is None:
            bucket = _Bucket(float(self.burst), self._clock())
            self._peers[peer] = bucket
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        self._peers.move_to_end(peer)
        bucket.tokens -= 1
        bucket.failures += 1
        return bucket.failures
