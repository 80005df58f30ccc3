"""What one sender can make the sinks hold is bounded (issue 8: every input bounded, sinks too):
series per metrics stream, host series, (PoP, cluster) pairs of the access-log store, name
lengths, and the distinct warnings kept per stream."""

from __future__ import annotations

import logging

import pytest
from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry

from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe import sink as sink_module
from control_plane.observe.access_log import MAX_CLUSTERS, AccessLogStore
from control_plane.observe.envoy_stats import BadMetric, HostPoint
from control_plane.observe.sink import (
    MAX_HOST_SERIES,
    MAX_HOST_WARNINGS,
    MAX_SERIES_PER_STREAM,
    SinkStore,
)

T0 = 1_800_000_000_000


def pending(cluster: str) -> prom.Metric:
    return prom.Metric(label=[prom.LabelPair(name="ballast_cluster", value=cluster)],
                       gauge=prom.Gauge(value=1))


def family(metrics: list[prom.Metric]) -> prom.MetricFamily:
    return prom.MetricFamily(name="cluster.upstream_rq_pending_active", type=prom.GAUGE,
                             metric=metrics)


def test_a_metrics_stream_holds_at_most_its_series(caplog: pytest.LogCaptureFixture) -> None:
    store = SinkStore()
    stream = store.open_stream("ewr-1", "ewr")
    with caplog.at_level(logging.WARNING):
        kept = store.ingest(stream, [family([pending(f"junk{i}.critical")
                                             for i in range(MAX_SERIES_PER_STREAM + 500)])], T0)
        assert kept == MAX_SERIES_PER_STREAM
        # known series keep flowing; a name of megabytes is refused
        kept = store.ingest(stream, [family([pending("junk0.critical"),
                                             pending("x" * 1_000_000 + ".critical")])], T0 + 1)
    assert kept == 1
    held = store._streams[stream]
    assert len(held.gauges) == MAX_SERIES_PER_STREAM
    assert all(len(m) < 200 for m in held.warned)
    assert sum("ignored" in r.message for r in caplog.records) == 2  # each warning once


def test_warnings_per_stream_are_capped() -> None:
    store = SinkStore()
    stream = store.open_stream("ewr-1", "ewr")
    for i in range(MAX_HOST_WARNINGS * 3):
        bad = prom.Metric(label=[prom.LabelPair(name="ballast_cluster", value=f"c{i}.critical")],
                          gauge=prom.Gauge(value=-1))  # not a non-negative number: a warning
        store.ingest(stream, [family([bad])], T0 + i)
    assert len(store._streams[stream].warned) == MAX_HOST_WARNINGS


def test_host_series_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "MAX_HOST_SERIES", 1_000)
    store = SinkStore()
    points: list[HostPoint | BadMetric] = [
        HostPoint("ewr", f"junk{i}.critical", f"10.0.0.{i}:80", "rq_total", 1.0)
        for i in range(1_500)
    ]
    points.append(HostPoint("ewr", "shop.critical", "a" * 10_000, "rq_total", 1.0))
    store.ingest_hosts("peer", points, T0)
    assert len(store._hosts) == 1_000
    assert MAX_HOST_SERIES >= 100_000  # the real cap: far above a large PoP's hosts


def test_access_log_pairs_are_capped() -> None:
    store = AccessLogStore()

    def entry(cluster: str) -> HTTPAccessLogEntry:
        e = HTTPAccessLogEntry()
        e.common_properties.upstream_cluster = cluster
        e.common_properties.duration.FromMilliseconds(5)
        e.common_properties.time_to_first_upstream_tx_byte.FromMilliseconds(1)
        return e

    store.ingest("ewr", [entry(f"junk{i}.critical") for i in range(MAX_CLUSTERS + 100)], T0)
    store.ingest("ewr", [entry("x" * 100_000 + ".critical")], T0)
    assert len(store._samples) == MAX_CLUSTERS
    assert store.dropped == 101
