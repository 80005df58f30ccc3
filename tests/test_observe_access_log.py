"""Pool-wait samples from access-log entries: which field, which entries, quantiles, bounds."""

from __future__ import annotations

from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry
from google.protobuf.duration_pb2 import Duration

from control_plane.decide.signals import TierPending, WaitQuantiles
from control_plane.observe.access_log import (
    AccessLogStore,
    WithWaits,
    quantiles,
    wait_sample,
)
from control_plane.observe.source import TierSignals

T0 = 1_800_000_000_000


def entry(cluster: str = "shop.critical", wait_ms: float | None = 40, total_ms: float = 150,
          overflow: bool = False) -> HTTPAccessLogEntry:
    found = HTTPAccessLogEntry()
    common = found.common_properties
    common.upstream_cluster = cluster
    if wait_ms is not None:
        common.time_to_first_upstream_tx_byte.CopyFrom(Duration(nanos=int(wait_ms * 1e6)))
    common.duration.CopyFrom(Duration(nanos=int(total_ms * 1e6)))
    common.response_flags.upstream_overflow = overflow
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
