"""Load reports (LRS) as a metric source: what each client saw of each origin, per locality.

Envoys whose bootstrap sets `cluster_manager.load_stats_config` (`ballast bootstrap
--load-reports`) and proxyless gRPC clients (their clusters name `lrs_server: self`) stream
`LoadStatsRequest`s to Ballast (`lrs_service.py`). Each report holds, per cluster and locality,
what happened since the client's previous report (counters reset at each report, one consumer):
requests issued, succeeded and failed ("errors at the endpoint": 5xx for HTTP; DEADLINE_EXCEEDED,
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, UNKNOWN, DATA_LOSS for gRPC), and the requests in progress
when it was sent (a gauge); with endpoint granularity (asked for with
`report_endpoint_granularity`; Envoy answers it, gRPC reports localities only) the same per
endpoint address, and per cluster the requests dropped by circuit breaking.

How a report maps to origins: the cluster names a group (a tier cluster `<group>.<tier>`, or a
gRPC service's cluster `<service>`) of the desired state the sender's PoP serves, a locality's
zone names the origin (`translate/endpoints.py`, `grpc_resources.py`), an endpoint's address
names it through the desired state (`endpoints.endpoint_origins`); anything else is dropped
with a warning (a cluster that is no group's: the bootstrap's own, mirrors, silently). Tiers
and the clients of one PoP add up.

The window (start, end] of one (PoP, group, origin) is the sum of the reports that arrived in
it, as the sink sums interval histograms, so it holds the same values the sink's and
Prometheus's windows hold, and the same evidence rules judge it (`decide/evidence.py`):
`requests` = issued (attempts started), `errors_5xx` = failed (less the failed connections
where a report gives them, which are `connect_failures`), `queue_overflow` = the group's dropped
requests, `abandoned` the attempts issued that neither succeeded nor failed and are no longer in
progress (a hedge another attempt won, a client that went away: `abandoned_attempts` with the
growth of the requests in progress), `in_flight` those in progress at the window's end. Reports
carry no latency: p50 and p95 are None (`latency_from` `none`) unless the active probes or
Envoy's access logs fill them.

Bounds (`docs/security.md`): what a report may list (clusters, localities, endpoints, name
lengths) is checked before anything is kept (`check_report`); reports of one stream arriving
closer than `MERGE_MS` are added into one sample, so a client sending faster than asked holds
no more; only the (PoP, group, origin) the desired state names are kept, and a closed stream's
samples go after the retention.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.config.endpoint.v3.load_report_pb2 import UpstreamEndpointStats, UpstreamLocalityStats
from envoy.service.load_stats.v3.lrs_pb2 import LoadStatsRequest

from control_plane.decide.evidence import abandoned_attempts
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import Desired
from control_plane.observe.endpoints import endpoint_address
from control_plane.observe.source import Signals, TierSignals
from control_plane.translate.clusters import cluster_name

log = logging.getLogger(__name__)

MAX_CLUSTERS_PER_REPORT = 4_096
MAX_LOCALITIES_PER_CLUSTER = 1_024
MAX_ENDPOINTS_PER_LOCALITY = 1_024
MAX_NAME_CHARS = 512
MERGE_MS = 250  # reports of one stream closer than this are one sample
MAX_WARNINGS = 100  # distinct warnings logged per stream

# cluster -> (group, its origins, (address -> origin))
ClusterMap = dict[str, tuple[str, frozenset[str], dict[str, str]]]


class BadReport(ValueError):
    """A report over a bound; the message says which (the stream ends with it)."""


def check_report(request: LoadStatsRequest) -> None:
    """Every list and name of the report within its bound (see the module docstring)."""
    if len(request.cluster_stats) > MAX_CLUSTERS_PER_REPORT:
        raise BadReport(f"{len(request.cluster_stats):,} clusters in one report; the limit is "
                        f"{MAX_CLUSTERS_PER_REPORT:,}")
    for stats in request.cluster_stats:
        if len(stats.cluster_name) > MAX_NAME_CHARS:
            raise BadReport(f"a cluster name of {len(stats.cluster_name):,} characters; the "
                            f"limit is {MAX_NAME_CHARS}")
        if len(stats.upstream_locality_stats) > MAX_LOCALITIES_PER_CLUSTER:
            raise BadReport(f"{len(stats.upstream_locality_stats):,} localities in one cluster; "
                            f"the limit is {MAX_LOCALITIES_PER_CLUSTER:,}")
        for locality in stats.upstream_locality_stats:
            if len(locality.locality.zone) > MAX_NAME_CHARS:
                raise BadReport(f"a locality zone of {len(locality.locality.zone):,} "
                                f"characters; the limit is {MAX_NAME_CHARS}")
            if len(locality.upstream_endpoint_stats) > MAX_ENDPOINTS_PER_LOCALITY:
                raise BadReport(f"{len(locality.upstream_endpoint_stats):,} endpoints in one "
                                f"locality; the limit is {MAX_ENDPOINTS_PER_LOCALITY:,}")


def cluster_map(desired: Desired) -> ClusterMap:
    """Every cluster a client of `desired` reports on: tier clusters and gRPC services."""
    clusters: ClusterMap = {}
    for group in desired.origin_groups:
        names = frozenset(o.name for o in group.origins)
        addresses = {endpoint_address(o.address, o.port): o.name for o in reversed(group.origins)}
        reported = ([group.name] if group.grpc is not None
                    else [cluster_name(group.name, tier.name) for tier in group.tiers])
        for cluster in reported:
            clusters[cluster] = (group.name, names, addresses)
    return clusters


@dataclass
class _Sample:
    """One report (or several closer than `MERGE_MS`) of one (group, origin) of one stream."""

    at_ms: int
    issued: float = 0.0
    succeeded: float = 0.0
    failed: float = 0.0
    failed_connections: float = 0.0
    in_progress: float = 0.0


@dataclass
class _Stream:
    node_id: str
    pop: str
    open: bool = True
    last_ms: int = 0
    reports: int = 0
    by_endpoint: int = 0  # entries attributed per endpoint (endpoint granularity)
    clusters: set[str] = field(default_factory=set)  # groups' clusters its reports named
    series: dict[tuple[str, str], list[_Sample]] = field(default_factory=dict)
    dropped: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # group -> drops
    warned: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class ReportWindow:
    """One (PoP, group, origin) over a window, the PoP's clients summed."""

    issued: float = 0.0
    succeeded: float = 0.0
    failed: float = 0.0
    failed_connections: float = 0.0
    in_progress_start: float = 0.0
    in_progress_end: float = 0.0
    observed_at_ms: int = 0

    @property
    def errors(self) -> float:
        """Failed attempts, less failed connections (an Envoy counts one as an error it never
        issued)."""
        return max(0.0, self.failed - self.failed_connections)

    @property
    def abandoned(self) -> int:
        """Attempts issued that neither succeeded nor failed and are no longer in progress."""
        return abandoned_attempts(self.issued, self.succeeded, self.errors,
                                  self.in_progress_end - self.in_progress_start)


class LoadReports:
    """Samples from every load-report stream, and the windows computed from them (a
    MetricSource; a TierSource with no readings: reports say nothing of queues)."""

    def __init__(self, desired: Desired | None = None, retention_ms: int = 120_000) -> None:
        self.retention_ms = retention_ms
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._maps: dict[str, ClusterMap] = {}  # digest -> its clusters
        self._default: ClusterMap = {}
        self._by_pop: dict[str, ClusterMap] = {}
        if desired is not None:
            self.update_served(desired, {})

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None:
        """What is served changed: each PoP's reports map through the desired state it
        serves from now on (as the sink's host stats do, `endpoints.served_endpoints`)."""
        built: dict[str, ClusterMap] = {}
        for version in (desired, *serving.values()):
            if version.digest not in built:
                built[version.digest] = self._maps.get(version.digest) or cluster_map(version)
        self._maps = built
        self._default = built[desired.digest]
        self._by_pop = {pop: built[version.digest] for pop, version in serving.items()}

    def clusters(self, pop: str) -> ClusterMap:
        return self._by_pop.get(pop, self._default)

    def open_stream(self, node_id: str, pop: str) -> int:
        stream_id = next(self._ids)
        self._streams[stream_id] = _Stream(node_id, pop)
        log.info("load reports stream %d opened by node %r of PoP %r", stream_id, node_id, pop)
        return stream_id

    def close_stream(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.open = False

    def nodes(self) -> dict[str, str]:
        """Node id -> PoP of the open streams."""
        return {s.node_id: s.pop for s in self._streams.values() if s.open}

    def reporting_nodes(self, now_ms: int, window_ms: int) -> set[str]:
        """The node ids whose reports arrived within (now - window, now]."""
        start = now_ms - window_ms
        return {s.node_id for s in self._streams.values() if start < s.last_ms <= now_ms}

    def reporters(self) -> list[dict[str, object]]:
        """Each open stream: its node, PoP, reports so far, the newest one's time (unix ms),
        the groups' clusters its reports named and whether they name endpoints (`/status`)."""
        return [{"node": s.node_id, "pop": s.pop, "reports": s.reports, "last_report_ms":
                 s.last_ms, "clusters": sorted(s.clusters), "per_endpoint": s.by_endpoint > 0}
                for s in self._streams.values() if s.open]

    def ingest(self, stream_id: int, request: LoadStatsRequest, received_ms: int) -> int:
        """Record one report (checked with `check_report` first); returns how many
        (group, origin) entries were kept."""
        stream = self._streams[stream_id]
        clusters = self.clusters(stream.pop)
        kept: dict[tuple[str, str], _Sample] = {}
        dropped: dict[str, float] = defaultdict(float)
        for stats in request.cluster_stats:
            mapped = clusters.get(stats.cluster_name)
            if mapped is None:  # Ballast's own (ballast_xds), mirrors: nobody's signals
                continue
            group, origins, addresses = mapped
            stream.clusters.add(stats.cluster_name)
            dropped[group] += stats.total_dropped_requests
            for locality in stats.upstream_locality_stats:
                for origin, counts in self._attributed(stream, locality, origins, addresses):
                    sample = kept.setdefault((group, origin), _Sample(received_ms))
                    _add(sample, counts)
        merge = stream.reports > 0 and received_ms - stream.last_ms < MERGE_MS
        for key, sample in kept.items():
            series = stream.series.setdefault(key, [])
            if merge and series and series[-1].at_ms == stream.last_ms:
                _add(series[-1], sample)
                series[-1].in_progress = sample.in_progress
            else:
                series.append(sample)
        for group, count in dropped.items():
            drops = stream.dropped.setdefault(group, [])
            if merge and drops and drops[-1][0] == stream.last_ms:
                drops[-1] = (drops[-1][0], drops[-1][1] + count)
            else:
                drops.append((received_ms, count))
        if not merge:
            stream.last_ms = received_ms
        stream.reports += 1
        self._prune(received_ms)
        return len(kept)

    def _attributed(
        self, stream: _Stream, locality: UpstreamLocalityStats, origins: frozenset[str],
        addresses: dict[str, str],
    ) -> list[tuple[str, UpstreamLocalityStats | UpstreamEndpointStats]]:
        """(origin, counts) of a locality: per endpoint by address where the report has
        endpoints, else the locality's totals by its zone."""
        if locality.upstream_endpoint_stats:
            found = []
            for endpoint in locality.upstream_endpoint_stats:
                socket = endpoint.address.socket_address
                address = endpoint_address(socket.address, socket.port_value)
                origin = addresses.get(address)
                if origin is None:
                    self._warn(stream, f"endpoint {address[:64]!r} is no origin of its cluster")
                else:
                    found.append((origin, endpoint))
            stream.by_endpoint += len(found)
            return found
        zone = locality.locality.zone
        if zone not in origins:
            self._warn(stream, f"locality zone {zone[:64]!r} is no origin of its cluster")
            return []
        return [(zone, locality)]

    def _warn(self, stream: _Stream, message: str) -> None:
        if message not in stream.warned and len(stream.warned) < MAX_WARNINGS:
            stream.warned.add(message)
            log.warning("load report of node %r ignored in part: %s", stream.node_id, message)

    def _prune(self, now_ms: int) -> None:
        cutoff = now_ms - self.retention_ms
        for stream_id, stream in list(self._streams.items()):
            if not stream.open and stream.last_ms < cutoff:
                del self._streams[stream_id]
                continue
            for key, samples in list(stream.series.items()):
                old = sum(1 for s in samples if s.at_ms < cutoff)
                if old > 1:  # the newest before the cutoff: a later window's in-progress start
                    del samples[: old - 1]
                if samples[-1].at_ms < cutoff:
                    del stream.series[key]
            for group, drops in list(stream.dropped.items()):
                drops[:] = [d for d in drops if d[0] >= cutoff]
                if not drops:
                    del stream.dropped[group]

    def report_windows(self, now_ms: int, window_ms: int
                       ) -> dict[tuple[str, str, str], ReportWindow]:
        """Per (PoP, group, origin): the window's reports, the PoP's streams summed."""
        start = now_ms - window_ms
        totals: dict[tuple[str, str, str], ReportWindow] = {}
        for stream in self._streams.values():
            for (group, origin), samples in stream.series.items():
                inside = [s for s in samples if start < s.at_ms <= now_ms]
                if not inside:
                    continue
                before = [s for s in samples if s.at_ms <= start]
                key = (stream.pop, group, origin)
                held = totals.get(key, ReportWindow())
                totals[key] = ReportWindow(
                    issued=held.issued + sum(s.issued for s in inside),
                    succeeded=held.succeeded + sum(s.succeeded for s in inside),
                    failed=held.failed + sum(s.failed for s in inside),
                    failed_connections=held.failed_connections
                    + sum(s.failed_connections for s in inside),
                    in_progress_start=held.in_progress_start
                    + (before[-1].in_progress if before else 0.0),
                    in_progress_end=held.in_progress_end + inside[-1].in_progress,
                    observed_at_ms=max(held.observed_at_ms, inside[-1].at_ms),
                )
        return totals

    def _dropped(self, now_ms: int, window_ms: int) -> dict[tuple[str, str], float]:
        start = now_ms - window_ms
        dropped: dict[tuple[str, str], float] = defaultdict(float)
        for stream in self._streams.values():
            for group, drops in stream.dropped.items():
                dropped[stream.pop, group] += sum(n for t, n in drops if start < t <= now_ms)
        return dropped

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return self.read_window(now_ms, window_ms)

    def read_window(self, now_ms: int, window_ms: int) -> Signals:
        """The window ending at `now_ms` as the controllers read it (module docstring)."""
        dropped = self._dropped(now_ms, window_ms)
        result: Signals = {}
        for (pop, group, origin), held in sorted(self.report_windows(now_ms, window_ms).items()):
            result.setdefault((pop, group), {})[origin] = OriginSignals(
                requests=round(held.issued),
                errors_5xx=round(held.errors),
                connect_failures=round(held.failed_connections),
                abandoned=held.abandoned,
                in_flight=held.in_progress_end,
                p50_ms=None,
                p95_ms=None,
                pending_active=0.0,
                queue_overflow=round(dropped.get((pop, group), 0.0)),
                probe_success=None,
                observed_at_ms=held.observed_at_ms,
                latency_samples=0,
                latency_from="none",
            )
        return result

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        """Nothing: a load report says nothing of a tier's queue (tier actions hold)."""
        return {}


def _add(sample: _Sample, counts: UpstreamLocalityStats | UpstreamEndpointStats | _Sample
         ) -> None:
    if isinstance(counts, _Sample):
        sample.issued += counts.issued
        sample.succeeded += counts.succeeded
        sample.failed += counts.failed
        sample.failed_connections += counts.failed_connections
        return
    sample.issued += counts.total_issued_requests
    sample.succeeded += counts.total_successful_requests
    sample.failed += counts.total_error_requests
    sample.in_progress += counts.total_requests_in_progress
    if isinstance(counts, UpstreamLocalityStats):
        sample.failed_connections += counts.total_fail_connections
