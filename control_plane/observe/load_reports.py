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
no more; only the (PoP, group, origin) the desired state names are kept, and samples (and
closed streams) go after the retention. Each series keeps its counts cumulative, so a window
costs two bisections per series whatever its length.
"""

from __future__ import annotations

import bisect
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
PRUNE_EVERY_MS = 1_000  # how often old samples are looked for (by report arrival times)
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


Counts = tuple[float, float, float, float]  # issued, succeeded, failed, failed connections
ZERO: Counts = (0.0, 0.0, 0.0, 0.0)


@dataclass(slots=True)
class _Series:
    """One (group, origin) of one stream, or one group's drops: per sample (a report, or the
    reports of one merge period) its time, the counts since the series began (cumulative, so a
    window is one difference: two bisections, whatever its length) and the requests in progress
    it said. `base`: the counts (and in progress) of the last sample pruned."""

    at: list[int] = field(default_factory=list)
    totals: list[Counts] = field(default_factory=list)
    in_progress: list[float] = field(default_factory=list)
    base: Counts = ZERO
    base_in_progress: float = 0.0

    def add(self, at_ms: int, counts: Counts, in_progress: float) -> None:
        """Counts of a report at `at_ms` (the sample there, if any, grows)."""
        last = self.totals[-1] if self.totals else self.base
        total: Counts = (last[0] + counts[0], last[1] + counts[1], last[2] + counts[2],
                         last[3] + counts[3])
        if self.at and self.at[-1] == at_ms:
            self.totals[-1], self.in_progress[-1] = total, in_progress
        else:
            self.at.append(at_ms)
            self.totals.append(total)
            self.in_progress.append(in_progress)

    def prune(self, cutoff_ms: int) -> bool:
        """Drop the samples before `cutoff_ms` but the newest of them (a later window's
        start); False when nothing is left after the cutoff."""
        old = bisect.bisect_left(self.at, cutoff_ms)
        if old > 1:
            self.base, self.base_in_progress = self.totals[old - 2], self.in_progress[old - 2]
            del self.at[: old - 1], self.totals[: old - 1], self.in_progress[: old - 1]
        return bool(self.at) and self.at[-1] >= cutoff_ms

    def window(self, start_ms: int, end_ms: int) -> tuple[Counts, float, float, int] | None:
        """(counts in (start, end], in progress at the start and at the end, newest sample's
        time), None without a sample in the window."""
        first = bisect.bisect_right(self.at, start_ms)
        last = bisect.bisect_right(self.at, end_ms)
        if first == last:
            return None
        before = self.totals[first - 1] if first else self.base
        after = self.totals[last - 1]
        counts: Counts = (after[0] - before[0], after[1] - before[1], after[2] - before[2],
                          after[3] - before[3])
        started = self.in_progress[first - 1] if first else self.base_in_progress
        return counts, started, self.in_progress[last - 1], self.at[last - 1]


@dataclass
class _Stream:
    node_id: str
    pop: str
    open: bool = True
    last_ms: int = 0
    reports: int = 0
    by_endpoint: int = 0  # entries attributed per endpoint (endpoint granularity)
    clusters: set[str] = field(default_factory=set)  # groups' clusters its reports named
    series: dict[tuple[str, str], _Series] = field(default_factory=dict)
    dropped: dict[str, _Series] = field(default_factory=dict)  # group -> its drops (issued)
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
        self._pruned_ms = 0
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
        kept: dict[tuple[str, str], list[float]] = {}  # the four counts, then in progress
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
                    _add(kept.setdefault((group, origin), [0.0] * 5), counts)
        # reports of one merge period are one sample, at the period's first report
        merge = stream.reports > 0 and received_ms - stream.last_ms < MERGE_MS
        stamp = stream.last_ms if merge else received_ms
        for key, (issued, succeeded, failed, connections, in_progress) in kept.items():
            stream.series.setdefault(key, _Series()).add(
                stamp, (issued, succeeded, failed, connections), in_progress)
        for group, count in dropped.items():
            stream.dropped.setdefault(group, _Series()).add(stamp, (count, 0.0, 0.0, 0.0), 0.0)
        stream.last_ms = stamp
        stream.reports += 1
        if received_ms - self._pruned_ms >= PRUNE_EVERY_MS:
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
        """Samples older than the retention go (but each series' newest of them), then the
        series left empty and the closed streams without any; at most every
        `PRUNE_EVERY_MS`, so a report costs its own series, not every stream's."""
        self._pruned_ms = now_ms
        cutoff = now_ms - self.retention_ms
        for stream_id, stream in list(self._streams.items()):
            for held in (stream.series, stream.dropped):
                for key in [key for key, series in held.items() if not series.prune(cutoff)]:
                    del held[key]  # type: ignore[arg-type]
            if not stream.open and stream.last_ms < cutoff:
                del self._streams[stream_id]

    def report_windows(self, now_ms: int, window_ms: int
                       ) -> dict[tuple[str, str, str], ReportWindow]:
        """Per (PoP, group, origin): the window's reports, the PoP's streams summed."""
        start = now_ms - window_ms
        # per key: issued, succeeded, failed, failed connections, in progress at the start and
        # at the end, newest sample (one list per key, one ReportWindow per key at the end)
        totals: dict[tuple[str, str, str], list[float]] = {}
        for stream in self._streams.values():
            for (group, origin), series in stream.series.items():
                found = series.window(start, now_ms)
                if found is None:
                    continue
                counts, started, ended, newest = found
                held = totals.get((stream.pop, group, origin))
                if held is None:
                    totals[stream.pop, group, origin] = [*counts, started, ended, newest]
                    continue
                for index in range(4):
                    held[index] += counts[index]
                held[4] += started
                held[5] += ended
                held[6] = max(held[6], newest)
        return {key: ReportWindow(*held[:6], observed_at_ms=int(held[6]))
                for key, held in totals.items()}

    def _dropped(self, now_ms: int, window_ms: int) -> dict[tuple[str, str], float]:
        dropped: dict[tuple[str, str], float] = defaultdict(float)
        for stream in self._streams.values():
            for group, series in stream.dropped.items():
                found = series.window(now_ms - window_ms, now_ms)
                if found is not None:
                    dropped[stream.pop, group] += found[0][0]
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


def _add(kept: list[float], counts: UpstreamLocalityStats | UpstreamEndpointStats) -> None:
    kept[0] += counts.total_issued_requests
    kept[1] += counts.total_successful_requests
    kept[2] += counts.total_error_requests
    if isinstance(counts, UpstreamLocalityStats):
        kept[3] += counts.total_fail_connections
    kept[4] += counts.total_requests_in_progress
