"""Pure window math, stat parsing and the sink store, with synthetic samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe.envoy_stats import BadMetric, identify, points
from control_plane.observe.sink import SinkStore
from control_plane.observe.window import (
    add_buckets,
    counter_increase,
    quantile,
    split_cluster,
)


def test_counter_increase_uses_the_baseline_before_the_window():
    samples = [(0, 100.0), (1000, 110.0), (2000, 130.0), (3000, 130.0)]
    assert counter_increase(samples, 1000, 3000) == 20
    assert counter_increase(samples, 500, 3000) == 30
    assert counter_increase(samples, -1, 3000) == 30  # first sample is only a baseline
    assert counter_increase(samples, 3000, 4000) == 0


def test_counter_reset_counts_from_zero_never_negative():
    samples = [(0, 500.0), (1000, 520.0), (2000, 7.0), (3000, 12.0)]
    assert counter_increase(samples, 0, 3000) == 20 + 7 + 5


@given(
    st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=40),
    st.integers(min_value=-5, max_value=45),
    st.integers(min_value=0, max_value=45),
)
def test_counter_increase_is_bounded(values: list[float], start: int, length: int):
    samples = [(t, v) for t, v in enumerate(values)]
    grown = counter_increase(samples, start, start + length)
    assert grown >= 0
    # never more than what the series could have counted: every reset counts its full value
    assert grown <= sum(values) + 1e-6
    monotonic = [(t, v) for t, v in enumerate(sorted(values))]
    inside = [v for t, v in monotonic if start < t <= start + length]
    before = [v for t, v in monotonic if t <= start]
    if inside:
        base = before[-1] if before else inside[0]
        grown_monotonic = counter_increase(monotonic, start, start + length)
        assert grown_monotonic == pytest.approx(inside[-1] - base)


def test_quantile_interpolates_like_histogram_quantile():
    buckets = ((10.0, 0.0), (100.0, 50.0), (250.0, 100.0))
    assert quantile(0.5, buckets) == 100.0
    assert quantile(0.25, buckets) == pytest.approx(55.0)
    assert quantile(0.75, buckets) == pytest.approx(175.0)
    assert quantile(0.5, ()) is None
    assert quantile(0.5, ((10.0, 0.0),)) is None
    # observations beyond the last finite bound: the answer is that bound
    assert quantile(0.99, ((10.0, 1.0), (math.inf, 100.0))) == 10.0


@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12),
    st.floats(min_value=0.01, max_value=1.0),
)
def test_quantile_stays_inside_the_buckets(counts: list[int], q: float):
    bounds = [2.0**i for i in range(len(counts))]
    cumulative = [float(sum(counts[: i + 1])) for i in range(len(counts))]
    result = quantile(q, tuple(zip(bounds, cumulative, strict=True)))
    if cumulative[-1] == 0:
        assert result is None
    else:
        assert result is not None and 0 <= result <= bounds[-1]


def test_bucket_sums():
    a = ((10.0, 1.0), (100.0, 3.0))
    b = ((10.0, 2.0), (50.0, 2.0), (100.0, 5.0))
    assert add_buckets(a, b) == ((10.0, 3.0), (50.0, 3.0), (100.0, 8.0))


def test_split_cluster():
    assert split_cluster("shop.critical") == ("shop", "critical")
    assert split_cluster("eu.shop.bulk") == ("eu.shop", "bulk")
    assert split_cluster("ballast_xds") is None


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        # what Envoy 1.40 sends with the tags of the edge bootstrap template (measured)
        ("cluster.zone.upstream_rq_xx",
         {"envoy.response_code_class": "5", "envoy.cluster_name": "shop",
          "ballast_cluster": "shop.critical", "local_zone": "ewr", "upstream_zone": "primary"},
         ("5xx", "shop.critical", "ewr", "primary")),
        ("cluster.zone.upstream_rq_xx",
         {"envoy.response_code_class": "2", "ballast_cluster": "shop.critical",
          "local_zone": "ewr", "upstream_zone": "primary"}, None),
        ("cluster.zone.upstream_rq_completed",
         {"ballast_cluster": "shop.critical", "local_zone": "ewr", "upstream_zone": "b"},
         ("completed", "shop.critical", "ewr", "b")),
        ("cluster.upstream_rq_pending_active", {"ballast_cluster": "shop.critical"},
         ("pending_active", "shop.critical", "", "")),
        # Envoy's default tags only (envoy.cluster_name stops at the first dot)
        ("cluster.critical.zone.ewr.primary.upstream_rq_xx",
         {"envoy.response_code_class": "5", "envoy.cluster_name": "shop"},
         ("5xx", "shop.critical", "ewr", "primary")),
        ("cluster.critical.upstream_rq_pending_overflow", {"envoy.cluster_name": "shop"},
         ("pending_overflow", "shop.critical", "", "")),
        # no tags at all
        ("cluster.shop.critical.zone.ewr.primary.upstream_rq_5xx", {},
         ("5xx", "shop.critical", "ewr", "primary")),
        ("cluster.shop.critical.zone.ewr.primary.upstream_rq_time", {},
         ("latency", "shop.critical", "ewr", "primary")),
        ("cluster.shop.critical.upstream_cx_total", {}, None),
        ("http.edge.downstream_rq_total", {}, None),
    ],
)
def test_identify(name: str, labels: dict[str, str], expected: tuple[str, ...] | None):
    assert identify(name, labels) == expected


def family(name: str, kind: int, labels: dict[str, str], **value: object) -> prom.MetricFamily:
    metric = prom.Metric(label=[prom.LabelPair(name=k, value=v) for k, v in labels.items()],
                         **value)
    return prom.MetricFamily(name=name, type=kind, metric=[metric])


ZONE = {"ballast_cluster": "shop.critical", "local_zone": "ewr"}


def completed(origin: str, value: float) -> prom.MetricFamily:
    return family("cluster.zone.upstream_rq_completed", prom.COUNTER,
                  {**ZONE, "upstream_zone": origin}, counter=prom.Counter(value=value))


def latency(origin: str, counts: list[int], bounds: list[float]) -> prom.MetricFamily:
    histogram = prom.Histogram(
        sample_count=counts[-1],
        bucket=[prom.Bucket(upper_bound=b, cumulative_count=c)
                for b, c in zip(bounds, counts, strict=True)],
    )
    return family("cluster.zone.upstream_rq_time", prom.HISTOGRAM,
                  {**ZONE, "upstream_zone": origin}, histogram=histogram)


def test_bad_metrics_are_reported_not_raised():
    nan = completed("a", math.nan)
    negative = completed("a", -4)
    unordered = latency("a", [5, 3], [10.0, 100.0])
    for bad in (nan, negative, unordered):
        (point,) = list(points(bad))
        assert isinstance(point, BadMetric)


def test_store_sums_nodes_of_a_pop_and_survives_resets_and_reconnects(caplog):
    store = SinkStore(retention_ms=60_000)
    a = store.open_stream("edge-ewr-1", "ewr")
    b = store.open_stream("edge-ewr-2", "ewr")
    store.ingest(a, [completed("primary", 1000)], 1000)  # history from before: a baseline
    store.ingest(b, [completed("primary", 50)], 1000)
    store.ingest(a, [completed("primary", 1010)], 2000)
    store.ingest(b, [completed("primary", 55), completed("secondary", 4)], 2000)  # new series
    store.ingest(a, [completed("primary", 3)], 3000)  # reset (CDS update)
    store.ingest(b, [completed("primary", 55), completed("secondary", 4),
                     completed("bad", math.nan)], 3000)
    store.close_stream(b)  # node 2 restarts: a new stream, counters from zero
    c = store.open_stream("edge-ewr-2", "ewr")
    store.ingest(c, [completed("primary", 2)], 4000)
    store.ingest(c, [completed("primary", 9)], 5000)
    signals = store.read_window(5000, 4500)
    primary = signals["ewr", "shop"]["primary"]
    assert primary.requests == 10 + 3 + 5 + 7
    assert signals["ewr", "shop"]["secondary"].requests == 4
    assert primary.observed_at_ms == 5000
    assert signals["ewr", "shop"]["secondary"].observed_at_ms == 3000
    assert "bad" not in signals["ewr", "shop"]
    assert any("not a finite" in r.message for r in caplog.records)
    assert store.nodes() == {"edge-ewr-1": "ewr", "edge-ewr-2": "ewr"}
    # nothing in the window: the (PoP, group) is absent, the caller holds
    assert store.read_window(60_000, 1000) == {}


def test_store_sums_interval_histograms_and_merges_tiers():
    store = SinkStore()
    s = store.open_stream("n", "ewr")
    bounds = [10.0, 100.0, 250.0]
    store.ingest(s, [latency("primary", [0, 10, 10], bounds)], 1000)
    store.ingest(s, [latency("primary", [0, 0, 10], bounds)], 2000)
    bulk = latency("primary", [10, 10, 10], bounds)
    bulk.metric[0].label[0].value = "shop.bulk"
    store.ingest(s, [bulk], 2000)
    merged = store.read_window(2000, 5000)["ewr", "shop"]["primary"]
    assert merged.p50_ms == pytest.approx(55.0)  # rank 15 of 30: in (10, 100]
    only_last = store.read_window(2000, 500)["ewr", "shop"]["primary"]
    assert only_last.p50_ms == pytest.approx(10.0)  # 20 in the last flush, rank 10: top of (0, 10]


def test_store_pending_is_max_over_tiers_summed_over_nodes_and_overflow_summed():
    store = SinkStore()

    def gauge(cluster: str, value: float) -> prom.MetricFamily:
        return family("cluster.upstream_rq_pending_active", prom.GAUGE,
                      {"ballast_cluster": cluster}, gauge=prom.Gauge(value=value))

    def over(cluster: str, value: float) -> prom.MetricFamily:
        return family("cluster.upstream_rq_pending_overflow", prom.COUNTER,
                      {"ballast_cluster": cluster}, counter=prom.Counter(value=value))

    a, b = store.open_stream("a", "ewr"), store.open_stream("b", "ewr")
    store.ingest(a, [completed("primary", 1), gauge("shop.critical", 3),
                     gauge("shop.bulk", 9), over("shop.bulk", 0)], 1000)
    store.ingest(b, [gauge("shop.bulk", 2)], 1000)
    store.ingest(a, [completed("primary", 2), gauge("shop.critical", 4),
                     gauge("shop.bulk", 1), over("shop.bulk", 5), over("shop.critical", 2)], 2000)
    primary = store.read_window(2000, 5000)["ewr", "shop"]["primary"]
    assert primary.pending_active == 4  # critical 4 vs bulk 1 + 2 (two nodes)
    assert primary.queue_overflow == 5 + 2
