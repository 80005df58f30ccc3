"""Per-origin attempts through retries: real Envoy 1.40 (Ballast's translation), real sinks.

Ballast's routes retry 5xx on another host, and Envoy does not charge retried attempts to the
zone `upstream_rq_<code>` stats, so a half-broken origin looks healthy there. The per-host stats
(`per_endpoint_stats`) count every attempt: the OTLP sink endpoint and Prometheus both read them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from control_plane.decide.signals import OriginSignals
from control_plane.observe.prometheus import PrometheusSource
from control_plane.observe.source import Signals, wall_ms
from harness.demo_origin import Fault
from harness.eventually import eventually
from tests.support.metrics_sink import running_sink
from tests.support.observe_fleet import translated_fleet
from tests.support.prometheus import PrometheusServer, prometheus_binary

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]

WEIGHTS = {"primary": 45, "secondary": 45, "dead": 10}


def shop(signals: Signals) -> dict:
    return signals.get(("ewr", "shop"), {})


@pytest.mark.prometheus
@pytest.mark.skipif(prometheus_binary() is None, reason="prometheus binary not installed")
async def test_retried_errors_reach_the_sink_and_prometheus_per_origin():
    async with running_sink() as (store, port), translated_fleet(port, WEIGHTS) as fleet:
        assert fleet.desired is not None
        store.update_served(fleet.desired, {})  # the hot-reload path
        prometheus = await asyncio.to_thread(PrometheusServer([fleet.envoy.admin_port]).start)
        try:
            source = PrometheusSource(prometheus.url, desired=fleet.desired)
            fleet.primary.set_fault(Fault(error_rate=0.5))
            await fleet.traffic(6, concurrency=2)

            async def host_series() -> bool:
                now = wall_ms()
                origins = shop(await source.window(now, 5000))
                return {"primary", "secondary", "dead"} <= set(origins)

            await eventually(host_series, 20, "Prometheus shows the host series", interval=0.3)
            before = (fleet.primary.total, fleet.primary.errors, fleet.secondary.total)
            start = wall_ms()
            statuses: list[int] = []
            for _ in range(10):  # a steady trickle, so each scrape sees growth
                statuses += await fleet.traffic(10, concurrency=2)
                await asyncio.sleep(0.3)
            # one more Envoy stats flush (every 1 s: histograms), then a scrape of it
            flushed = time.time() + 1.0
            await eventually(lambda: prometheus.scraped_since(flushed), 10,
                             "a scrape after Envoy's next stats flush", in_thread=True,
                             interval=0.2)
            now = wall_ms()
            sink = shop(await store.window(now, now - start + 500))
            prom = shop(await source.window(now, now - start + 2000))
        finally:
            await asyncio.to_thread(prometheus.stop)

    sent_primary = fleet.primary.total - before[0]
    errors_primary = fleet.primary.errors - before[1]
    sent_secondary = fleet.secondary.total - before[2]
    assert errors_primary >= 20
    # the retries hid most failures from the clients: that is the bug being fixed
    assert statuses.count(200) >= 90 and statuses.count(503) < errors_primary

    # the sink (OTLP host stats, deltas): exactly the origins' own counts
    primary, secondary, dead = sink["primary"], sink["secondary"], sink["dead"]
    assert (primary.requests, primary.errors_5xx) == (sent_primary, errors_primary)
    assert (secondary.requests, secondary.errors_5xx) == (sent_secondary, 0)
    assert primary.error_rate == pytest.approx(0.5, abs=0.05)
    assert secondary.error_rate == 0.0 and secondary.connect_failures == 0
    assert dead.connect_failures > 0 and dead.error_rate == 1.0
    assert primary.p50_ms is not None and secondary.p50_ms is not None  # zone histogram
    assert now - primary.observed_at_ms < 3000

    # Prometheus: increase() extrapolates to the window edges, so close to, not exactly
    primary, secondary, dead = prom["primary"], prom["secondary"], prom["dead"]
    assert primary.requests == pytest.approx(sent_primary, rel=0.25)
    assert primary.errors_5xx == pytest.approx(errors_primary, rel=0.25)
    assert secondary.requests == pytest.approx(sent_secondary, rel=0.25)
    assert secondary.errors_5xx == 0 and secondary.connect_failures == 0
    assert dead.connect_failures > 0 and dead.error_rate == 1.0
    assert primary.p50_ms is not None
    # the latency's own sample count (the zone histogram's observations: one per request, at
    # the origin that answered last), not the attempts: every client request once, and the
    # primary's attempts retried elsewhere are none of its observations
    observed = [prom[name].latency_samples for name in ("primary", "secondary", "dead")]
    assert all(count is not None for count in observed), observed
    assert sum(count or 0 for count in observed) == pytest.approx(len(statuses), rel=0.25)
    assert primary.latency_samples is not None and primary.latency_samples < primary.requests
    assert primary.p95_low_ms is not None and primary.p95_ms is not None
    assert primary.p95_low_ms <= primary.p95_ms


def _row(labels: dict[str, str], value: float) -> dict:
    return {"metric": labels, "value": [0, str(value)]}


def _buckets(counts: dict[str, float]) -> list[dict]:
    where = {"local_zone": "ewr", "ballast_group": "shop", "upstream_zone": "primary"}
    return [_row({**where, "le": le}, count) for le, count in counts.items()]


def test_a_prometheus_p95_of_too_few_observations_is_inconclusive() -> None:
    """Evidence on the Prometheus path as on the sink's: 40 attempts (enough for the 5xx
    verdict) but three latency observations, all slow, is no latency breach; 20 slow ones are.
    Before the count was read, the 40 attempts stood in for it and the three breached."""
    from control_plane.decide.evidence import judge
    from control_plane.desired.model import FailoverPolicy
    from control_plane.observe.prometheus import assemble

    zone = {"local_zone": "ewr", "ballast_cluster": "shop.critical", "upstream_zone": "primary"}
    counters = {"requests": [_row(zone, 40)], "errors_5xx": [_row(zone, 0)],
                "observed_at": [_row(zone, 5)]}
    policy = FailoverPolicy()
    few = assemble({**counters, "latency_buckets": _buckets(
        {"100": 0, "1000": 0, "5000": 3, "+Inf": 3})})[("ewr", "shop")]["primary"]
    assert few.requests == 40 and few.latency_samples == 3
    assert few.p95_ms is not None and few.p95_ms > policy.p95_threshold_ms
    judged = judge(few, policy)
    assert judged.verdict == "inconclusive" and judged.breaches == ()
    assert "latency: 3 samples < min_samples 10" in judged.notes
    many = assemble({**counters, "latency_buckets": _buckets(
        {"100": 0, "1000": 0, "5000": 20, "+Inf": 20})})[("ewr", "shop")]["primary"]
    assert many.latency_samples == 20 and many.p95_low_ms is not None
    assert many.p95_low_ms > policy.p95_threshold_ms
    assert judge(many, policy).breaches == (f"p95 {many.p95_ms:.0f} ms > 800 ms",)


def test_prometheus_latency_buckets_become_the_sinks_quantiles() -> None:
    """The bucket increases are read as the sink reads its histograms (`window.quantile`):
    made non-decreasing (increase() extrapolates each bucket alone), counted by +Inf, and
    without a +Inf bucket (no count) there is no latency; with no observation none either."""
    from control_plane.observe.prometheus import assemble

    zone = {"local_zone": "ewr", "ballast_cluster": "shop.critical", "upstream_zone": "primary"}
    counters = {"requests": [_row(zone, 10)], "errors_5xx": [_row(zone, 0)],
                "observed_at": [_row(zone, 5)]}

    def primary(counts: dict[str, float]) -> OriginSignals:
        results = {**counters, "latency_buckets": _buckets(counts)}
        return assemble(results)[("ewr", "shop")]["primary"]

    got = primary({"10": 6.0, "50": 5.9, "100": 10.2, "+Inf": 10.2})  # 5.9: extrapolated
    assert got.latency_samples == 10
    assert got.p50_ms == pytest.approx(10 * 5.1 / 6.0)  # rank 5.1 of 10.2, in the first bucket
    assert got.p95_ms == pytest.approx(50 + 50 * (0.95 * 10.2 - 6.0) / 4.2)
    none = primary({"10": 5.0, "100": 10.0})  # no +Inf
    assert (none.p50_ms, none.p95_ms, none.latency_samples) == (None, None, 0)
    idle = primary({"10": 0.0, "+Inf": 0.0})
    assert (idle.p50_ms, idle.p95_ms, idle.p95_low_ms, idle.latency_samples) == (
        None, None, None, 0)


def test_endpoint_origins_maps_every_tier_cluster_address() -> None:
    from control_plane.observe.endpoints import endpoint_address, endpoint_origins
    from harness.models import example_desired

    mapping = endpoint_origins(example_desired())
    assert mapping[("shop.critical", "127.0.0.1:8081")] == ("shop", "primary")
    assert mapping[("shop.background", "127.0.0.1:8082")] == ("shop", "secondary")
    assert len(mapping) == 3 * 2
    assert endpoint_address("::1", 443) == "[::1]:443"
    assert endpoint_origins(None) == {}


def test_host_rows_replace_zone_counters_and_unmapped_hosts_fall_back() -> None:
    from control_plane.observe.endpoints import served_endpoints
    from control_plane.observe.prometheus import assemble
    from harness.models import example_desired

    def row(labels: dict[str, str], value: float) -> dict:
        return {"metric": labels, "value": [0, str(value)]}

    zone = {"local_zone": "ewr", "ballast_cluster": "shop.critical", "upstream_zone": "primary"}
    host = {"ballast_pop": "ewr", "envoy_cluster_name": "shop.critical",
            "envoy_endpoint_address": "127.0.0.1:8081"}
    results = {
        "requests": [row(zone, 10)], "errors_5xx": [row(zone, 0)], "observed_at": [row(zone, 5)],
        "host_requests": [row(host, 16)], "host_errors": [row(host, 9)],
        "host_connect_failures": [row(host, 1)], "host_observed_at": [row(host, 6)],
    }
    without = assemble(results)[("ewr", "shop")]["primary"]
    assert (without.requests, without.errors_5xx, without.connect_failures) == (10, 0, 0)
    got = assemble(results, served_endpoints(example_desired()))[("ewr", "shop")]["primary"]
    assert (got.requests, got.errors_5xx, got.connect_failures) == (16, 8, 1)
    assert got.observed_at_ms == 6000 and got.error_rate == 9 / 17


HEDGED = {"primary": 95, "secondary": 5, "dead": 0}


def _abandoned_at_envoy(fleet) -> int:  # type: ignore[no-untyped-def]
    """rq_total - rq_success - rq_error of the primary's host in the critical tier (admin)."""
    stats = {}
    for line in fleet.envoy.admin("/stats?filter=shop.critical.endpoint").splitlines():
        name, _, value = line.partition(": ")
        if name.startswith(f"cluster.shop.critical.endpoint.127.0.0.1_{fleet.primary.port}."):
            stats[name.rsplit(".", 1)[1]] = int(value)
    return stats["rq_total"] - stats["rq_success"] - stats["rq_error"]


@pytest.mark.prometheus
@pytest.mark.skipif(prometheus_binary() is None, reason="prometheus binary not installed")
async def test_hedges_that_win_show_as_the_primarys_abandoned_attempts_in_both_sources():
    """Issue 33: the critical tier hedges after 50 ms; the primary answers 200 ms late and 40 %
    5xx, so the standby wins almost every request and Envoy resets the primary's attempt. Its
    host stats then count the attempt in rq_total only: both sources read the primary as
    mostly abandoned, and the evidence rules call it a breach (it was 'inconclusive')."""
    from control_plane.decide.evidence import judge
    from control_plane.desired.model import FailoverPolicy

    async with running_sink() as (store, port), \
            translated_fleet(port, HEDGED, hedge_delay_ms=50) as fleet:
        assert fleet.desired is not None
        store.update_served(fleet.desired, {})
        prometheus = await asyncio.to_thread(PrometheusServer([fleet.envoy.admin_port]).start)
        try:
            source = PrometheusSource(prometheus.url, desired=fleet.desired)
            await fleet.traffic(20, concurrency=2)

            async def host_series() -> bool:
                origins = shop(await source.window(wall_ms(), 5000))
                return {"primary", "secondary"} <= set(origins)

            await eventually(host_series, 20, "Prometheus shows the host series", interval=0.3)
            fleet.primary.set_fault(Fault(error_rate=0.4, latency_ms=200))
            before = await asyncio.to_thread(_abandoned_at_envoy, fleet)
            start = wall_ms()
            statuses: list[int] = []
            for _ in range(8):
                statuses += await fleet.traffic(15, concurrency=3)
            flushed = time.time() + 1.0
            await eventually(lambda: prometheus.scraped_since(flushed), 10,
                             "a scrape after Envoy's next stats flush", in_thread=True,
                             interval=0.2)
            abandoned = await asyncio.to_thread(_abandoned_at_envoy, fleet) - before
            now = wall_ms()
            sink = shop(await store.window(now, now - start + 500))["primary"]
            prom = shop(await source.window(now, now - start + 2000))["primary"]
        finally:
            await asyncio.to_thread(prometheus.stop)
    # the hedges answered nearly every request (one the retry budget refused waits for the
    # primary: 5xx 40 % of the time, and its retry may be refused too)
    assert statuses.count(200) >= 0.95 * len(statuses), statuses
    assert abandoned >= 100
    policy = FailoverPolicy()
    for name, got in (("sink", sink), ("prometheus", prom)):
        assert got.requests >= 100, (name, got)
        assert got.abandoned == pytest.approx(abandoned, rel=0.15), (name, got, abandoned)
        judged = judge(got, policy)
        assert judged.verdict == "breach", (name, judged)
        # the abandoned share breaches, or (when every attempt was abandoned or failed) the
        # origin answered none of them: either way the abandoned attempts are the evidence
        assert any(b.startswith("abandoned") or ("abandoned" in b and "succeeded" in b)
                   for b in judged.breaches), (name, judged)
        # without the abandoned attempts, the window had only its few answered ones
        hidden = judge(replace(got, abandoned=0), policy)
        assert not any(b.startswith("abandoned") for b in hidden.breaches)
