"""The Prometheus source against a real Prometheus scraping a real Envoy 1.40, next to the sink."""

from __future__ import annotations

import asyncio
import time

import pytest

from control_plane.observe.prometheus import PrometheusSource
from control_plane.observe.source import wall_ms
from harness.demo_origin import Fault
from harness.eventually import eventually
from tests.support.metrics_sink import running_sink
from tests.support.observe_fleet import edge_fleet
from tests.support.prometheus import PrometheusServer, prometheus_binary

pytestmark = [
    pytest.mark.envoy,
    pytest.mark.prometheus,
    pytest.mark.timeout(120),
    pytest.mark.skipif(prometheus_binary() is None, reason="prometheus binary not installed"),
]


async def test_prometheus_source_matches_the_origins_and_the_sink():
    async with running_sink() as (store, port), edge_fleet(port) as fleet:
        prometheus = await asyncio.to_thread(
            PrometheusServer([fleet.envoy.admin_port]).start
        )
        try:
            fleet.primary.set_fault(Fault(error_rate=0.5))
            fleet.secondary.set_fault(Fault(latency_ms=200))
            await fleet.traffic(8, concurrency=2)  # creates the zone series in Envoy
            source = PrometheusSource(prometheus.url)
            # Prometheus answers its first sample only after ~5 s (docs/architecture.md)
            await eventually(lambda: zone_series_shown(source), 20,
                             "Prometheus shows the zone series", interval=0.5)
            primary_before = (fleet.primary.total, fleet.primary.errors)
            secondary_before = fleet.secondary.total
            start = wall_ms()
            for _ in range(12):  # a steady trickle, so Prometheus sees each series early
                await fleet.traffic(10, concurrency=5)
                await asyncio.sleep(0.3)
            # one more Envoy stats flush (every 1 s: histograms), then a scrape of it
            flushed = time.time() + 1.0
            await eventually(lambda: prometheus.scraped_since(flushed), 10,
                             "a scrape after Envoy's next stats flush", in_thread=True,
                             interval=0.2)
            now = wall_ms()
            signals = await source.window(now, now - start + 2000)
            sink = await store.window(now, now - start + 2000)
            tiers = await source.tier_pending(now, now - start + 2000)
        finally:
            await asyncio.to_thread(prometheus.stop)

    shop = signals[("ewr", "shop")]
    primary, secondary = shop["primary"], shop["secondary"]
    sent_primary = fleet.primary.total - primary_before[0]
    errors_primary = fleet.primary.errors - primary_before[1]
    sent_secondary = fleet.secondary.total - secondary_before
    assert sent_primary + sent_secondary == 120
    # increase() extrapolates to the window edges: close to, not exactly, the origin's count
    assert primary.requests == pytest.approx(sent_primary, rel=0.25)
    assert secondary.requests == pytest.approx(sent_secondary, rel=0.25)
    assert primary.errors_5xx == pytest.approx(errors_primary, rel=0.25)
    assert secondary.errors_5xx == 0
    assert primary.p95_ms is not None and primary.p95_ms < 50
    assert secondary.p50_ms is not None and 100 <= secondary.p50_ms <= 250
    assert secondary.p50_ms > 4 * primary.p95_ms
    # the observations behind the quantiles (no retries here: one per request) and the p95's
    # lower confidence bound, as the sink gives them (decide/evidence.py reads both)
    assert primary.latency_samples == pytest.approx(sent_primary, rel=0.25)
    assert secondary.latency_samples == pytest.approx(sent_secondary, rel=0.25)
    assert secondary.p95_low_ms is not None and secondary.p95_ms is not None
    assert 100 <= secondary.p95_low_ms <= secondary.p95_ms
    assert primary.pending_active == 0.0 and primary.queue_overflow == 0
    assert now - primary.observed_at_ms < 3000
    # per-tier pending (tier actions): the edge fleet's tier cluster, nothing queued
    shop_tiers = tiers[("ewr", "shop")]
    assert "critical" in shop_tiers
    assert all(t.pending_max == 0 and now - t.observed_at_ms < 5000 for t in shop_tiers.values())
    # the sink saw the same traffic exactly
    sink_shop = sink[("ewr", "shop")]
    assert sink_shop["primary"].requests == sent_primary
    assert sink_shop["primary"].errors_5xx == errors_primary
    assert sink_shop["secondary"].requests == sent_secondary


async def zone_series_shown(source: PrometheusSource) -> bool:
    now = wall_ms()
    signals = await source.window(now, 5000)
    return len(signals.get(("ewr", "shop"), {})) == 2
