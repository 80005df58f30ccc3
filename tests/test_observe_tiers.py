"""Per-tier pending maxima for the tier actions: the sink's streams and the Prometheus vectors."""

from __future__ import annotations

from control_plane.decide.signals import TierPending
from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe.prometheus import assemble_tiers, tier_queries
from control_plane.observe.sink import SinkStore

T0 = 1_800_000_000_000


def pending(cluster: str, value: float) -> prom.MetricFamily:
    metric = prom.Metric(label=[prom.LabelPair(name="ballast_cluster", value=cluster)],
                         gauge=prom.Gauge(value=value))
    return prom.MetricFamily(name="cluster.upstream_rq_pending_active", type=prom.GAUGE,
                             metric=[metric])


def test_sink_takes_the_worst_envoys_peak_in_the_window() -> None:
    store = SinkStore()
    one, two = store.open_stream("ewr-1", "ewr"), store.open_stream("ewr-2", "ewr")
    sjc = store.open_stream("sjc-1", "sjc")
    for at, a, b in ((T0 - 40_000, 99, 99), (T0 - 20_000, 30, 4), (T0 - 5_000, 12, 6)):
        store.ingest(one, [pending("shop.critical", a), pending("shop.normal", 1)], at)
        store.ingest(two, [pending("shop.critical", b)], at)
    store.ingest(sjc, [pending("shop.critical", 0)], T0 - 1_000)
    tiers = store.read_tier_window(T0, 30_000)  # the 99s are older than the window
    assert tiers == {
        ("ewr", "shop"): {
            "critical": TierPending(pending_max=30, observed_at_ms=T0 - 5_000),
            "normal": TierPending(pending_max=1, observed_at_ms=T0 - 5_000),
        },
        ("sjc", "shop"): {"critical": TierPending(pending_max=0, observed_at_ms=T0 - 1_000)},
    }
    assert store.read_tier_window(T0 + 60_000, 30_000) == {}  # nothing in the window: absent


def test_prometheus_vectors_become_tier_pending() -> None:
    def row(pop: str, cluster: str, value: float) -> dict[str, object]:
        return {"metric": {"ballast_pop": pop, "ballast_cluster": cluster},
                "value": [T0 / 1000, str(value)]}

    results = {
        "pending_max": [row("ewr", "shop.critical", 17), row("ewr", "shop.normal", 3),
                        row("sjc", "shop.critical", 0), row("ewr", "ballast_xds", 5)],
        "observed_at": [row("ewr", "shop.critical", (T0 - 2_000) / 1000),
                        row("sjc", "shop.critical", (T0 - 1_000) / 1000)],
    }
    assert assemble_tiers(results) == {
        ("ewr", "shop"): {"critical": TierPending(17, T0 - 2_000)},  # normal: no time, left out
        ("sjc", "shop"): {"critical": TierPending(0, T0 - 1_000)},
    }
    assert "max_over_time(envoy_cluster_upstream_rq_pending_active[30000ms])" in (
        tier_queries(30_000)["pending_max"]
    )
