"""The measured pool wait through a real Envoy 1.40: its sampled gRPC access log reaches
Ballast's AccessLogService, and with a concurrency-capped origin the wait Ballast computes
tracks the extra latency the clients see."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace

import aiohttp
import grpc
import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.decide.signals import TierPending
from control_plane.desired.model import AccessLog, Desired
from control_plane.observe.access_log import AccessLogStore, WithWaits, add_access_log_service
from control_plane.observe.source import TierSignals
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.models import example_desired, shop_group

pytestmark = pytest.mark.envoy

ORIGIN_MS = 100
CAP = 10  # the origin's hard cap = max_origin_concurrency: critical gets ceil(70 % x 10) = 7


def capped_fleet(origin_port: int, sample_rate: float = 1.0) -> Desired:
    group = shop_group()
    origins = tuple(replace(o, port=origin_port) for o in group.origins)
    group = replace(group, origins=origins, max_origin_concurrency=CAP)
    return replace(example_desired(group), access_log=AccessLog(sample_rate=sample_rate))


def edge_bootstrap(desired: Desired, admin_port: int, sink_port: int) -> dict:
    """Ballast's bootstrap (`--metrics-sink`: the node asks for access logs) with the PoP's
    translation for that node inlined statically."""
    bootstrap = ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=sink_port,
                              admin_port=admin_port, metrics_sink=True)
    del bootstrap["dynamic_resources"]
    del bootstrap["layered_runtime"]  # its RTDS layer needs the ADS config
    bootstrap.pop("stats_sinks")
    assert bootstrap["node"]["metadata"] == {"ballast_access_log": True}
    static = static_bootstrap(translate_pop(desired, "ewr", Capabilities(access_log=True),
                                            PopIntent(weights={"shop": {"primary": 100,
                                                                      "secondary": 0}})))
    bootstrap["static_resources"]["clusters"].extend(static["static_resources"]["clusters"])
    bootstrap["static_resources"]["listeners"] = static["static_resources"]["listeners"]
    return bootstrap


async def clients(url: str, count: int, seconds: float) -> list[float]:
    """`count` clients in closed loops on `url` for `seconds`; each answer's latency in ms."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def loop(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
                assert response.status == 200
            latencies.append((time.perf_counter() - started) * 1000)

    connector = aiohttp.TCPConnector(limit=count)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(loop(session) for _ in range(count)))
    return latencies


async def measured(
    store: AccessLogStore, url: str, count: int, seconds: float
) -> tuple[list[float], list[float], int]:
    """Client latencies of one run, the pool waits Ballast received for it, when it started."""
    started_ms, before = time.time_ns() // 1_000_000, store.received
    latencies = await clients(url, count, seconds)
    expected = before + len(latencies)
    await eventually(lambda: store.received >= expected, 10, "every request's access log entry")
    now_ms = time.time_ns() // 1_000_000
    found = store.samples(now_ms, now_ms - started_ms).get(("ewr", "shop.critical"), [])
    return latencies, [s.wait_ms for s in found], started_ms


class NoGauges:
    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        return {("ewr", "shop"): {"critical": TierPending(3, now_ms)}}


async def test_measured_wait_tracks_the_extra_latency_clients_see() -> None:
    find_envoy()
    origin = await DemoOrigin("primary", free_port(), max_concurrency=CAP).start()
    origin.set_fault(Fault(latency_ms=ORIGIN_MS))
    store = AccessLogStore()
    server = grpc.aio.server()
    add_access_log_service(server, store)
    sink_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    desired = capped_fleet(origin.port)
    admin_port = free_port()
    try:
        with EnvoyProcess(edge_bootstrap(desired, admin_port, sink_port), admin_port) as envoy:
            envoy.wait_ready()
            url = f"http://127.0.0.1:{desired.listeners[0].port}/api/checkout"
            # unloaded: one client, nobody waits (the client's and origin's own time)
            alone, alone_waits, _ = await measured(store, url, 1, 1.5)
            # loaded: 21 clients on 7 critical slots, each request ~2 origin times in line
            loaded, loaded_waits, loaded_ms = await measured(store, url, 21, 4.0)
    finally:
        await server.stop(None)
        await origin.stop()
    assert origin.in_flight_peak <= 7  # Envoy's critical breaker held the line, not the origin
    for latencies, waits in ((alone, alone_waits), (loaded, loaded_waits)):
        assert len(waits) >= 0.9 * len(latencies), (len(waits), len(latencies))
    assert statistics.mean(alone_waits) < 10
    # the extra latency clients see under load is the wait measured from the access log
    extra = statistics.mean(loaded) - statistics.mean(alone)
    waited = statistics.mean(loaded_waits) - statistics.mean(alone_waits)
    assert extra > 100, "the load must make clients wait"
    assert abs(waited - extra) < max(25.0, 0.15 * extra), (waited, extra)
    now_ms = time.time_ns() // 1_000_000
    readings = await WithWaits(NoGauges(), store).tier_pending(now_ms, now_ms - loaded_ms)
    wait = readings[("ewr", "shop")]["critical"].wait
    assert wait is not None and wait.p95_ms > 35 and wait.samples == len(loaded_waits)
