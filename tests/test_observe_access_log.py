"""Pool-wait samples from access-log entries: which field, which entries, quantiles, bounds."""

from __future__ import annotations

from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry
from google.protobuf.duration_pb2 import Duration

from control_plane.decide.signals import OriginSignals, TierPending, WaitQuantiles
from control_plane.observe.access_log import (
    AccessLogStore,
    WithAttemptLatency,
    WithWaits,
    quantiles,
    wait_sample,
)
from control_plane.observe.source import Signals, TierSignals
from harness.models import example_desired

T0 = 1_800_000_000_000


def entry(cluster: str = "shop.critical", wait_ms: float | None = 40, total_ms: float = 150,
          overflow: bool = False, attempts: int = 0, host: tuple[str, int] | None = None,
          last_rx_ms: float | None = None) -> HTTPAccessLogEntry:
    found = HTTPAccessLogEntry()
    common = found.common_properties
    common.upstream_cluster = cluster
    if wait_ms is not None:
        common.time_to_first_upstream_tx_byte.CopyFrom(Duration(nanos=int(wait_ms * 1e6)))
    common.duration.CopyFrom(Duration(nanos=int(total_ms * 1e6)))
    common.response_flags.upstream_overflow = overflow
    common.upstream_request_attempt_count = attempts
    if host is not None:
        common.upstream_remote_address.socket_address.address = host[0]
        common.upstream_remote_address.socket_address.port_value = host[1]
    if last_rx_ms is not None:
        common.time_to_last_upstream_rx_byte.CopyFrom(Duration(nanos=int(last_rx_ms * 1e6)))
    return found


def test_the_wait_is_time_to_first_upstream_tx_byte() -> None:
    cluster, sample = wait_sample(entry(wait_ms=40), T0) or ("", None)
    assert cluster == "shop.critical" and sample is not None
    assert (sample.wait_ms, sample.duration_ms) == (40, 150)


def test_a_request_that_never_went_upstream_counts_its_whole_duration() -> None:
    found = wait_sample(entry(wait_ms=None, total_ms=800), T0)
    assert found is not None and found[1].wait_ms == 800


def test_not_samples_overflow_direct_responses_and_clusters_without_a_tier() -> None:
    assert wait_sample(entry(overflow=True), T0) is None
    assert wait_sample(entry(cluster=""), T0) is None
    assert wait_sample(entry(cluster="ballast_xds"), T0) is None


def test_quantiles_nearest_rank() -> None:
    assert quantiles([]) is None
    assert quantiles([float(v) for v in range(1, 101)]) == WaitQuantiles(50, 95, 99, 100)
    assert quantiles([7.0]) == WaitQuantiles(7, 7, 7, 1)


def test_store_windows_per_pop_group_tier_and_stays_bounded() -> None:
    store = AccessLogStore(retention_ms=60_000, max_samples=100)
    store.ingest("ewr", [entry(wait_ms=w) for w in range(1, 11)], T0 - 40_000)  # old window
    store.ingest("ewr", [entry(wait_ms=w) for w in (5, 10, 60)], T0 - 5_000)
    store.ingest("ewr", [entry(cluster="shop.background", wait_ms=900)], T0 - 5_000)
    store.ingest("sjc", [entry(wait_ms=1)], T0 - 1_000)
    store.ingest("", [entry()], T0)  # no PoP: not kept
    waits = store.waits(T0, 30_000)
    assert waits == {
        ("ewr", "shop"): {"critical": WaitQuantiles(10, 60, 60, 3),
                          "background": WaitQuantiles(900, 900, 900, 1)},
        ("sjc", "shop"): {"critical": WaitQuantiles(1, 1, 1, 1)},
    }
    store.ingest("ewr", [entry() for _ in range(500)], T0)
    assert len(store.samples(T0, 30_000)[("ewr", "shop.critical")]) == 100
    store.ingest("ewr", [], T0 + 200_000)  # everything older than the retention goes
    assert store.samples(T0 + 200_000, 300_000) == {}


def test_sheds_count_demoted_share_routes_and_tier_pool_overflows() -> None:
    """A shed tier keeps its floor and Envoy answers the rest from the tier pool's breaker
    (UO), as it answers a queue bounded in time: both are sheds of that tier, like a request
    the route of a demoted share answered (the rollout gates' shed rate)."""
    store = AccessLogStore()
    demoted = entry(cluster="", wait_ms=None)
    demoted.common_properties.route_name = "x-prefetch@shed/shop/normal"
    store.ingest("ewr", [entry(cluster="shop.background", overflow=True),
                         entry(cluster="shop.background", overflow=True),
                         entry(cluster="shop.background"), demoted, entry(cluster="shop.normal"),
                         entry(cluster="ballast_xds", overflow=True)], T0)
    assert store.sheds(T0, 30_000) == {("ewr", "shop", "background"): (3, 2),
                                       ("ewr", "shop", "normal"): (2, 1)}


async def test_with_waits_adds_the_access_log_wait_to_the_gauge_readings() -> None:
    class Gauges:
        async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
            return {("ewr", "shop"): {"critical": TierPending(4, now_ms),
                                      "normal": TierPending(0, now_ms)}}

    store = AccessLogStore()
    store.ingest("ewr", [entry(wait_ms=50)], T0)
    readings = await WithWaits(Gauges(), store).tier_pending(T0, 30_000)
    assert readings[("ewr", "shop")]["critical"].wait == WaitQuantiles(50, 50, 50, 1)
    assert readings[("ewr", "shop")]["normal"].wait is None


PRIMARY, SECONDARY = ("127.0.0.1", 8081), ("127.0.0.1", 8082)  # example_desired's origins


def test_retried_requests_are_not_pool_wait_samples() -> None:
    store = AccessLogStore()
    first = [entry(wait_ms=w, attempts=1) for w in (1, 2, 3)]
    retried = entry(wait_ms=320, attempts=2)  # a failed attempt and the backoff, not queueing
    store.ingest("ewr", [*first, retried, entry(wait_ms=4)], T0)  # 0: Envoy did not say
    assert store.waits(T0, 30_000)[("ewr", "shop")]["critical"] == WaitQuantiles(
        2, 4, 4, 4, excluded=1)


def test_served_is_the_last_attempt_of_the_origin_that_answered() -> None:
    store = AccessLogStore(desired=example_desired())
    store.ingest("ewr", [
        entry(wait_ms=320, last_rx_ms=362, attempts=2, host=SECONDARY),  # retried: 42 ms
        entry(wait_ms=1, last_rx_ms=11, host=PRIMARY),
        entry(cluster="shop.background", wait_ms=2, last_rx_ms=52, host=PRIMARY),
        entry(wait_ms=1, host=PRIMARY),  # no answer byte: no service time
        entry(wait_ms=1, last_rx_ms=9, host=("10.9.9.9", 1)),  # not an origin of the state
    ], T0)
    assert store.served(T0, 30_000) == {("ewr", "shop", "secondary"): [42.0],
                                        ("ewr", "shop", "primary"): [10.0, 50.0]}
    assert store.reporting(T0, 30_000) == {"ewr"}


async def test_with_attempt_latency_replaces_the_whole_request_latency() -> None:
    def signals(p50: float) -> OriginSignals:
        return OriginSignals(100, 0, 0, p50, p50 * 2, 0.0, 0, None, T0, latency_samples=100)

    class Passive:
        async def window(self, now_ms: int, window_ms: int) -> Signals:
            return {("ewr", "shop"): {"primary": signals(20.0), "secondary": signals(325.0)},
                    ("sjc", "shop"): {"primary": signals(30.0), "secondary": signals(40.0)}}

    store = AccessLogStore(desired=example_desired())
    store.ingest("ewr", [entry(wait_ms=300, last_rx_ms=300 + ms, attempts=2, host=SECONDARY)
                         for ms in range(1, 13)], T0)
    found = await WithAttemptLatency(Passive(), store).window(T0, 30_000)
    secondary = found[("ewr", "shop")]["secondary"]
    assert (secondary.p50_ms, secondary.p95_ms, secondary.p95_low_ms) == (6.0, 12.0, 9.0)
    assert (secondary.latency_samples, secondary.latency_from) == (12, "final_attempt")
    primary = found[("ewr", "shop")]["primary"]  # no attempt it answered was logged
    assert primary.p50_ms is None and primary.latency_samples == 0
    assert found[("sjc", "shop")]["secondary"] == signals(40.0)  # sjc sends no access logs
