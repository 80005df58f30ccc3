"""One edge Envoy 1.40 of PoP `ewr` running Ballast's translation of group `shop` (primary,
standby) at fixed weights, streaming its stats (metrics_service and OTLP host stats) and every
request's access-log entry to Ballast's own sinks, in front of two origins that record each
attempt they serve (attempt number from `x-envoy-attempt-count`, tier, status, and their own
service time). For the per-origin attribution, retry and pool-wait tests.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from control_plane.app.envoy_process import EnvoyProcess, find_envoy, free_port
from control_plane.desired.model import AccessLog, Desired, Origin
from control_plane.observe.access_log import AccessLogStore, add_access_log_service
from control_plane.observe.sink import SinkStore, add_metrics_service
from control_plane.observe.source import wall_ms
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities
from tests.support.models import example_desired, shop_group
from tests.support.replicas import until

# A request's path and headers per tier, as the example classification sorts them.
TIER_REQUESTS: dict[str, tuple[str, dict[str, str]]] = {
    "critical": ("/api/checkout", {}),
    "normal": ("/item", {"x-purpose": "prefetch"}),
    "background": ("/_next/image", {}),
}


@dataclass(frozen=True)
class Attempt:
    """One attempt as the origin saw it."""

    origin: str
    tier: str
    number: int  # x-envoy-attempt-count: 1 the first attempt, 2+ a retry or hedge
    status: int
    served_ms: float  # the origin's own time: request handed to it -> answer ready


@dataclass
class AttemptOrigin:
    """Answers 503 to a share `fail_rate` of its requests (exactly every 1/rate-th) after
    `fail_ms`, the others 200 after the next of `answer_ms` (cycled)."""

    name: str
    attempts: list[Attempt]
    fail_rate: float = 0.0
    fail_ms: float = 0.0
    answer_ms: Sequence[float] = (1.0,)
    port: int = 0
    _served: int = 0
    _runner: web.AppRunner | None = None
    _cycle: Any = field(default=None, repr=False)

    async def start(self) -> AttemptOrigin:
        self._cycle = itertools.cycle(self.answer_ms)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        before = math.floor(self._served * self.fail_rate)
        self._served += 1
        fail = math.floor(self._served * self.fail_rate) > before
        await asyncio.sleep((self.fail_ms if fail else next(self._cycle)) / 1000)
        status = 503 if fail else 200
        self.attempts.append(Attempt(
            self.name, request.headers.get("x-ballast-tier", ""),
            int(request.headers.get("x-envoy-attempt-count") or 1), status,
            (time.perf_counter() - started) * 1000))
        return web.Response(status=status, text=f"{self.name}\n")


@dataclass
class AttemptFleet:
    desired: Desired
    listen_port: int
    envoy: EnvoyProcess
    primary: AttemptOrigin
    standby: AttemptOrigin
    attempts: list[Attempt]
    sink: SinkStore
    access_logs: AccessLogStore

    async def send(self, tier: str, requests: int, concurrency: int = 1) -> list[int]:
        """`requests` GETs classified into `tier`, at most `concurrency` at a time: statuses."""
        path, headers = TIER_REQUESTS[tier]
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(i: int) -> int:
                async with gate, session.get(f"http://127.0.0.1:{self.listen_port}{path}/{i}",
                                             headers=headers) as response:
                    await response.read()
                    return response.status

            return list(await asyncio.gather(*(one(i) for i in range(requests))))


def fleet_desired(primary: int, standby: int) -> Desired:
    group = shop_group(Origin("primary", "127.0.0.1", primary),
                       Origin("standby", "127.0.0.1", standby))
    group = replace(group, preference={"ewr": ("primary", "standby"),
                                       "sjc": ("primary", "standby")})
    desired = replace(example_desired(group), access_log=AccessLog(sample_rate=1.0))
    listener = replace(desired.listeners[0], port=free_port())
    return replace(desired, listeners=(listener,))


def fleet_bootstrap(desired: Desired, weights: dict[str, int], admin_port: int,
                    sink_port: int) -> dict[str, Any]:
    """Ballast's bootstrap with both stats sinks and access logs (`--metrics-sink`), flushing
    every second, with the PoP's translation inlined statically."""
    bootstrap = ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=sink_port,
                              admin_port=admin_port, stats_flush_interval_ms=1000,
                              metrics_sink=True)
    del bootstrap["dynamic_resources"]
    del bootstrap["layered_runtime"]  # its RTDS layer needs the ADS config
    static = static_bootstrap(translate_pop(desired, "ewr", {"shop": weights},
                                            Capabilities(access_log=True)))
    bootstrap["static_resources"]["clusters"].extend(static["static_resources"]["clusters"])
    bootstrap["static_resources"]["listeners"] = static["static_resources"]["listeners"]
    return bootstrap


@asynccontextmanager
async def attempt_fleet(weights: dict[str, int], primary: AttemptOrigin,
                        standby: AttemptOrigin) -> AsyncIterator[AttemptFleet]:
    """Envoy (ready) at `weights` in front of both origins (started here, stopped on exit)."""
    find_envoy()
    await primary.start()
    await standby.start()
    desired = fleet_desired(primary.port, standby.port)
    sink, access_logs = SinkStore(desired=desired), AccessLogStore(desired=desired)
    server = grpc.aio.server()
    add_metrics_service(server, sink)
    add_access_log_service(server, access_logs)
    sink_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    admin_port = free_port()
    envoy = EnvoyProcess(fleet_bootstrap(desired, weights, admin_port, sink_port), admin_port)
    try:
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready)
        # the first host-stats export is every counter's baseline: traffic starts after it
        await until(lambda: bool(sink.host_windows(0, wall_ms())), 20, "a host-stats export")
        yield AttemptFleet(desired, desired.listeners[0].port, envoy, primary, standby,
                           primary.attempts, sink, access_logs)
    finally:
        envoy.stop()
        await server.stop(None)
        await primary.stop()
        await standby.stop()
