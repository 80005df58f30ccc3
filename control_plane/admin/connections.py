"""How many connections the admin port holds, and for how long a client may keep one silent.

aiohttp alone keeps a connection that never sends a request for an hour and has no cap: 420
idle connections once emptied a process of its file descriptors, which took the xDS port, the
desired-file watcher and the state store down with the admin API. Here:

- **header timeout**: a connection must have sent a complete request head within
  `header_timeout_s` of being accepted (TLS handshake included), else it is closed;
- **idle timeout**: between requests, aiohttp's keep-alive timeout (`idle_timeout_s`), which
  also closes a connection whose next request head does not complete in that time;
- **a cap** on open connections, at most a quarter of the process's descriptor limit (the
  other three quarters stay for the xDS port, the desired file, the state store and the
  log): at the cap, a new connection closes the oldest one that has no request in progress
  (idle, or still sending its head), so a flood of idle or slow clients cannot keep an
  operator out; when every connection is busy, the new one is closed.

What is closed is counted and logged as one line per `REPORT_EVERY_S`, never one per
connection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

REPORT_EVERY_S = 60.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class AdminLimits:
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_connections: int = 256


DEFAULT_ADMIN_LIMITS = AdminLimits()


def connection_cap(configured: int) -> int:
    """`configured`, or a quarter of the descriptor limit when that is lower (at least 8)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(8, min(configured, soft // 4))


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's timer and bookkeeping around it."""

    def __init__(self, guard: ConnectionGuard, inner: Any) -> None:
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0  # requests in progress
        self.heard = False  # a complete request head arrived
        self.timer: asyncio.TimerHandle | None = None
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.guard.admit(self):
            transport.abort()
            return
        self.admitted = True
        self.timer = asyncio.get_running_loop().call_later(
            self.guard.limits.header_timeout_s, self._silent)
        self.inner.connection_made(transport)

    def _silent(self) -> None:
        self.timer = None
        if not self.heard and self.transport is not None:
            self.guard.count("no request head in time")
            self.transport.abort()

    def heard_request(self) -> None:
        self.heard = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.admitted:
            self.guard.closed(self)
            self.inner.connection_lost(exc)


class ConnectionGuard:
    """The protocol factory the admin port listens with (wrapping aiohttp's), and the
    middleware that tells it which connections have a request in progress."""

    def __init__(self, limits: AdminLimits) -> None:
        self.factory: Callable[[], Any] | None = None  # aiohttp's, once its runner is set up
        self.limits = limits
        self.cap = connection_cap(limits.max_connections)
        self._open: dict[asyncio.BaseTransport, _Guarded] = {}  # oldest first
        self._closed: Counter[str] = Counter()
        self._report: asyncio.TimerHandle | None = None

    def __call__(self) -> asyncio.Protocol:
        assert self.factory is not None, "listening starts after the runner's set-up"
        return _Guarded(self, self.factory())

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, guarded: _Guarded) -> bool:
        if len(self._open) >= self.cap:
            oldest_idle = next((g for g in self._open.values() if not g.busy), None)
            if oldest_idle is None:
                self.count("over the cap, every connection busy")
                return False
            self.count("oldest idle connection closed for a new one (at the cap)")
            self._forget(oldest_idle)
            assert oldest_idle.transport is not None
            oldest_idle.transport.abort()
        assert guarded.transport is not None
        self._open[guarded.transport] = guarded
        return True

    def closed(self, guarded: _Guarded) -> None:
        self._forget(guarded)

    def _forget(self, guarded: _Guarded) -> None:
        if guarded.transport is not None:
            self._open.pop(guarded.transport, None)

    def count(self, why: str) -> None:
        if not self._closed and self._report is None:
            log.warning("admin connections closed: %s (counted; a summary every %g s)", why,
                        REPORT_EVERY_S)
            self._report = asyncio.get_running_loop().call_later(REPORT_EVERY_S, self._summary)
        self._closed[why] += 1

    def _summary(self) -> None:
        self._report = None
        if self._closed:
            log.warning("admin connections closed in the last %g s: %s (cap %d)", REPORT_EVERY_S,
                        ", ".join(f"{n} {why}" for why, n in self._closed.items()), self.cap)
            self._closed.clear()
            self._report = asyncio.get_running_loop().call_later(REPORT_EVERY_S, self._summary)

    def stop(self) -> None:
        if self._report is not None:
            self._report.cancel()
            self._report = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        guarded = self._open.get(request.transport) if request.transport is not None else None
        if guarded is None:
            return await handler(request)
        guarded.heard_request()
        guarded.busy += 1
        try:
            return await handler(request)
        finally:
            guarded.busy -= 1


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 ssl_context: Any = None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self.guard = host, port, guard

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self.guard.factory = self._runner.server
        handshake = self.guard.limits.header_timeout_s if self._ssl_context else None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            ssl_handshake_timeout=handshake)
