"""A small HTTP origin for the demo fleet and the tests, with faults that can be switched on.

Every path answers 200 with `x-origin: <name>` and echoes the tier Envoy classified the request
into (`x-ballast-tier` in, `x-seen-tier` out). Faults are deterministic: with an error rate of
0.25 exactly every fourth request fails, so tests can assert on counts, not luck. A fault can
be limited to requests that came through some PoPs (Envoy adds `x-ballast-pop`), which is how a
regional problem between one PoP and an origin is simulated. Mirrored copies (Envoy's request
mirroring appends `-shadow` to the Host) are counted apart in `shadowed`. With a `ColdCache`, the
origin stands for a standby whose cache is cold (the secondary of the failover source's
incident): first fetches are slow, repeats fast, and a capacity cap refuses what it cannot take.
`POST /_ballast/fault` (JSON body with the fields of `Fault`) changes them over HTTP, which is how
`make run` lets an operator break an origin by hand.
`max_concurrency` caps the requests it works on at once (the rest wait inside the origin, as a
real origin's worker pool would): the concurrency-capped origin of the tier benchmarks.
`attempt_log` keeps each attempt with Envoy's request id, attempt number and PoP, so a test can tell
a hedge (sent while the first attempt was still unanswered) from a retry (sent after it failed).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, fields

from aiohttp import web

FAULT_PATH = "/_ballast/fault"
HEALTH_PATHS = frozenset({"/healthz", "/healthz/cacheable"})
SHADOW_SUFFIX = "-shadow"  # Envoy's mark on the Host of a mirrored request (before the port)
MAX_LOGGED_ATTEMPTS = 100_000  # `attempt_log` keeps the newest


@dataclass(frozen=True)
class Fault:
    error_rate: float = 0.0  # share of requests answered with `status`
    status: int = 503
    latency_ms: int = 0  # added before answering
    latency_rate: float = 1.0  # share of requests that get `latency_ms` (deterministic)
    fail_health: bool = False  # health paths answer `status` too
    pops: tuple[str, ...] = ()  # only requests through these PoPs (x-ballast-pop); () = all

    @classmethod
    def from_json(cls, data: object) -> Fault:
        if not isinstance(data, dict):
            raise ValueError("fault must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        fault = cls(**{**data, "pops": tuple(data.get("pops", ()))})
        if not 0.0 <= float(fault.error_rate) <= 1.0 or not 0.0 <= float(
                fault.latency_rate) <= 1.0:
            raise ValueError("error_rate and latency_rate must be within 0..1")
        if not 100 <= int(fault.status) <= 599 or int(fault.latency_ms) < 0:
            raise ValueError("status must be 100..599 and latency_ms >= 0")
        return fault


def is_shadow_host(host: str) -> bool:
    """Envoy marks the Host of a mirrored copy before its port: `127.0.0.1-shadow:10000`."""
    name, colon, port = host.rpartition(":")
    if not colon or not port.isdigit():
        name = host
    return name.endswith(SHADOW_SUFFIX)


@dataclass(frozen=True)
class ColdCache:
    """An origin behind a cache that starts cold: the first fetch of each path costs
    `miss_latency_ms`, repeats are answered at once; more than `capacity` requests in flight
    are refused at once with 503 (0: no cap). Health paths are neither cached nor capped."""

    miss_latency_ms: int = 0
    capacity: int = 0


@dataclass(frozen=True)
class Attempt:
    """One attempt the origin answered (health paths left out): Envoy's `x-request-id` (the
    same on every attempt of a request), its `x-envoy-attempt-count`, the tier, when it arrived
    and when the origin was done with it (time.monotonic()), and the status it answered."""

    request_id: str
    number: int
    tier: str
    arrived: float
    done: float
    status: int
    pop: str = ""  # the PoP it came through (`x-ballast-pop`)


@dataclass(frozen=True)
class CacheAnswer:
    at: float  # time.monotonic() when answered
    shadow: bool  # a mirrored copy
    status: int
    ms: float  # time to answer


class DemoOrigin:
    def __init__(
        self, name: str, port: int, host: str = "127.0.0.1", max_concurrency: int = 0,
        cache: ColdCache | None = None,
    ) -> None:
        self.name = name
        self.cache = cache
        self.cached: set[str] = set()  # paths fetched once (with `cache`)
        self.fetching = 0  # requests in flight through `cache`
        self.refused = 0  # requests over `cache.capacity`, answered 503
        self.answers: list[CacheAnswer] = []  # each request answered through `cache`
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency > 0 else None
        self.in_flight = 0
        self.in_flight_peak = 0
        self.connections: set[object] = set()  # every TCP connection a request came on
        self.host = host
        self.port = port
        self.fault = Fault()
        self.requests: Counter[str] = Counter()  # per tier seen
        self.shadowed = 0  # of those, mirrored copies (Envoy appends `-shadow` to their Host)
        self.errors = 0
        self.attempt_log: deque[Attempt] = deque(maxlen=MAX_LOGGED_ATTEMPTS)
        self._served = 0
        self._delayed = 0
        self._runner: web.AppRunner | None = None

    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        self._served = 0
        self._delayed = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def _should_fail(self) -> bool:
        rate = self.fault.error_rate
        before = math.floor(self._served * rate)
        self._served += 1
        return math.floor(self._served * rate) > before

    def _should_delay(self) -> bool:
        rate = self.fault.latency_rate
        before = math.floor(self._delayed * rate)
        self._delayed += 1
        return math.floor(self._delayed * rate) > before

    def _faulty(self, request: web.Request) -> bool:
        pops = self.fault.pops
        return not pops or request.headers.get("x-ballast-pop", "") in pops

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path == FAULT_PATH:
            return await self._handle_fault(request)
        self.connections.add(request.transport)
        if self._slots is None:
            return await self._counted(request)
        async with self._slots:
            return await self._counted(request)

    async def _counted(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)
        arrived = time.monotonic()
        try:
            response = await self._answer(request)
        finally:
            self.in_flight -= 1
        if request.path not in HEALTH_PATHS:
            count = request.headers.get("x-envoy-attempt-count", "1")
            self.attempt_log.append(Attempt(
                request.headers.get("x-request-id", "")[:64],
                int(count) if count.isdigit() and len(count) < 4 else 1,
                request.headers.get("x-ballast-tier", "")[:64], arrived, time.monotonic(),
                response.status, request.headers.get("x-ballast-pop", "")[:64]))
        return response

    def in_flight_peak_reset(self) -> int:
        """The peak of requests in work at once since the last reset (then reset)."""
        peak, self.in_flight_peak = self.in_flight_peak, self.in_flight
        return peak

    async def _answer(self, request: web.Request) -> web.Response:
        faulty = self._faulty(request)
        if self.fault.latency_ms and faulty and self._should_delay():
            await asyncio.sleep(self.fault.latency_ms / 1000)
        headers = {"x-origin": self.name}
        if request.path in HEALTH_PATHS:
            status = self.fault.status if self.fault.fail_health else 200
            if request.path == "/healthz/cacheable":
                headers["cache-control"] = "public, max-age=5"
            return web.Response(status=status, text=f"{self.name}\n", headers=headers)
        tier = request.headers.get("x-ballast-tier", "")
        headers["x-seen-tier"] = tier
        self.requests[tier] += 1
        if is_shadow_host(request.host):
            self.shadowed += 1
        if self.cache is not None:
            return await self._through_cache(request.path, is_shadow_host(request.host), headers)
        if faulty and self._should_fail():
            self.errors += 1
            return web.Response(status=self.fault.status, text="injected\n", headers=headers)
        body = json.dumps({"origin": self.name, "path": request.path, "tier": tier})
        return web.Response(text=body + "\n", content_type="application/json", headers=headers)

    async def _through_cache(
        self, path: str, shadow: bool, headers: dict[str, str]
    ) -> web.Response:
        cache = self.cache
        assert cache is not None
        started = time.monotonic()
        if cache.capacity and self.fetching >= cache.capacity:
            self.refused += 1
            self.errors += 1
            self.answers.append(CacheAnswer(started, shadow, 503, 0.0))
            return web.Response(status=503, text="over capacity\n", headers=headers)
        self.fetching += 1
        try:
            headers["x-cache"] = "hit" if path in self.cached else "miss"
            if path not in self.cached:
                await asyncio.sleep(cache.miss_latency_ms / 1000)
                self.cached.add(path)
        finally:
            self.fetching -= 1
        now = time.monotonic()
        self.answers.append(CacheAnswer(now, shadow, 200, (now - started) * 1000))
        return web.Response(text=f"{self.name} {path}\n", headers=headers)

    async def _handle_fault(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response(asdict(self.fault))
        try:
            self.set_fault(Fault.from_json(await request.json()))
        except (ValueError, TypeError) as err:
            return web.json_response({"error": str(err)}, status=400)
        return web.json_response(asdict(self.fault))

    async def start(self) -> DemoOrigin:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
