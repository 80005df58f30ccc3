"""Load reports as window values: what each report adds, how reports map to origins, what is
dropped, and the bounds a report must keep."""

from __future__ import annotations

from dataclasses import replace

import pytest
from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.base_pb2 import Locality
from envoy.config.endpoint.v3.load_report_pb2 import (
    ClusterStats,
    UpstreamEndpointStats,
    UpstreamLocalityStats,
)
from envoy.service.load_stats.v3.lrs_pb2 import LoadStatsRequest

from control_plane.desired import parse_desired
from control_plane.desired.model import Desired
from control_plane.observe.fill_in import FilledIn
from control_plane.observe.load_reports import (
    MAX_ENDPOINTS_PER_LOCALITY,
    MERGE_MS,
    BadReport,
    LoadReports,
    check_report,
)
from control_plane.observe.source import Signals, TierSignals
from tests.test_translate_grpc import TEXT

T0 = 1_000_000


@pytest.fixture(scope="module")
def desired() -> Desired:
    return parse_desired(TEXT, "grpc.yaml")


def locality(zone: str, issued: int, ok: int, failed: int, in_progress: int = 0,
             **extra: int) -> UpstreamLocalityStats:
    return UpstreamLocalityStats(
        locality=Locality(zone=zone), total_issued_requests=issued,
        total_successful_requests=ok, total_error_requests=failed,
        total_requests_in_progress=in_progress, **extra)


def report(cluster: str, *localities: UpstreamLocalityStats, dropped: int = 0
           ) -> LoadStatsRequest:
    return LoadStatsRequest(cluster_stats=[ClusterStats(
        cluster_name=cluster, upstream_locality_stats=localities, total_dropped_requests=dropped)])


def test_a_window_sums_the_reports_in_it_and_the_pops_clients(desired: Desired) -> None:
    store = LoadReports(desired)
    one, two = store.open_stream("g1", "ewr"), store.open_stream("g2", "ewr")
    store.ingest(one, report("shop-api", locality("primary", 10, 9, 1)), T0)
    store.ingest(one, report("shop-api", locality("primary", 20, 18, 2),
                             locality("secondary", 4, 4, 0)), T0 + 1000)
    store.ingest(two, report("shop-api", locality("primary", 5, 5, 0)), T0 + 1500, )
    signals = store.read_window(T0 + 2000, 1500)  # (T0+500, T0+2000]: the first is out
    primary = signals["ewr", "shop-api"]["primary"]
    assert (primary.requests, primary.errors_5xx, primary.connect_failures) == (25, 2, 0)
    assert primary.p95_ms is None and primary.latency_samples == 0
    assert primary.latency_from == "none" and primary.observed_at_ms == T0 + 1500
    assert signals["ewr", "shop-api"]["secondary"].requests == 4
    assert store.read_window(T0 + 2000, 3000)["ewr", "shop-api"]["primary"].requests == 35


def test_tier_clusters_of_a_group_add_up_and_drops_are_queue_overflow(desired: Desired) -> None:
    store = LoadReports(desired)
    envoy = store.open_stream("e1", "sjc")
    store.ingest(envoy, LoadStatsRequest(cluster_stats=[
        ClusterStats(cluster_name="shop.critical", total_dropped_requests=3,
                     upstream_locality_stats=[locality("primary", 10, 10, 0)]),
        ClusterStats(cluster_name="shop.normal",
                     upstream_locality_stats=[locality("primary", 5, 4, 1)]),
        ClusterStats(cluster_name="ballast_xds",
                     upstream_locality_stats=[locality("", 0, 0, 0, 2)]),
    ]), T0)
    (primary,) = store.read_window(T0, 1000)["sjc", "shop"].values()
    assert (primary.requests, primary.errors_5xx, primary.queue_overflow) == (15, 1, 3)


def test_failed_connections_are_connect_failures_not_5xx(desired: Desired) -> None:
    store = LoadReports(desired)
    stream = store.open_stream("e1", "ewr")
    store.ingest(stream, report("shop.critical", locality("primary", 10, 6, 4,
                                                          total_fail_connections=3)), T0)
    primary = store.read_window(T0, 1000)["ewr", "shop"]["primary"]
    assert (primary.requests, primary.errors_5xx, primary.connect_failures) == (10, 1, 3)


def test_abandoned_attempts_are_those_no_longer_in_progress(desired: Desired) -> None:
    store = LoadReports(desired)
    stream = store.open_stream("e1", "ewr")
    store.ingest(stream, report("shop-api", locality("primary", 10, 8, 0, 2)), T0)
    store.ingest(stream, report("shop-api", locality("primary", 10, 6, 1, 3)), T0 + 1000)
    store.ingest(stream, report("shop-api", locality("primary", 10, 9, 0, 1)), T0 + 2000)
    (held,) = store.report_windows(T0 + 2000, 1500).values()
    # issued 20, succeeded 15, failed 1, in progress 2 before and 1 after: 20-15-1+1 = 5
    assert (held.in_progress_start, held.in_progress_end, held.abandoned) == (2, 1, 5)


def test_reports_closer_than_the_merge_gap_are_one_sample(desired: Desired) -> None:
    store = LoadReports(desired)
    stream = store.open_stream("g1", "ewr")
    for at in range(50):  # a client sending fifty reports in 50 ms, the standby from the 2nd
        localities = [locality("primary", 2, 2, 0, at)]
        if at:
            localities.append(locality("secondary", 1, 1, 0))
        store.ingest(stream, report("shop-api", *localities), T0 + at)
    store.ingest(stream, report("shop-api", locality("primary", 1, 1, 0)), T0 + MERGE_MS + 60)
    series = store._streams[stream].series
    assert {origin: len(s.at) for (_, origin), s in series.items()} == {
        "primary": 2, "secondary": 1}
    held = store.report_windows(T0 + 1000, 2000)
    assert held["ewr", "shop-api", "primary"].issued == 101
    assert held["ewr", "shop-api", "primary"].in_progress_end == 0
    assert held["ewr", "shop-api", "secondary"].issued == 49
    assert store.report_windows(T0 + 100, 1000)["ewr", "shop-api", "primary"].issued == 100


def test_endpoints_map_by_address_and_unknown_names_are_dropped(desired: Desired) -> None:
    store = LoadReports(desired)
    stream = store.open_stream("e1", "ewr")
    endpoints = [UpstreamEndpointStats(
        address=Address(socket_address=SocketAddress(address=address, port_value=port)),
        total_issued_requests=issued, total_successful_requests=issued)
        for address, port, issued in (("10.0.0.2", 50052, 7), ("10.9.9.9", 1, 100))]
    store.ingest(stream, LoadStatsRequest(cluster_stats=[
        ClusterStats(cluster_name="shop-api", upstream_locality_stats=[
            UpstreamLocalityStats(locality=Locality(zone="nonsense"),
                                  upstream_endpoint_stats=endpoints),
            locality("nobody", 50, 50, 0)]),
        ClusterStats(cluster_name="unknown", upstream_locality_stats=[locality("a", 9, 9, 0)]),
    ]), T0)
    signals = store.read_window(T0, 1000)
    assert {name: s.requests for name, s in signals["ewr", "shop-api"].items()} == {
        "secondary": 7}
    assert store.reporters()[0]["per_endpoint"] is True


def test_a_pop_maps_through_the_desired_state_it_serves(desired: Desired) -> None:
    renamed = parse_desired(TEXT.replace("shop-api:", "shop-v2:"), "v2.yaml")
    store = LoadReports(desired)
    store.update_served(renamed, {"sjc": desired})  # sjc not reached by the rollout yet
    ewr, sjc = store.open_stream("g1", "ewr"), store.open_stream("g2", "sjc")
    for stream in (ewr, sjc):
        for cluster in ("shop-api", "shop-v2"):
            store.ingest(stream, report(cluster, locality("primary", 1, 1, 0)), T0 + stream)
    assert set(store.read_window(T0 + 10, 100)) == {("ewr", "shop-v2"), ("sjc", "shop-api")}


def test_old_samples_and_closed_streams_go(desired: Desired) -> None:
    store = LoadReports(desired, retention_ms=10_000)
    stream = store.open_stream("g1", "ewr")
    store.ingest(stream, report("shop-api", locality("primary", 1, 1, 0)), T0)
    store.close_stream(stream)
    other = store.open_stream("g2", "ewr")
    store.ingest(other, report("shop-api", locality("primary", 1, 1, 0)), T0 + 20_000)
    assert store.nodes() == {"g2": "ewr"}
    assert list(store._streams) == [other]


@pytest.mark.parametrize(("request_", "why"), [
    (LoadStatsRequest(cluster_stats=[ClusterStats(cluster_name="c" * 600)]), "cluster name"),
    (report("shop-api", locality("z" * 600, 1, 1, 0)), "locality zone"),
    (report("shop-api", *(locality(str(i), 1, 1, 0) for i in range(1100))), "localities"),
    (report("shop-api", UpstreamLocalityStats(upstream_endpoint_stats=[
        UpstreamEndpointStats()] * (MAX_ENDPOINTS_PER_LOCALITY + 1))), "endpoints"),
    (LoadStatsRequest(cluster_stats=[ClusterStats()] * 5000), "clusters"),
])
def test_a_report_over_a_bound_is_refused_before_anything_is_kept(
        request_: LoadStatsRequest, why: str) -> None:
    with pytest.raises(BadReport, match=why):
        check_report(request_)


class _Fixed:
    def __init__(self, signals: Signals) -> None:
        self.signals = signals
        self.served = 0

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return self.signals

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        return {("ewr", "shop"): {}}

    def update_served(self, desired: Desired, serving: object) -> None:
        self.served += 1


async def test_load_reports_fill_in_the_pairs_the_sink_has_nothing_of(desired: Desired) -> None:
    store = LoadReports(desired)
    stream = store.open_stream("g1", "ewr")
    store.ingest(stream, report("shop-api", locality("primary", 4, 4, 0)), T0)
    store.ingest(stream, report("shop.critical", locality("primary", 9, 9, 0)), T0)
    sink_signals = store.read_window(T0, 1000)
    sink_shop = {"primary": replace(sink_signals["ewr", "shop"]["primary"], requests=100)}
    sink = _Fixed({("ewr", "shop"): sink_shop})
    both = FilledIn(sink, store)  # type: ignore[arg-type]
    signals = await both.window(T0, 1000)
    assert signals["ewr", "shop"]["primary"].requests == 100  # the sink's pair, whole
    assert signals["ewr", "shop-api"]["primary"].requests == 4  # only the reports have it
    assert await both.tier_pending(T0, 1000) == {("ewr", "shop"): {}}
    both.update_served(desired, {})
    assert sink.served == 1
