"""Active probes against real HTTP origins on loopback, and merging them into the signals."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import HealthCheck
from control_plane.observe.combine import CombinedSource
from control_plane.observe.probes import Prober, ProbeTarget, success_share
from control_plane.observe.source import Signals, wall_ms
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import free_port
from harness.eventually import eventually

pytestmark = pytest.mark.timeout(30)

FAST = HealthCheck(interval_ms=200, connect_timeout_ms=500, read_timeout_ms=300)


def target(name: str, port: int) -> ProbeTarget:
    return ProbeTarget("shop", name, f"http://127.0.0.1:{port}", FAST)


async def test_probes_tell_a_healthy_from_a_failing_and_a_slow_and_a_dead_origin():
    healthy = await DemoOrigin("primary", free_port()).start()
    failing = await DemoOrigin("secondary", free_port()).start()
    slow = await DemoOrigin("tertiary", free_port()).start()
    failing.set_fault(Fault(fail_health=True, status=503))
    slow.set_fault(Fault(latency_ms=1000))  # beyond the 300 ms read timeout
    prober = Prober(
        [target("primary", healthy.port), target("secondary", failing.port),
         target("tertiary", slow.port), target("dead", free_port())],
        interval_ms=200,
    )
    start = wall_ms()
    task = asyncio.create_task(prober.run())
    names = ("primary", "secondary", "tertiary", "dead")

    def rounds_done() -> bool:  # three rounds of both paths for every origin
        return all(len([r for r in prober.results("shop", name) if r[0] > start]) >= 6
                   for name in names)

    try:
        await eventually(rounds_done, 20, "three probe rounds of every origin")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for origin in (healthy, failing, slow):
            await origin.stop()
    now = wall_ms()
    window = now - start
    assert prober.share("shop", "primary", now, window) == 1.0
    assert prober.share("shop", "secondary", now, window) == 0.0
    assert prober.share("shop", "tertiary", now, window) == 0.0
    assert prober.share("shop", "dead", now, window) == 0.0
    assert prober.share("shop", "unknown", now, window) is None
    rounds = len([r for r in prober.results("shop", "primary") if r[0] > start]) // 2
    assert 3 <= rounds <= window / 200 + 1  # every 200 ms, both paths
    # each passing probe is timed (the fill-in latency of a thin window); failed ones are not
    timed = prober.latencies("shop", "primary", now, window)
    assert len(timed) == prober.count("shop", "primary", now, window) >= 2 * rounds
    assert all(0 < ms < window for ms in timed), timed
    assert prober.latencies("shop", "tertiary", now, window) == []
    # the rolling window forgets old results
    assert prober.share("shop", "primary", now + 60_000, 1000) is None


def test_success_share_is_the_share_inside_the_window():
    results = [(1000, False), (2000, True), (3000, True), (4000, False)]
    assert success_share(results, 4000, 3000) == pytest.approx(2 / 3)
    assert success_share(results, 4000, 10_000) == 0.5
    assert success_share(results, 9000, 1000) is None


class Fixed:
    def __init__(self, signals: Signals) -> None:
        self.signals = signals

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return self.signals


def passive(requests: int, at: int) -> OriginSignals:
    return OriginSignals(requests, 0, 0, 10.0, 20.0, 3.0, 1, None, at)


async def test_combined_source_fills_probe_success_per_origin_for_every_pop():
    prober = Prober([target("primary", 1), target("secondary", 2)], interval_ms=1000)
    prober.record("shop", "primary", 900, True)
    prober.record("shop", "primary", 950, False)
    prober.record("shop", "secondary", 990, True)
    source = CombinedSource(
        Fixed({("ewr", "shop"): {"primary": passive(10, 800)},
               ("sjc", "shop"): {"primary": passive(5, 700), "secondary": passive(1, 990)}}),
        prober,
    )
    signals = await source.window(1000, 500)
    assert signals["ewr", "shop"]["primary"].probe_success == 0.5
    assert signals["ewr", "shop"]["primary"].requests == 10
    probe_only = signals["ewr", "shop"]["secondary"]
    assert probe_only.probe_success == 1.0 and probe_only.requests == 0
    assert probe_only.p95_ms is None and probe_only.observed_at_ms == 800
    assert signals["sjc", "shop"]["secondary"].probe_success == 1.0
    assert signals["sjc", "shop"]["secondary"].requests == 1


def test_retarget_keeps_unchanged_results_and_drops_changed_ones() -> None:
    check = HealthCheck()
    a = ProbeTarget("shop", "primary", "http://127.0.0.1:1", check)
    b = ProbeTarget("shop", "secondary", "http://127.0.0.1:2", check)
    prober = Prober([a, b], clock=lambda: 1000)
    prober.record("shop", "primary", 1000, True)
    prober.record("shop", "secondary", 1000, False)
    moved = ProbeTarget("shop", "secondary", "http://127.0.0.1:3", check)
    prober.retarget([a, moved])
    assert prober.results("shop", "primary") == ((1000, True),)
    assert prober.results("shop", "secondary") == ()
    assert prober.targets == [a, moved]


async def test_probes_fill_in_the_latency_of_a_thin_window():
    prober = Prober([target("primary", 1), target("secondary", 2)], interval_ms=1000)
    for i in range(12):  # a 30 s window of 5 s rounds, two paths each
        prober.record("shop", "secondary", 100 + i, True, latency_ms=float(i + 1))
        prober.record("shop", "primary", 100 + i, True, latency_ms=500.0)
    prober.record("shop", "secondary", 150, False, latency_ms=4000.0)  # failed: not timed
    source = CombinedSource(
        Fixed({("ewr", "shop"): {"primary": passive(1000, 800), "secondary": passive(6, 800)}}),
        prober,
    )
    signals = await source.window(1000, 30_000)
    thin = signals["ewr", "shop"]["secondary"]
    assert (thin.probes, thin.latency_samples, thin.latency_from) == (13, 12, "probes")
    assert (thin.p50_ms, thin.p95_ms, thin.p95_low_ms) == (6.0, 12.0, 9.0)
    busy = signals["ewr", "shop"]["primary"]  # 1000 passive samples outweigh 12 probes
    assert (busy.probes, busy.p50_ms, busy.latency_from) == (12, 10.0, "whole_request")
