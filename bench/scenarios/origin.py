"""A loopback origin whose behaviour follows the scenario's time script, modelled on the seeds'
origins.

- **Work**: every request costs a time to first byte (log-normal around the script's p50) plus
  backend work: an uncacheable request (the checkout API) always `api_ms`; a cacheable one
  `miss_ms` when it is not in the origin's cache (a fetch from the origin's own backend), nothing
  more when it is.
- **Cache** (`cache_ttl_s`): an object stays cached while it is asked for at least once every
  `cache_ttl_s` (idle eviction); a miss fills it when its fetch completes. A warm origin starts
  with every object cached; a cold one with none (seed 002's standby: "hit ratio drops from 95 %
  to maybe 20 %", "2-3x surge in origin fetches").
- **Workers and wait line**: `workers` requests are worked on at once, `max_waiting` more wait;
  beyond that the origin answers 503 at once (an overloaded origin sheds).
- **Connections**: a new connection costs `connect_ms` of a worker's time with its first
  request (TLS set-up); beyond `max_connections` open ones a new connection is answered 503
  and closed (file descriptors; seed 002: "4k established connections to 80k in under 10
  seconds").
- **Abandonment**: when the client (Envoy) gives up on a request, the origin drops it from its
  wait line at once and stops working on it after at most `abandon_after_s`, as a real origin
  notices a closed connection on its next write or read.
- **Faults**: a 5xx rate drawn per request, limited to requests through some PoPs
  (`x-ballast-pop`) when the script says so.
- **Health**: `/healthz` is shallow (answered at once, as seed 002 warns: it "kept returning 200
  while real user paths were timing out"); `/healthz/cacheable` is a cacheable request like any
  other (the deep check: Ballast's probe path, and the `binary-deep` baseline's).
- **Every attempt kept**: each request that reaches the origin (a retry, a mirrored copy) is
  one `Attempt`: which host (port) it came to, when it arrived, when a worker started on it,
  when the worker was free again, and how it ended. The report joins them to the client's
  requests by request number; probes are only counted (`probes`).

Random draws: a request's latency and error come from its own stream, keyed by the seed, the
origin, the request number the load generator sends (`x-bench-request`) and the attempt at this
origin, so the same request costs the same in every variant whatever the arrival order and
however many health checks arrived between (a check draws nothing: `/healthz` is shallow).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

from aiohttp import web

from bench.scenarios.load import REQUEST_HEADER

POP_HEADER = "x-ballast-pop"
SIGMA = 0.35  # log-normal spread: p95 ≈ 1.8 x p50
SHALLOW_HEALTH = "/healthz"
UNCACHEABLE_PREFIX = "/api/"
MIRROR_SUFFIX = "-shadow"  # Envoy appends it to the host of a mirrored copy's Host (port after)


@dataclass(frozen=True)
class Behaviour:
    """How the origin answers at one moment of the script."""

    p50_ms: float = 30.0
    error_rate: float = 0.0
    pops: tuple[str, ...] = ()  # the behaviour applies to requests through these PoPs; () = all


@dataclass(frozen=True)
class OriginSpec:
    """The origin's capacity and cache (0 / None: no limit, no cache)."""

    workers: int = 0
    max_waiting: int = 0
    max_connections: int = 0
    connect_ms: float = 0.0
    cache_ttl_s: float | None = None
    miss_ms: float = 0.0
    api_ms: float = 0.0
    warm: bool = True
    healthy_p50_ms: float = 30.0
    abandon_after_s: float = 0.5
    endpoints: int = 1  # listening ports: the hosts Envoy sees


# how an attempt ended at the origin
ANSWERED, INJECTED, OVERLOADED, REFUSED, LEFT, ABANDONED = (
    "200", "500", "overloaded", "refused", "left", "abandoned")


@dataclass
class Attempt:
    """One request's visit to an origin, times in the origin's clock (time.monotonic()) until
    the runner moves them onto the run's: `start` is None when no worker took it (refused,
    overloaded, or its client left while it waited); `end` is when the worker was free again
    (for an abandoned one, up to `abandon_after_s` after its client left)."""

    rid: str  # the request's number (x-bench-request)
    origin: str
    host: int  # which of the origin's ports (the host Envoy chose)
    arrive: float
    start: float | None = None
    end: float | None = None
    result: str = ""
    mirror: bool = False  # a copy Envoy's request mirroring sent (Host ends in -shadow)


@dataclass(frozen=True)
class OriginStats:
    """Cumulative counters and current gauges, sampled by the runner."""

    requests: int
    hits: int
    misses: int
    load: int  # working + waiting
    connections: int
    overloaded: int
    refused: int
    abandoned: int


class ScriptedOrigin:
    def __init__(self, name: str, ports: list[int], spec: OriginSpec, *, seed: int) -> None:
        self.name = name
        self.ports = ports
        self.spec = spec
        self.seed = seed
        self.behaviour = Behaviour(p50_ms=spec.healthy_p50_ms)
        self.healthy = self.behaviour
        self.requests: Counter[str] = Counter()  # per tier seen (x-ballast-tier)
        self.hits = self.misses = self.overloaded = self.refused = self.abandoned = 0
        self.working = self.waiting = 0
        self._slots = asyncio.Semaphore(spec.workers) if spec.workers else None
        self._cached: dict[str, float] = {}  # path → last asked (monotonic)
        self._connections: set[asyncio.BaseTransport] = set()
        self._attempts: Counter[str] = Counter()
        self._runners: list[web.AppRunner] = []
        self._background: set[asyncio.Task[None]] = set()
        self.attempts: list[Attempt] = []
        self.probes: Counter[str] = Counter()  # health-check path → requests

    def warm(self, paths: list[str]) -> None:
        """Paths already in the origin's cache when the run starts."""
        now = time.monotonic()
        self._cached.update(dict.fromkeys(paths, now))

    @property
    def load(self) -> int:
        return self.working + self.waiting

    def stats(self) -> OriginStats:
        self._connections = {t for t in self._connections if not t.is_closing()}
        return OriginStats(sum(self.requests.values()), self.hits, self.misses, self.load,
                           len(self._connections), self.overloaded, self.refused,
                           self.abandoned)

    def _now(self, request: web.Request) -> Behaviour:
        b = self.behaviour
        return b if not b.pops or request.headers.get(POP_HEADER, "") in b.pops else self.healthy

    def draw(self, rid: str, attempt: int) -> random.Random:
        """The random stream of one attempt of one request at this origin."""
        return random.Random(f"request:{self.seed}:{self.name}:{rid}:{attempt}")

    def _rng(self, request: web.Request) -> random.Random:
        rid = request.headers.get(REQUEST_HEADER, "")
        self._attempts[rid] += 1
        return self.draw(rid, self._attempts[rid])

    def _hit(self, path: str) -> bool:
        ttl = self.spec.cache_ttl_s
        if ttl is None or path.startswith(UNCACHEABLE_PREFIX):
            return False
        last = self._cached.get(path)
        now = time.monotonic()
        if last is not None and now - last <= ttl:
            self._cached[path] = now
            return True
        return False

    def work_s(self, rng: random.Random, b: Behaviour, path: str, hit: bool) -> float:
        """Seconds of work for a request: time to first byte plus its backend work."""
        seconds = b.p50_ms / 1000 * math.exp(rng.gauss(0.0, SIGMA))
        if path.startswith(UNCACHEABLE_PREFIX):
            return seconds + self.spec.api_ms / 1000 * math.exp(rng.gauss(0.0, SIGMA))
        if self.spec.cache_ttl_s is not None and not hit:
            return seconds + self.spec.miss_ms / 1000 * math.exp(rng.gauss(0.0, SIGMA))
        return seconds

    async def _handle(self, request: web.Request, host: int) -> web.StreamResponse:
        headers = {"x-origin": self.name}
        rid = request.headers.get(REQUEST_HEADER, "")
        if request.path == SHALLOW_HEALTH or not rid:
            self.probes[request.path] += 1
        if request.path == SHALLOW_HEALTH:
            return web.Response(text=f"{self.name}\n", headers=headers)
        attempt = Attempt(rid, self.name, host, time.monotonic(),
                          mirror=request.host.partition(":")[0].endswith(MIRROR_SUFFIX))
        if rid:
            self.attempts.append(attempt)
        transport = request.transport
        if transport is not None and transport not in self._connections:
            cap = self.spec.max_connections
            if cap and self.stats().connections >= cap:
                self.refused += 1
                attempt.end, attempt.result = attempt.arrive, REFUSED
                return web.Response(status=503, text="too many connections\n",
                                    headers={**headers, "connection": "close"})
            self._connections.add(transport)
            setup = self.spec.connect_ms / 1000
        else:
            setup = 0.0
        self.requests[request.headers.get("x-ballast-tier", "")] += 1
        rng = self._rng(request)
        b = self._now(request)
        if self._slots is not None:
            if self._slots.locked() and self.waiting >= self.spec.max_waiting:
                self.overloaded += 1
                attempt.end, attempt.result = attempt.arrive, OVERLOADED
                return web.Response(status=503, text="overloaded\n", headers=headers)
            self.waiting += 1
            try:
                await self._slots.acquire()  # a client that leaves here leaves the line
            except asyncio.CancelledError:
                attempt.end, attempt.result = time.monotonic(), LEFT
                raise
            finally:
                self.waiting -= 1
        return await self._work(request, rng, b, headers, setup, attempt)

    async def _work(self, request: web.Request, rng: random.Random, b: Behaviour,
                    headers: dict[str, str], setup: float, attempt: Attempt) -> web.Response:
        hit = self._hit(request.path)
        cacheable = self.spec.cache_ttl_s is not None and not request.path.startswith(
            UNCACHEABLE_PREFIX)
        if cacheable:
            self.hits += hit
            self.misses += not hit
        seconds = setup + self.work_s(rng, b, request.path, hit)
        failed = rng.random() < b.error_rate
        self.working += 1
        started = attempt.start = time.monotonic()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            # the client left: the work goes on for at most abandon_after_s, holding its worker
            self.abandoned += 1
            attempt.result = ABANDONED
            rest = min(seconds - (time.monotonic() - started), self.spec.abandon_after_s)
            task = asyncio.get_running_loop().create_task(self._finish(max(0.0, rest),
                                                                       attempt))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
        self._done()
        attempt.end = time.monotonic()
        attempt.result = INJECTED if failed else ANSWERED
        if failed:
            return web.Response(status=500, text="injected\n", headers=headers)
        if cacheable and not hit:
            self._cached[request.path] = time.monotonic()
        return web.Response(text=f"{self.name} {request.path}\n", headers=headers)

    def _done(self) -> None:
        self.working -= 1
        if self._slots is not None:
            self._slots.release()

    async def _finish(self, seconds: float, attempt: Attempt) -> None:
        try:
            await asyncio.sleep(seconds)
        finally:
            self._done()
            attempt.end = time.monotonic()

    async def start(self) -> ScriptedOrigin:
        for host, port in enumerate(self.ports):
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", partial(self._handle, host=host))
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)
        return self

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
