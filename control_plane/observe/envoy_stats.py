"""Pure parsing of Envoy stats into the points Ballast uses (no I/O).

Measured on Envoy 1.40 (metrics_service sink, `emit_tags_as_labels: true`): tags arrive as labels
named with dots (`envoy.cluster_name`, `envoy.response_code_class`) and are cut out of the metric
name. With the stats tags of the edge bootstrap template (`translate/bootstrap_templates.py`),
`cluster.shop.critical.zone.ewr.primary.upstream_rq_5xx` arrives as `cluster.zone.upstream_rq_xx`
{ballast_cluster="shop.critical", local_zone="ewr", upstream_zone="primary",
envoy.response_code_class="5"}. Without those tags the
default extractor cuts only the first segment of a dotted cluster name (envoy.cluster_name="shop",
name `cluster.critical.zone.ewr.primary.upstream_rq_xx`); without tags at all the full name
arrives. All three shapes parse to the same point.

Per-host stats (`track_cluster_stats.per_endpoint_stats`) are NOT in the metrics_service sink's
snapshot in Envoy 1.40 (it flushes counters, gauges and histograms only; measured and in its
source). The OpenTelemetry sink (`envoy.stat_sinks.open_telemetry`) does flush them. With
`emit_tags_as_attributes` and `use_tag_extracted_name`, `cluster.shop.critical.endpoint.
127.0.0.1_8081.rq_error` arrives as metric `cluster.endpoint.rq_error` {envoy.cluster_name=
"shop.critical" (the whole name), envoy.endpoint_address="127.0.0.1:8081", ballast_pop="ewr"
(fixed tags apply to host stats)}; counters are OTLP sums, gauges (`healthy`, `rq_active`, ...)
OTLP gauges (ignored). Counters must be cumulative: host counter deltas are latched by every
reader, so an admin `/stats/prometheus` scrape between two flushes steals them from the sink
(measured: the sink saw 15 of 56 attempts while Prometheus scraped every 0.5 s).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe.window import Buckets

Stat = Literal["completed", "5xx", "latency", "pending_active", "pending_overflow", "active",
               "queue_overloaded"]
GAUGES: frozenset[str] = frozenset({"pending_active", "active", "queue_overloaded"})

_ZONE_STATS: dict[str, Stat] = {
    "upstream_rq_completed": "completed",
    "upstream_rq_5xx": "5xx",
    "upstream_rq_time": "latency",
}
_CLUSTER_STATS: dict[str, Stat] = {
    "upstream_rq_pending_active": "pending_active",
    "upstream_rq_pending_overflow": "pending_overflow",
    "upstream_rq_active": "active",
    "upstream_queue_overloaded": "queue_overloaded",
}
_FULL_ZONE = re.compile(
    r"^cluster\.(?P<cluster>.+?)\.zone\.(?P<pop>[^.]+)\.(?P<origin>[^.]+)\.(?P<stat>[^.]+)$"
)
_FULL_CLUSTER = re.compile(r"^cluster\.(?P<cluster>.+)\.(?P<stat>[^.]+)$")
_TAGGED_ZONE = re.compile(r"^zone\.(?:(?P<pop>[^.]+)\.(?P<origin>[^.]+)\.)?(?P<stat>[^.]+)$")

HostStat = Literal["rq_total", "rq_success", "rq_error", "cx_connect_fail"]
HOST_COUNTERS: tuple[HostStat, ...] = ("rq_total", "rq_success", "rq_error", "cx_connect_fail")
_FULL_HOST = re.compile(
    r"^cluster\.(?P<cluster>.+)\.endpoint\.(?P<host>.+)_(?P<port>[0-9]+)\.(?P<stat>[a-z_]+)$"
)
_OTLP_CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


@dataclass(frozen=True)
class StatPoint:
    """One value of one stat: per origin (zone stats) or per cluster (`origin` empty)."""

    stat: Stat
    cluster: str
    local_zone: str  # "" when the stat does not say (cluster-wide stats)
    origin: str
    value: float = 0.0  # counter or gauge
    buckets: Buckets = ()  # histograms: (upper bound ms, cumulative count)


class BadMetric(ValueError):
    """A metric whose values cannot be trusted (NaN, negative, buckets out of order)."""


def _label(labels: Mapping[str, str], name: str) -> str:
    return labels.get(name) or labels.get(name.replace(".", "_"), "")


def identify(name: str, labels: Mapping[str, str]) -> tuple[Stat, str, str, str] | None:
    """(stat, cluster, local zone, origin) of a stat Ballast reads, or None for the others."""
    if not name.startswith("cluster."):
        return None
    code_class = _label(labels, "envoy.response_code_class")
    cluster = labels.get("ballast_cluster", "")
    if cluster:
        match = _TAGGED_ZONE.match(name[len("cluster.") :])
        if match:
            pop = match["pop"] or labels.get("local_zone", "")
            origin = match["origin"] or labels.get("upstream_zone", "")
            return _zone_stat(match["stat"], code_class, cluster, pop, origin)
        return _cluster_stat(name[len("cluster.") :], cluster)
    default_cluster = _label(labels, "envoy.cluster_name")
    full = f"cluster.{default_cluster}.{name[len('cluster.'):]}" if default_cluster else name
    match = _FULL_ZONE.match(full)
    if match:
        cluster, pop, origin = match["cluster"], match["pop"], match["origin"]
        return _zone_stat(match["stat"], code_class, cluster, pop, origin)
    match = _FULL_CLUSTER.match(full)
    if match:
        return _cluster_stat(match["stat"], match["cluster"])
    return None


def _zone_stat(
    stat: str, code_class: str, cluster: str, pop: str, origin: str
) -> tuple[Stat, str, str, str] | None:
    if stat == "upstream_rq_xx":
        stat = f"upstream_rq_{code_class}xx"
    kind = _ZONE_STATS.get(stat)
    if kind is None or not origin:
        return None
    return kind, cluster, pop, origin


def _cluster_stat(stat: str, cluster: str) -> tuple[Stat, str, str, str] | None:
    kind = _CLUSTER_STATS.get(stat)
    return None if kind is None else (kind, cluster, "", "")


def points(family: prom.MetricFamily) -> Iterator[StatPoint | BadMetric]:
    """The points of one metric family Ballast cares about; bad metrics come out as BadMetric.

    The metrics_service sink sends histograms as HISTOGRAM (and, unless `histogram_emit_mode`
    says otherwise, a SUMMARY copy, which is ignored).
    """
    if family.type == prom.SUMMARY:
        return
    for metric in family.metric:
        labels = {pair.name: pair.value for pair in metric.label}
        found = identify(family.name, labels)
        if found is None:
            continue
        stat, cluster, pop, origin = found
        try:
            if stat == "latency":
                if family.type != prom.HISTOGRAM:
                    continue
                yield StatPoint(stat, cluster, pop, origin, *_histogram(metric.histogram))
            elif stat in GAUGES:
                yield StatPoint(stat, cluster, pop, origin, _number(metric.gauge.value))
            else:
                yield StatPoint(stat, cluster, pop, origin, _number(metric.counter.value))
        except BadMetric as err:
            yield BadMetric(f"{family.name} {labels}: {err}")


def _number(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise BadMetric(f"value {value!r} is not a finite non-negative number")
    return value


def _histogram(histogram: prom.Histogram) -> tuple[float, Buckets]:
    count = _number(histogram.sample_count_float or float(histogram.sample_count))
    buckets: list[tuple[float, float]] = []
    for bucket in histogram.bucket:
        upper = bucket.upper_bound
        cumulative = _number(bucket.cumulative_count_float or float(bucket.cumulative_count))
        if math.isnan(upper) or (buckets and upper <= buckets[-1][0]):
            raise BadMetric("bucket bounds are not ascending")
        if buckets and cumulative < buckets[-1][1]:
            raise BadMetric("bucket counts are not cumulative")
        buckets.append((upper, cumulative))
    if buckets and count < buckets[-1][1]:
        raise BadMetric("sample_count is below the last bucket")
    if count > (buckets[-1][1] if buckets else 0.0):
        buckets.append((math.inf, count))
    return count, tuple(buckets)


@dataclass(frozen=True)
class HostPoint:
    """One per-host counter of one flush: its cumulative value."""

    pop: str
    cluster: str
    address: str  # "127.0.0.1:8081", as Envoy prints it
    stat: HostStat
    value: float = 0.0


def identify_host(name: str, labels: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(cluster, address, stat) of a per-endpoint stat, tagged or full-name shape; else None."""
    cluster = _label(labels, "envoy.cluster_name")
    address = _label(labels, "envoy.endpoint_address")
    if name.startswith("cluster.endpoint.") and cluster and address:
        return cluster, address, name[len("cluster.endpoint.") :]
    match = _FULL_HOST.match(name)
    if match:
        return match["cluster"], f"{match['host']}:{match['port']}", match["stat"]
    return None


def otlp_host_points(request: Any) -> Iterator[HostPoint | BadMetric]:
    """The per-host points of one OTLP ExportMetricsServiceRequest from Envoy's OTel sink.

    Counters must be cumulative (`report_counters_as_deltas: false`); delta sums come out as
    BadMetric. The PoP is the `ballast_pop` attribute (a fixed stats tag of the edge bootstrap
    template, `translate/bootstrap_templates.py`).
    """
    for resource in request.resource_metrics:
        scopes = getattr(resource, "scope_metrics", None)
        if scopes is None:  # xds-protos vendors OTLP 0.x: same field 2, older name
            scopes = resource.instrumentation_library_metrics
        for scope in scopes:
            for metric in scope.metrics:
                yield from _otlp_metric(metric)


def _otlp_metric(metric: Any) -> Iterator[HostPoint | BadMetric]:
    if metric.WhichOneof("data") != "sum":
        return
    data = metric.sum
    if data.aggregation_temporality != _OTLP_CUMULATIVE:
        yield BadMetric(f"{metric.name}: delta sum (set report_counters_as_deltas: false)")
        return
    for point in data.data_points:
        labels = {a.key: a.value.string_value for a in point.attributes}
        found = identify_host(metric.name, labels)
        if found is None:
            continue
        cluster, address, stat = found
        pop = labels.get("ballast_pop", "")
        if not pop:
            yield BadMetric(f"{metric.name} {labels}: no ballast_pop attribute")
            continue
        if stat not in HOST_COUNTERS:
            continue
        value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
        try:
            yield HostPoint(pop, cluster, address, stat, _number(float(value)))  # type: ignore[arg-type]
        except BadMetric as err:
            yield BadMetric(f"{metric.name} {labels}: {err}")
