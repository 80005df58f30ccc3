"""The embedded metric source: Envoy's metrics_service sink streams every stats flush to Ballast.

`add_metrics_service(server, store)` hosts `/envoy.service.metrics.v3.MetricsService/
StreamMetrics` on an existing grpc.aio server (the ADS server) with a generic handler over our
wire-compatible mirrors (protos/ballast/v1/metrics_service.proto). Each stream is one Envoy: only
its first message carries the node, whose `locality.zone` is the PoP.

What Envoy 1.40 sends per flush (measured): counters are cumulative since the counter was created
(`report_counters_as_deltas` is off); histograms are *interval* histograms (only the observations
since the previous flush), so a window sums them; the gauge is the current value. Only stats that
have been used are sent, so a series can appear in the middle of a stream.

Counters are kept per stream with arrival times; window increases come from
`window.counter_increase` (resets count from zero). A series first seen on a stream's first
flush is a baseline only (it may carry hours of history); one that appears later counts from zero.

Per-origin attempts. Envoy does not charge retried attempts to the zone `upstream_rq_<code>`
stats (they go to the cluster-wide `cluster.<name>.retry.upstream_rq_<code>`), so a sick origin
whose failures the retries hide would show no 5xx there. Per-host stats count every attempt, but
the metrics_service sink does not carry them in Envoy 1.40; the OpenTelemetry stats sink does.
So the same gRPC port also hosts OTLP `opentelemetry.proto.collector.metrics.v1.MetricsService/
Export`, fed by the `envoy.stat_sinks.open_telemetry` sink of `ads_bootstrap(metrics_sink=True)`
(endpoint stats only, cumulative counters). Those points name a host by (cluster, address:port)
and carry the PoP as `ballast_pop`; the desired state (constructor / `update_served`) maps them
to origins. OTLP exports are unary and carry no node, so one Envoy is one gRPC connection
(`context.peer()`): its series are cumulative, a series' first sample is a baseline and a drop is
a reset (`window.counter_increase`), exactly like the metrics_service streams: a series first
seen on a connection's first export is a baseline only, one that appears on a later export
(a host the connection's Envoy started using since, e.g. a new origin address) counts from
zero, so a change that moves traffic to a new address shows in its first export. Per (PoP, group,
origin), when host stats arrived in the window:
- `requests` = increase of host `rq_total` (attempts that got a stream, retries included),
- `errors_5xx` = increase of host `rq_error` minus `cx_connect_fail` (measured: Envoy also counts
  a connect failure as an `rq_error` of that host, without `rq_total`): attempts answered 5xx
  or failed by reset/timeout, including those the retries hid from clients,
- `connect_failures` = increase of host `cx_connect_fail`,
- `abandoned` = `requests` minus the increase of host `rq_success` minus `errors_5xx`: attempts
  Envoy reset unfinished because another attempt won (a hedge) or the client left — measured
  on Envoy 1.40, they count in `rq_total` only (`decide/evidence.py` judges them);
so `error_rate` = rq_error / (rq_total + cx_connect_fail). Otherwise (older bootstraps, unknown
addresses) the zone counters as before (`upstream_rq_completed`, `upstream_rq_5xx`, connect
failures 0). Latency quantiles come from the zone histogram (`latency_from` `whole_request`:
Envoy books a retried request's whole life to the origin that answered last; where access logs
arrive, `access_log.WithAttemptLatency` replaces them with the origin's own attempts), with
their observation count and the p95's lower confidence bound for `decide/evidence.py`. Several
Envoys of one PoP add up. Caveat: a PoP where some Envoys send host stats and others do not
counts only the former.

With mTLS on the port, the sinks are bound to the sender's certificate like ADS streams are: a
metrics_service stream whose node (id and zone) is not the certificate's ends with
PERMISSION_DENIED before anything is kept (its zone stats of other PoPs are dropped anyway), and
an OTLP export keeps only the points whose `ballast_pop` is the certificate's PoP (a peer with no
node identity is refused). So a node can only ever report stats for its own PoP.

For the tier controller, `tier_pending` gives per (PoP, group, tier) the worst Envoy's peak of
`upstream_rq_pending_active` in the window (breakers and LIFO watermarks act on each Envoy's own
pool, so a PoP sum would hide one saturated Envoy behind idle ones), each Envoy's peak of
`upstream_rq_active` (utilization and lending), and the worst `upstream_queue_overloaded` where a
node reports it. Envoy sends a gauge only once it was used, so a tier cluster of the desired
state that a flushing Envoy does not report reads 0 there (no request ever reached its pool).
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp_metrics

from control_plane.decide.evidence import abandoned_attempts, quantile_lower_rank
from control_plane.decide.signals import OriginSignals, TierPending
from control_plane.desired.model import Desired
from control_plane.gen.ballast.v1 import metrics_service_pb2, prometheus_metrics_pb2
from control_plane.observe.endpoints import served_endpoints
from control_plane.observe.envoy_stats import (
    GAUGES,
    BadMetric,
    HostPoint,
    StatPoint,
    otlp_host_points,
    points,
)
from control_plane.observe.source import Signals, TierSignals, wall_ms
from control_plane.observe.window import (
    Buckets,
    HostWindow,
    OriginWindow,
    Sample,
    add_buckets,
    counter_increase,
    merge_all,
    quantile,
    split_cluster,
)
from control_plane.security.peer import NodePeerCheck, PeerPop, Vouch

log = logging.getLogger(__name__)

SERVICE = "envoy.service.metrics.v3.MetricsService"
METHOD = f"/{SERVICE}/StreamMetrics"
OTLP_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
OTLP_METHOD = f"/{OTLP_SERVICE}/Export"
MAX_HOST_WARNINGS = 100  # distinct warnings kept (and logged) per stream, and for host stats
# Names and label values are client-supplied: what one sender can make the store hold is capped
# (an Envoy of a large PoP sends a few thousand series; these are far above that).
MAX_SERIES_PER_STREAM = 20_000
MAX_HOST_SERIES = 100_000
MAX_NAME_CHARS = 512  # of a cluster, origin or endpoint address
MAX_EXPORT_POPS = 64  # PoPs one OTLP connection's exports are noted to name

SeriesKey = tuple[str, str, str]  # (stat, cluster, origin); origin "" for cluster-wide stats


@dataclass
class _Stream:
    node_id: str
    pop: str
    flushes: int = 0
    last_flush_ms: int = 0
    open: bool = True
    flush_times: list[int] = field(default_factory=list)  # arrivals within the retention
    counters: dict[SeriesKey, list[Sample]] = field(default_factory=dict)
    gauges: dict[SeriesKey, list[Sample]] = field(default_factory=dict)
    # interval histograms: (arrival ms, observation count, buckets)
    histograms: dict[SeriesKey, list[tuple[int, float, Buckets]]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)


class SinkStore:
    """Samples from every metrics stream, and the windows computed from them (a MetricSource)."""

    def __init__(self, retention_ms: int = 120_000, desired: Desired | None = None) -> None:
        self.retention_ms = retention_ms
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._served = served_endpoints(desired)
        # (connection, PoP, cluster, address, stat) -> cumulative samples
        self._hosts: dict[tuple[str, str, str, str, str], list[Sample]] = {}
        # connection -> its exports' arrivals (within the retention) and the PoPs they named
        self._exports: dict[str, list[int]] = {}
        self._export_pops: dict[str, set[str]] = {}
        self._host_warned: set[str] = set()

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None:
        """What is served changed (a reload, a rollout's look): each PoP's host stats map to
        the origins of the desired state it serves from now on (`served_endpoints`)."""
        self._served = served_endpoints(desired, serving)

    def ingest_hosts(
        self, connection: str, found: Iterable[HostPoint | BadMetric], received_ms: int
    ) -> int:
        """Record one OTLP export (cumulative per-host counters) from one Envoy connection."""
        flush: dict[tuple[str, str, str, str, str], float] = defaultdict(float)
        for point in found:
            if isinstance(point, BadMetric):
                self._warn_host(str(point))
                continue
            if max(len(point.pop), len(point.cluster), len(point.address)) > MAX_NAME_CHARS:
                self._warn_host(f"a name over {MAX_NAME_CHARS} characters: dropped")
                continue
            flush[connection, point.pop, point.cluster, point.address, point.stat] += point.value
        arrivals = self._exports.get(connection)
        previous = arrivals[-1] if arrivals else None
        for key, value in flush.items():
            samples = self._hosts.get(key)
            if samples is None:
                if len(self._hosts) >= MAX_HOST_SERIES:
                    self._warn_host(f"over {MAX_HOST_SERIES:,} host series held: new ones dropped")
                    continue
                # new on a connection that exported before: created since, so it counts from
                # zero (a change that sends traffic to a new address shows at its first export)
                samples = self._hosts[key] = [] if previous is None else [(previous, 0.0)]
            if samples and samples[-1][0] >= received_ms:
                continue  # one sample per arrival time; out-of-order exports are dropped
            samples.append((received_ms, value))
        if flush and (previous is None or received_ms > previous):
            times = self._exports.setdefault(connection, [])
            times.append(received_ms)
            del times[:sum(1 for t in times if t < received_ms - self.retention_ms)]
            pops = self._export_pops.setdefault(connection, set())
            if len(pops) < MAX_EXPORT_POPS:
                pops.update(key[1] for key in flush)
        self._prune(received_ms)
        return len(flush)

    def _warn_host(self, message: str) -> None:
        if message not in self._host_warned and len(self._host_warned) < MAX_HOST_WARNINGS:
            self._host_warned.add(message)
            log.warning("host metrics ignored: %s", message)

    def open_stream(self, node_id: str, pop: str) -> int:
        stream_id = next(self._ids)
        self._streams[stream_id] = _Stream(node_id=node_id, pop=pop)
        if not pop:
            log.warning("node %r has no locality.zone: Envoy emits no per-origin stats", node_id)
        log.info("metrics stream %d opened by node %r of PoP %r", stream_id, node_id, pop)
        return stream_id

    def close_stream(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.open = False
            log.info("metrics stream %d of node %r closed", stream_id, stream.node_id)

    def nodes(self) -> dict[str, str]:
        """Node id -> PoP of the open streams."""
        return {s.node_id: s.pop for s in self._streams.values() if s.open}

    def stats_after(self, node_id: str, pop: str, at_ms: int, flush_ms: int) -> int | None:
        """Where a window of `node_id`'s stats taken after `at_ms` starts (None: not yet known):
        its first stats flush arriving after `at_ms` is the baseline (it closes the interval
        `at_ms` fell in: traffic from before it), with the OTLP export of that flush's per-host
        stats, which comes on another connection a little apart: each connection of `pop`
        still exporting (within two flush intervals of the baseline) has its first export
        after half a flush interval before the baseline in it too. The window starts just
        after both."""
        flushes = [t for stream in self._streams.values() if stream.node_id == node_id
                   for t in stream.flush_times if t > at_ms]
        if not flushes:
            return None
        start = min(flushes)
        for connection, times in self._exports.items():
            if pop not in self._export_pops.get(connection, ()) \
                    or times[-1] <= start - 2 * flush_ms:
                continue  # another PoP's, or an Envoy that no longer exports
            near = [t for t in times if t > start - flush_ms // 2]
            if not near:
                return None  # the baseline flush's host stats are still on their way
            start = max(start, near[0])
        return start + 1

    def flushed(self, node_id: str) -> int:
        """How many stats flushes `node_id` has sent (every stream of it)."""
        return sum(s.flushes for s in self._streams.values() if s.node_id == node_id)

    def reporting_nodes(self, now_ms: int, window_ms: int) -> set[str]:
        """The node ids whose stats flushed within (now - window, now]."""
        start = now_ms - window_ms
        return {s.node_id for s in self._streams.values() if start < s.last_flush_ms <= now_ms}

    def ingest(
        self,
        stream_id: int,
        families: Iterable[prometheus_metrics_pb2.MetricFamily],
        received_ms: int,
    ) -> int:
        """Record one flush; returns how many points were kept. Bad metrics are logged, skipped."""
        stream = self._streams[stream_id]
        previous = stream.last_flush_ms if stream.flushes else None
        kept = 0
        histograms: dict[SeriesKey, tuple[float, Buckets]] = {}
        for family in families:
            for point in points(family):
                if isinstance(point, BadMetric):
                    self._warn(stream, str(point))
                    continue
                if point.local_zone and stream.pop and point.local_zone != stream.pop:
                    self._warn(stream, f"zone stat of PoP {point.local_zone[:64]!r} on a node "
                               f"of {stream.pop!r}")
                    continue
                key = (point.stat, point.cluster, point.origin)
                if not self._room_for(stream, key, histograms):
                    continue
                kept += 1
                if point.stat == "latency":
                    count, buckets = histograms.get(key, (0.0, ()))
                    histograms[key] = (count + point.value, add_buckets(buckets, point.buckets))
                elif point.stat in GAUGES:
                    stream.gauges.setdefault(key, []).append((received_ms, point.value))
                else:
                    self._add_counter(stream, key, point, received_ms, previous)
        for key, (count, buckets) in histograms.items():
            stream.histograms.setdefault(key, []).append((received_ms, count, buckets))
        stream.flushes += 1
        stream.last_flush_ms = max(stream.last_flush_ms, received_ms)
        times = stream.flush_times
        times.append(received_ms)
        old = sum(1 for t in times if t < received_ms - self.retention_ms)
        del times[:old]
        self._prune(received_ms)
        return kept

    @staticmethod
    def _add_counter(
        stream: _Stream, key: SeriesKey, point: StatPoint, received_ms: int, previous: int | None
    ) -> None:
        samples = stream.counters.get(key)
        if samples is None:
            # New on a running stream: created since the last flush, so it counts from zero.
            samples = [] if previous is None else [(previous, 0.0)]
            stream.counters[key] = samples
        if samples and samples[-1][0] == received_ms:
            samples[-1] = (received_ms, samples[-1][1] + point.value)
        else:
            samples.append((received_ms, point.value))

    def _room_for(
        self, stream: _Stream, key: SeriesKey, pending: dict[SeriesKey, tuple[float, Buckets]]
    ) -> bool:
        """Whether `stream` may hold series `key` (names within bounds, series under the cap)."""
        _, cluster, origin = key
        if len(cluster) > MAX_NAME_CHARS or len(origin) > MAX_NAME_CHARS:
            self._warn(stream, f"a cluster or origin name over {MAX_NAME_CHARS} characters")
            return False
        if key in stream.counters or key in stream.gauges or key in stream.histograms \
                or key in pending:
            return True
        held = len(stream.counters) + len(stream.gauges) + len(stream.histograms) + len(pending)
        if held >= MAX_SERIES_PER_STREAM:
            self._warn(stream, f"over {MAX_SERIES_PER_STREAM:,} series: new ones dropped")
            return False
        return True

    def _warn(self, stream: _Stream, message: str) -> None:
        if message not in stream.warned and len(stream.warned) < MAX_HOST_WARNINGS:
            stream.warned.add(message)
            log.warning("metrics from node %r ignored: %s", stream.node_id, message)

    def _prune(self, now_ms: int) -> None:
        cutoff = now_ms - self.retention_ms
        for stream_id, stream in list(self._streams.items()):
            if not stream.open and stream.last_flush_ms < cutoff:
                del self._streams[stream_id]
                continue
            for series in (stream.counters, stream.gauges):
                for key, samples in list(series.items()):
                    # keep the newest sample before the cutoff: a later window's baseline
                    old = sum(1 for t, _ in samples if t < cutoff)
                    if old > 1:
                        del samples[: old - 1]
                    if samples[-1][0] < cutoff:
                        del series[key]
            for key, flushes in list(stream.histograms.items()):
                flushes[:] = [f for f in flushes if f[0] >= cutoff]
                if not flushes:
                    del stream.histograms[key]
        for host, samples in list(self._hosts.items()):
            old = sum(1 for t, _ in samples if t < cutoff)
            if old > 1:
                del samples[: old - 1]
            if samples[-1][0] < cutoff:
                del self._hosts[host]
        for connection, times in list(self._exports.items()):
            if times[-1] < cutoff:
                del self._exports[connection]
                self._export_pops.pop(connection, None)

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return self.read_window(now_ms, window_ms)

    def read_window(self, now_ms: int, window_ms: int) -> Signals:
        """The window ending at `now_ms`: several nodes of one PoP are summed, tiers merged."""
        start = now_ms - window_ms
        origins: dict[tuple[str, str, str, str], OriginWindow] = defaultdict(OriginWindow)
        pending: dict[tuple[str, str], float] = defaultdict(float)  # (pop, cluster)
        overflow: dict[tuple[str, str], float] = defaultdict(float)  # (pop, group)
        latest_gauge: dict[tuple[str, str, str], Sample] = {}  # (pop, cluster, node): newest
        for stream in self._streams.values():
            for (stat, cluster, origin), samples in stream.counters.items():
                seen = [t for t, _ in samples if start < t <= now_ms]
                if not seen:
                    continue
                grown = counter_increase(samples, start, now_ms)
                if stat == "pending_overflow":
                    split = split_cluster(cluster)
                    if split is not None:
                        overflow[stream.pop, split[0]] += grown
                    continue
                part = OriginWindow(
                    requests=grown if stat == "completed" else 0.0,
                    errors_5xx=grown if stat == "5xx" else 0.0,
                    observed_at_ms=max(seen),
                )
                key = (stream.pop, cluster, origin, stat)
                origins[key] = origins[key].merge(part)
            for (_, cluster, origin), flushes in stream.histograms.items():
                for t, count, buckets in flushes:
                    if start < t <= now_ms:
                        key = (stream.pop, cluster, origin, "latency")
                        origins[key] = origins[key].merge(
                            OriginWindow(latency=buckets, latency_count=count, observed_at_ms=t)
                        )
            for (stat, cluster, _), samples in stream.gauges.items():
                if stat != "pending_active":
                    continue
                recent = [sample for sample in samples if start < sample[0] <= now_ms]
                key = (stream.pop, cluster, stream.node_id)
                if recent and recent[-1][0] >= latest_gauge.get(key, (0, 0.0))[0]:
                    latest_gauge[key] = recent[-1]
        for (pop, cluster, _), (_, value) in latest_gauge.items():
            pending[pop, cluster] += value
        return assemble(origins, pending, overflow, self.host_windows(start, now_ms))

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        return self.read_tier_window(now_ms, window_ms)

    def read_tier_window(self, now_ms: int, window_ms: int) -> TierSignals:
        """Per (PoP, group) -> tier: the worst Envoy's pending peak in the window, each Envoy's
        active peak and the worst queue_overloaded (see the module docstring)."""
        start = now_ms - window_ms
        # (pop, cluster) -> node -> stat -> peak; and the newest sample time
        peaks: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(dict)
        newest: dict[tuple[str, str], int] = {}
        flushed: dict[tuple[str, str], int] = {}  # (pop, node) -> newest flush in the window
        for stream in self._streams.values():
            if not stream.pop or not start < stream.last_flush_ms <= now_ms:
                continue
            node_key = (stream.pop, stream.node_id)
            flushed[node_key] = max(flushed.get(node_key, 0), stream.last_flush_ms)
            for (stat, cluster, _), samples in stream.gauges.items():
                recent = [(t, value) for t, value in samples if start < t <= now_ms]
                if not recent:
                    continue
                by_stat = peaks[stream.pop, cluster].setdefault(stream.node_id, {})
                by_stat[stat] = max(by_stat.get(stat, 0.0), *(v for _, v in recent))
                newest[stream.pop, cluster] = max(newest.get((stream.pop, cluster), 0),
                                                  *(t for t, _ in recent))
        for (pop, node), at in flushed.items():  # unused gauges of a flushing Envoy read 0
            for cluster in self._served.tier_clusters(pop):
                by_stat = peaks[pop, cluster].setdefault(node, {})
                by_stat.setdefault("pending_active", 0.0)
                by_stat.setdefault("active", 0.0)
                newest[pop, cluster] = max(newest.get((pop, cluster), 0), at)
        result: TierSignals = {}
        for (pop, cluster), nodes in sorted(peaks.items()):
            split = split_cluster(cluster)
            if split is None or not nodes:
                continue
            overloaded = [n["queue_overloaded"] for n in nodes.values() if "queue_overloaded" in n]
            result.setdefault((pop, split[0]), {})[split[1]] = TierPending(
                pending_max=max(n.get("pending_active", 0.0) for n in nodes.values()),
                observed_at_ms=newest[pop, cluster],
                active_by_node=tuple(sorted((node, n["active"]) for node, n in nodes.items()
                                            if "active" in n)),
                overloaded_max=max(overloaded) if overloaded else None,
            )
        return result

    def host_windows(self, start_ms: int, end_ms: int) -> dict[tuple[str, str, str], HostWindow]:
        """Per-host attempts in (start_ms, end_ms] per (PoP, group, origin): tiers, Envoys summed.

        Hosts whose (cluster, address) the desired state does not name are left out.
        """
        per_host: dict[tuple[str, str, str, str], dict[str, float]] = defaultdict(dict)
        owners: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}
        for (connection, pop, cluster, address, stat), samples in self._hosts.items():
            owner = self._served.of(pop).get((cluster, address))
            seen = [t for t, _ in samples if start_ms < t <= end_ms]
            if owner is None or not seen:
                continue
            host = (connection, pop, cluster, address)
            owners[host] = (pop, *owner)
            values = per_host[host]
            values[stat] = counter_increase(samples, start_ms, end_ms)
            values["seen"] = max(values.get("seen", 0.0), max(seen))
        result: dict[tuple[str, str, str], HostWindow] = {}
        for host, values in per_host.items():
            errors = max(0.0, values.get("rq_error", 0.0) - values.get("cx_connect_fail", 0.0))
            started = values.get("rq_total", 0.0)
            window = HostWindow(
                requests=started,
                errors=errors,
                connect_failures=values.get("cx_connect_fail", 0.0),
                observed_at_ms=int(values["seen"]),
                abandoned=float(abandoned_attempts(started, values["rq_success"], errors))
                if "rq_success" in values else 0.0,
            )
            key = owners[host]
            result[key] = result[key].merge(window) if key in result else window
        return result


def assemble(
    origins: dict[tuple[str, str, str, str], OriginWindow],
    pending: dict[tuple[str, str], float],
    overflow: dict[tuple[str, str], float],
    hosts: dict[tuple[str, str, str], HostWindow] | None = None,
) -> Signals:
    """Per-(PoP, cluster, origin, stat) windows -> OriginSignals per (PoP, group) -> origin.

    Tiers of a group are summed per origin; the pending gauge is the max over the group's tier
    clusters and, like queue overflow, is a group-wide number every origin of the group carries.
    `hosts` (per (PoP, group, origin)), when present for an origin, replaces the zone counters:
    requests, errors and connect failures are then attempts (see the module docstring).
    """
    hosts = hosts or {}
    per_origin: dict[tuple[str, str, str], list[OriginWindow]] = defaultdict(list)
    for (pop, cluster, origin, _), window in origins.items():
        split = split_cluster(cluster)
        if split is not None and pop:
            per_origin[pop, split[0], origin].append(window)
    for key in hosts:
        per_origin.setdefault(key, [])
    group_pending: dict[tuple[str, str], float] = defaultdict(float)
    for (pop, cluster), value in pending.items():
        split = split_cluster(cluster)
        if split is not None:
            group_pending[pop, split[0]] = max(group_pending[pop, split[0]], value)
    result: Signals = {}
    for (pop, group, origin), windows in sorted(per_origin.items()):
        merged = merge_all(windows)
        observed = round(merged.latency_count)
        rank = quantile_lower_rank(observed)
        host = hosts.get((pop, group, origin))
        if host is not None:
            merged = replace(
                merged,
                requests=host.requests,
                errors_5xx=host.errors,
                observed_at_ms=max(merged.observed_at_ms, host.observed_at_ms),
            )
        result.setdefault((pop, group), {})[origin] = OriginSignals(
            requests=round(merged.requests),
            errors_5xx=round(merged.errors_5xx),
            connect_failures=round(host.connect_failures) if host is not None else 0,
            abandoned=round(host.abandoned) if host is not None else 0,
            p50_ms=quantile(0.5, merged.latency, merged.latency_count),
            p95_ms=quantile(0.95, merged.latency, merged.latency_count),
            pending_active=group_pending.get((pop, group), 0.0),
            queue_overflow=round(overflow.get((pop, group), 0.0)),
            probe_success=None,
            observed_at_ms=merged.observed_at_ms,
            latency_samples=observed,
            p95_low_ms=(quantile(rank / observed, merged.latency, merged.latency_count)
                        if rank else None),
        )
    return result


class MetricsServicer:
    """StreamMetrics: one Envoy per stream; the first message names the node and its PoP."""

    def __init__(
        self, store: SinkStore, clock: Callable[[], int] = wall_ms,
        verify_peer: NodePeerCheck | None = None, vouch: Vouch | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._verify_peer = verify_peer
        self._vouch = vouch

    async def stream_metrics(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        stream_id: int | None = None
        release: Callable[[], None] | None = None
        try:
            async for raw in requests:
                try:
                    message = metrics_service_pb2.StreamMetricsMessage.FromString(raw)
                except DecodeError as err:
                    log.warning("undecodable StreamMetricsMessage from %s: %s", context.peer(), err)
                    continue
                if stream_id is None:
                    node = message.identifier.node
                    if not node.id:
                        log.warning("metrics from %s before any node identifier: dropped",
                                    context.peer())
                        continue
                    why = (self._verify_peer(context, node.locality.zone, node.id)
                           if self._verify_peer is not None else None)
                    if why is not None:
                        log.warning("refusing metrics stream from %s: %s", context.peer(), why)
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                    if self._vouch is not None:
                        release = await self._vouch(context)
                    stream_id = self.store.open_stream(node.id, node.locality.zone)
                self.store.ingest(stream_id, message.envoy_metrics, self.clock())
        finally:
            if stream_id is not None:
                self.store.close_stream(stream_id)
            if release is not None:
                release()
        return metrics_service_pb2.StreamMetricsResponse().SerializeToString()


class OtlpMetricsServicer:
    """OTLP Export from Envoy's OpenTelemetry stats sink: per-host counters (deltas) and gauges."""

    def __init__(
        self, store: SinkStore, clock: Callable[[], int] = wall_ms,
        peer_pop: PeerPop | None = None, vouch: Vouch | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._peer_pop = peer_pop
        self._vouch = vouch

    async def export(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            request = otlp_metrics.ExportMetricsServiceRequest.FromString(raw)
        except DecodeError as err:
            log.warning("undecodable OTLP ExportMetricsServiceRequest from %s: %s",
                        context.peer(), err)
        else:
            found: Iterable[HostPoint | BadMetric] = otlp_host_points(request)
            if self._peer_pop is not None:
                pop = self._peer_pop(context)
                if pop is None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                        "the client certificate names no node identity")
                found = [p if isinstance(p, BadMetric) or p.pop == pop else BadMetric(
                    f"host stat of PoP {p.pop[:64]!r} from a node of PoP {pop!r}")
                    for p in found]
            # a valid call: its connection is in use while it lasts, and was used when it ended
            release = await self._vouch(context) if self._vouch is not None else None
            try:
                self.store.ingest_hosts(context.peer(), found, self.clock())
            finally:
                if release is not None:
                    release()
        return otlp_metrics.ExportMetricsServiceResponse().SerializeToString()


def add_metrics_service(
    server: grpc.aio.Server, store: SinkStore, clock: Callable[[], int] = wall_ms,
    *, verify_peer: NodePeerCheck | None = None, peer_pop: PeerPop | None = None,
    vouch: Vouch | None = None,
) -> None:
    """Host the metrics_service sink and the OTLP metrics endpoint on `server` (e.g. the ADS
    server), both feeding `store`; with mTLS, `verify_peer` and `peer_pop` bind what a peer may
    report to its certificate. `vouch` is told of a metrics stream once its node passed, and of
    an OTLP export once it parsed (with mTLS: its certificate names a node): a valid stream of
    its connection, until it ends."""
    servicer = MetricsServicer(store, clock, verify_peer, vouch)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "StreamMetrics": grpc.stream_unary_rpc_method_handler(
                servicer.stream_metrics, request_deserializer=None, response_serializer=None
            )
        },
    )
    otlp = OtlpMetricsServicer(store, clock, peer_pop, vouch)
    otlp_handler = grpc.method_handlers_generic_handler(
        OTLP_SERVICE,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                otlp.export, request_deserializer=None, response_serializer=None
            )
        },
    )
    server.add_generic_rpc_handlers((handler, otlp_handler))
