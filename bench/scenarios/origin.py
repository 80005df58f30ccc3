"""A loopback origin whose behaviour follows the scenario's time script.

Built on the demo origin (same health paths, `x-origin` header, tier echo, fault endpoint), with
what an incident needs on top: a latency distribution (log-normal around a p50, seeded), a 5xx
rate drawn per request, a cold cache (the first request for a path pays `cold_ms`, as a cache
miss that goes to the origin's own backend), a worker cap (`max_concurrency`) with a bounded wait
line behind it (beyond `max_waiting` the origin answers 503 at once, as an overloaded origin
sheds), and faults limited to requests through some PoPs (`x-ballast-pop`). Health checks see the
same latency and error rate as requests, so an active check notices a slow bleed.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

from aiohttp import web

from harness.demo_origin import FAULT_PATH, HEALTH_PATHS, DemoOrigin

POP_HEADER = "x-ballast-pop"
SIGMA = 0.35  # log-normal spread: p95 ≈ 1.8 x p50


@dataclass(frozen=True)
class Behaviour:
    """How the origin answers at one moment of the script."""

    p50_ms: float = 30.0
    error_rate: float = 0.0
    pops: tuple[str, ...] = ()  # the behaviour applies to requests through these PoPs; () = all


class ScriptedOrigin(DemoOrigin):
    def __init__(
        self, name: str, port: int, *, seed: int, max_concurrency: int = 0, max_waiting: int = 0,
        cold_ms: float = 0.0, healthy_p50_ms: float = 30.0,
    ) -> None:
        super().__init__(name, port, max_concurrency=max_concurrency)
        self.behaviour = Behaviour(p50_ms=healthy_p50_ms)
        self.healthy = Behaviour(p50_ms=healthy_p50_ms)
        self.cold_ms = cold_ms
        self.max_waiting = max_waiting
        self.waiting = 0
        self.overloaded = 0
        self._rng = random.Random(seed)
        self._warm: set[str] = set()

    def warm(self, paths: list[str]) -> None:
        """Paths already in the origin's cache when the run starts."""
        self._warm.update(paths)

    @property
    def load(self) -> int:
        """Requests inside the origin: working plus waiting for a worker."""
        return self.in_flight + self.waiting

    def _now(self, request: web.Request) -> Behaviour:
        b = self.behaviour
        return b if not b.pops or request.headers.get(POP_HEADER, "") in b.pops else self.healthy

    def _latency_s(self, b: Behaviour, path: str) -> float:
        seconds = b.p50_ms / 1000 * math.exp(self._rng.gauss(0.0, SIGMA))
        if self.cold_ms and path not in self._warm:
            self._warm.add(path)
            seconds += self.cold_ms / 1000
        return seconds

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == FAULT_PATH:
            return await self._handle_fault(request)
        b = self._now(request)
        headers = {"x-origin": self.name}
        if request.path in HEALTH_PATHS:
            await asyncio.sleep(b.p50_ms / 1000 * math.exp(self._rng.gauss(0.0, SIGMA)))
            status = 503 if self._rng.random() < b.error_rate else 200
            return web.Response(status=status, text=f"{self.name}\n", headers=headers)
        tier = request.headers.get("x-ballast-tier", "")
        self.requests[tier] += 1
        if self._slots is None:
            self.in_flight += 1
            try:
                return await self._work(request, b, headers)
            finally:
                self.in_flight -= 1
        if self._slots.locked() and self.waiting >= self.max_waiting:
            self.overloaded += 1
            return web.Response(status=503, text="overloaded\n", headers=headers)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)
        try:
            return await self._work(request, b, headers)
        finally:
            self.in_flight -= 1
            self._slots.release()

    async def _work(self, request: web.Request, b: Behaviour, headers: dict[str, str]
                    ) -> web.Response:
        await asyncio.sleep(self._latency_s(b, request.path))
        if self._rng.random() < b.error_rate:
            self.errors += 1
            return web.Response(status=500, text="injected\n", headers=headers)
        return web.Response(text=f"{self.name} {request.path}\n", headers=headers)
