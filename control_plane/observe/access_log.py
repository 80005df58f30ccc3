"""The measured pool wait and each origin's own service time: Envoy's gRPC access logs, streamed
to Ballast on the xDS port.

`add_access_log_service(server, store)` hosts `/envoy.service.accesslog.v3.AccessLogService/
StreamAccessLogs` (client streaming; the first message names the node, whose `locality.zone` is
the PoP) on an existing grpc.aio server. Listeners of nodes that asked for it carry a sampled
`envoy.access_loggers.http_grpc` logger (`translate/listeners.py`).

Which field measures the wait for a pool slot: `time_to_first_upstream_tx_byte` — from the
request's first byte at Envoy to its first byte sent upstream. It holds the filter chain (µs),
the wait in the tier pool's pending queue for a request slot or connection, and a connect when
the pool opens one; it does not hold the origin's own time (`time_to_first_upstream_rx_byte`
minus it) nor the response. With a concurrency-capped origin the wait is exactly the extra
latency clients see over the origin's own latency (measured, `tests/test_access_log_envoy.py`
and `docs/benchmarks.md`). A request that never got a byte upstream (it timed out in the
queue) counts its whole `duration` — a lower bound of its wait; one refused at once by the
pending-queue breaker (`UO`: upstream overflow) never waited and is not a sample. Entries
without a tier cluster (edge direct responses, shed tiers) are not samples either.

With mTLS on the port, a stream whose node (id, zone) is not the client certificate's ends with
PERMISSION_DENIED before any entry is kept: a node reports waits for its own PoP only.

Retried and hedged requests are not pool-wait samples (`upstream_request_attempt_count` > 1):
Envoy 1.40 logs the timing of a request's *last* attempt (measured: a request whose first
attempt failed on the primary after 300 ms and whose retry the standby answered logs
`time_to_first_upstream_tx_byte` 320 ms, the failed attempt and the backoff, not queueing).
They are counted apart (`WaitQuantiles.excluded`).

The same entries say which origin served a request and for how long (per-origin attribution):
`upstream_remote_address` is the host of the last attempt, and `time_to_last_upstream_rx_byte`
minus `time_to_first_upstream_tx_byte` is that attempt's service time — from its first byte
sent upstream to the last byte of its answer — whatever failed attempts and backoff came
before (measured above: 41.7 ms logged for a standby answering in 40 ms, where Envoy's zone
`upstream_rq_time` charged the standby the request's whole 362 ms). `served` gives them per
(PoP, group, origin), the desired state (`endpoint_origins`) naming the origin of a
(tier cluster, address); `WithAttemptLatency` puts their quantiles into the per-origin signals
in place of the zone histogram's. A request whose last attempt got no answer byte (reset,
timeout) has no service time: its failure is in the per-host error counters. A hedged request
logs the attempt that won (measured: primary stalled 80 ms, hedge after 50 ms to a 200 ms
standby; the entries name the primary with its own timing, first byte sent at 0 ms).

Per (PoP, tier cluster) the store keeps one `WaitSample` per logged request, at most
`max_samples` per cluster and `retention_ms` long; `waits` gives p50 / p95 / p99 per window.
A request a tier action shed at the edge names its (group, tier): by the route that answered
it (`<rule>@shed/<group>/<tier>`, a demoted share) or by the tier cluster whose breaker
overflowed (`UO`: a shed tier beyond its floor, a queue bounded in time); `sheds` gives each
tier's logged requests and how many of them were shed, the rollout gates' shed rate.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import grpc
from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf.message import DecodeError

from control_plane.decide.evidence import quantile_lower
from control_plane.decide.signals import WaitQuantiles
from control_plane.desired.model import Desired
from control_plane.observe.endpoints import endpoint_address, served_endpoints
from control_plane.observe.source import (
    MetricSource,
    PopGroup,
    Signals,
    TierSignals,
    TierSource,
    wall_ms,
)
from control_plane.observe.window import split_cluster
from control_plane.security.peer import NodePeerCheck, Vouch
from control_plane.translate.routes import shed_of_route

log = logging.getLogger(__name__)

SERVICE = "envoy.service.accesslog.v3.AccessLogService"
MAX_SAMPLES = 50_000  # per (PoP, tier cluster): a busy sampled tier over the retention
# (PoP, cluster) pairs held: the cluster names come from the senders, so they are capped
MAX_CLUSTERS = 4_096
MAX_NAME_CHARS = 512


@dataclass(frozen=True)
class WaitSample:
    """One logged request of a tier cluster."""

    received_ms: int
    wait_ms: float
    duration_ms: float  # the whole request at Envoy: first byte in to last byte out
    attempts: int = 1  # upstream_request_attempt_count: > 1 retried or hedged
    host: str = ""  # the last attempt's upstream "address:port" ("" when none was chosen)
    served_ms: float | None = None  # the last attempt's service time (None: no answer byte)
    started_ms: int = 0  # when the request started (Envoy's clock, epoch ms; 0: not logged)

    @property
    def at_ms(self) -> int:
        """When the request counts in a window: when it started at Envoy (entries arrive in
        batches a second or more later, so a rollout gate's window of the change's own traffic
        must not count a request served before the change), never after it arrived (a clock
        ahead of Ballast's), by its arrival where the entry does not say."""
        return min(self.started_ms or self.received_ms, self.received_ms)

    @property
    def is_wait(self) -> bool:
        """A pool-wait sample: one attempt, so the wait holds no failed attempt nor backoff."""
        return self.attempts <= 1


def _ms(duration: object) -> float:
    return duration.seconds * 1000 + duration.nanos / 1e6  # type: ignore[attr-defined]


def _host(common: object) -> str:
    socket = common.upstream_remote_address.socket_address  # type: ignore[attr-defined]
    if not socket.address:
        return ""
    return endpoint_address(socket.address, socket.port_value)


def _served_ms(common: object) -> float | None:
    if not (common.HasField("time_to_first_upstream_tx_byte")  # type: ignore[attr-defined]
            and common.HasField("time_to_last_upstream_rx_byte")):  # type: ignore[attr-defined]
        return None
    served = (_ms(common.time_to_last_upstream_rx_byte)  # type: ignore[attr-defined]
              - _ms(common.time_to_first_upstream_tx_byte))  # type: ignore[attr-defined]
    return served if math.isfinite(served) and served >= 0 else None


def wait_sample(entry: HTTPAccessLogEntry, received_ms: int) -> tuple[str, WaitSample] | None:
    """(tier cluster, sample) of one entry, or None when it is not a pool-wait sample."""
    common = entry.common_properties
    cluster = common.upstream_cluster
    if not cluster or split_cluster(cluster) is None or common.response_flags.upstream_overflow:
        return None
    if common.HasField("duration"):
        duration = _ms(common.duration)
    else:
        duration = _ms(common.time_to_last_downstream_tx_byte)
    if common.HasField("time_to_first_upstream_tx_byte"):
        wait = _ms(common.time_to_first_upstream_tx_byte)
    else:
        wait = duration
    if not (math.isfinite(wait) and math.isfinite(duration)) or wait < 0 or duration < 0:
        return None
    host = _host(common)
    return cluster, WaitSample(received_ms, wait, duration,
                               max(1, common.upstream_request_attempt_count), host[:MAX_NAME_CHARS],
                               _served_ms(common) if host else None, _started_ms(common))


def shed_of(entry: HTTPAccessLogEntry) -> tuple[str, str] | None:
    """(group, tier) a request was shed from at the edge, or None: a route that answers a
    demoted share (`shed_route_name`), or a tier pool's breaker overflow (`UO`), which Envoy
    answers with the tier's `shed_action` (a shed tier beyond its floor, a queue bounded in
    time: `translate/overflow.py`)."""
    common = entry.common_properties
    shed = shed_of_route(common.route_name)
    if shed is None and common.response_flags.upstream_overflow:
        return split_cluster(common.upstream_cluster)
    return shed


def _started_ms(common: object) -> int:
    """When the request started at Envoy (epoch ms, its clock); 0 when the entry does not say."""
    if not common.HasField("start_time"):  # type: ignore[attr-defined]
        return 0
    return int(common.start_time.ToMilliseconds())  # type: ignore[attr-defined]


def nearest_rank(ordered: list[float], q: float) -> float:
    """The nearest-rank q-quantile of ascending, non-empty `ordered`."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def quantiles(values: list[float], excluded: int = 0) -> WaitQuantiles | None:
    """Nearest-rank p50 / p95 / p99 (None without values)."""
    if not values:
        return None
    ordered = sorted(values)
    return WaitQuantiles(nearest_rank(ordered, 0.5), nearest_rank(ordered, 0.95),
                         nearest_rank(ordered, 0.99), len(ordered), excluded)


class AccessLogStore:
    """Logged requests per (PoP, tier cluster), bounded."""

    def __init__(self, retention_ms: int = 120_000, max_samples: int = MAX_SAMPLES,
                 desired: Desired | None = None) -> None:
        self.retention_ms = retention_ms
        self.max_samples = max_samples
        self._served = served_endpoints(desired)
        self._samples: dict[tuple[str, str], deque[WaitSample]] = {}
        # PoP -> (arrival ms, request start ms, group, tier) of each logged request a tier action
        # shed at the edge
        self._sheds: dict[str, deque[tuple[int, int, str, str]]] = {}
        self.received = 0  # entries seen, samples or not
        self.dropped = 0  # samples of (PoP, cluster) pairs over the bounds

    def ingest(self, pop: str, entries: Iterable[HTTPAccessLogEntry], received_ms: int) -> int:
        """Record one message's entries; returns how many were pool-wait samples."""
        kept = 0
        for entry in entries:
            self.received += 1
            shed = shed_of(entry)
            if shed is not None and pop:
                self._shed(pop, received_ms, _started_ms(entry.common_properties), *shed)
                continue
            found = wait_sample(entry, received_ms)
            if found is None or not pop:
                continue
            cluster, sample = found
            queue = self._samples.get((pop, cluster))
            if queue is None:
                if len(self._samples) >= MAX_CLUSTERS or len(cluster) > MAX_NAME_CHARS \
                        or len(pop) > MAX_NAME_CHARS:
                    self.dropped += 1
                    continue
                queue = self._samples[pop, cluster] = deque(maxlen=self.max_samples)
            queue.append(sample)
            kept += 1
        self._prune(received_ms)
        return kept

    def _shed(self, pop: str, received_ms: int, started_ms: int, group: str, tier: str
              ) -> None:
        queue = self._sheds.get(pop)
        if queue is None:
            if len(self._sheds) >= MAX_CLUSTERS or len(pop) > MAX_NAME_CHARS:
                self.dropped += 1
                return
            queue = self._sheds[pop] = deque(maxlen=self.max_samples)
        queue.append((received_ms, started_ms, group[:MAX_NAME_CHARS], tier[:MAX_NAME_CHARS]))

    def _prune(self, now_ms: int) -> None:
        cutoff = now_ms - self.retention_ms
        for key, queue in list(self._samples.items()):
            while queue and queue[0].received_ms < cutoff:
                queue.popleft()
            if not queue:
                del self._samples[key]
        for pop, sheds in list(self._sheds.items()):
            while sheds and sheds[0][0] < cutoff:
                sheds.popleft()
            if not sheds:
                del self._sheds[pop]

    def sheds(self, now_ms: int, window_ms: int) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(PoP, group, tier) -> (logged requests, of them shed at the edge) that started in
        (now - window, now]: the tier's shed rate (the access log samples every request alike,
        so the share is the tier's). A request counts by when it started at Envoy (entries
        arrive in batches, a second or more later: a rollout gate's window must not count a
        request served before the change), by its arrival where the entry does not say. A shed
        request names its (group, tier) by the route that answered it (`translate/routes.py`
        `shed_route_name`); the others by their tier cluster."""
        start = now_ms - window_ms
        counts: dict[tuple[str, str, str], list[int]] = {}
        for (pop, cluster), queue in self._samples.items():
            split = split_cluster(cluster)
            found = sum(1 for s in queue if start < s.at_ms <= now_ms)
            if split is not None and found:
                counts.setdefault((pop, *split), [0, 0])[0] += found
        for pop, sheds in self._sheds.items():
            for at, started, group, tier in sheds:
                if start < (started or at) <= now_ms:
                    count = counts.setdefault((pop, group, tier), [0, 0])
                    count[0] += 1
                    count[1] += 1
        return {key: (requests, shed) for key, (requests, shed) in sorted(counts.items())}

    def samples(self, now_ms: int, window_ms: int) -> dict[tuple[str, str], list[WaitSample]]:
        """(PoP, tier cluster) -> the samples that started in (now - window, now]
        (`WaitSample.at_ms`)."""
        start = now_ms - window_ms
        return {
            key: [s for s in queue if start < s.at_ms <= now_ms]
            for key, queue in self._samples.items()
        }

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None:
        """What is served changed (a reload, a rollout's look): each PoP's hosts map to the
        origins of the desired state it serves from now on (`served_endpoints`)."""
        self._served = served_endpoints(desired, serving)

    def waits(self, now_ms: int, window_ms: int) -> dict[PopGroup, dict[str, WaitQuantiles]]:
        """(PoP, group) -> tier -> pool-wait quantiles of the window's single-attempt requests
        (tiers without one are absent; retried and hedged ones are counted in `excluded`)."""
        result: dict[PopGroup, dict[str, WaitQuantiles]] = {}
        for (pop, cluster), found in sorted(self.samples(now_ms, window_ms).items()):
            split = split_cluster(cluster)
            waits = [s.wait_ms for s in found if s.is_wait]
            summary = quantiles(waits, len(found) - len(waits))
            if split is not None and summary is not None:
                result.setdefault((pop, split[0]), {})[split[1]] = summary
        return result

    def served(self, now_ms: int, window_ms: int) -> dict[tuple[str, str, str], list[float]]:
        """(PoP, group, origin) -> the service times of the window's last attempts that origin
        answered, tiers summed; a PoP that logged requests in the window but none an origin
        answered maps that origin to no key (see `reporting`)."""
        result: dict[tuple[str, str, str], list[float]] = {}
        for (pop, cluster), found in self.samples(now_ms, window_ms).items():
            for sample in found:
                owner = self._served.of(pop).get((cluster, sample.host))
                if owner is not None and sample.served_ms is not None:
                    result.setdefault((pop, *owner), []).append(sample.served_ms)
        return result

    def reporting(self, now_ms: int, window_ms: int) -> set[str]:
        """The PoPs with a logged request in the window: their Envoys send access logs."""
        return {pop for (pop, _), found in self.samples(now_ms, window_ms).items() if found}


class WithWaits:
    """A TierSource: the gauges' readings (sink or Prometheus) with the access logs' wait added.

    The wait always comes from the access-log sink, whatever source the gauges come from."""

    def __init__(self, gauges: TierSource, store: AccessLogStore) -> None:
        self.gauges = gauges
        self.store = store

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        readings = await self.gauges.tier_pending(now_ms, window_ms)
        waits = self.store.waits(now_ms, window_ms)
        return {
            key: {tier: replace(r, wait=waits.get(key, {}).get(tier)) for tier, r in by.items()}
            for key, by in readings.items()
        }


class WithAttemptLatency:
    """A MetricSource: the passive source's signals, with each origin's latency taken from the
    access logs' last attempts it answered (`latency_from` `final_attempt`) in every PoP whose
    Envoys send access logs; other PoPs keep the zone histogram's (`whole_request`), which is
    all Envoy offers without access logs, and the record says which one it was."""

    def __init__(self, passive: MetricSource, store: AccessLogStore) -> None:
        self.passive = passive
        self.store = store

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return attempt_latency(await self.passive.window(now_ms, window_ms),
                               self.store.served(now_ms, window_ms),
                               self.store.reporting(now_ms, window_ms))


def attempt_latency(
    passive: Signals, served: dict[tuple[str, str, str], list[float]], reporting: set[str]
) -> Signals:
    """`passive` with p50 / p95 / their lower bound and sample count replaced, per origin of the
    PoPs in `reporting`, by the quantiles of `served` (none: no latency evidence)."""
    result: Signals = {}
    for (pop, group), origins in passive.items():
        if pop not in reporting:
            result[pop, group] = origins
            continue
        out = {}
        for name, signals in origins.items():
            ordered = sorted(served.get((pop, group, name), ()))
            out[name] = replace(
                signals,
                p50_ms=nearest_rank(ordered, 0.5) if ordered else None,
                p95_ms=nearest_rank(ordered, 0.95) if ordered else None,
                p95_low_ms=quantile_lower(ordered, 0.95),
                latency_samples=len(ordered),
                latency_from="final_attempt",
            )
        result[pop, group] = out
    return result


class AccessLogServicer:
    """StreamAccessLogs: one Envoy per stream; the first message names the node and its PoP."""

    def __init__(
        self, store: AccessLogStore, clock: Callable[[], int] = wall_ms,
        verify_peer: NodePeerCheck | None = None, vouch: Vouch | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._verify_peer = verify_peer
        self._vouch = vouch

    async def stream_access_logs(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        pop: str | None = None
        release: Callable[[], None] | None = None
        try:
            async for raw in requests:
                try:
                    message = als_pb2.StreamAccessLogsMessage.FromString(raw)
                except DecodeError as err:
                    log.warning("undecodable StreamAccessLogsMessage from %s: %s",
                                context.peer(), err)
                    continue
                if pop is None:
                    node = message.identifier.node
                    if not node.id:
                        log.warning("access logs from %s before any node identifier: dropped",
                                    context.peer())
                        continue
                    why = (self._verify_peer(context, node.locality.zone, node.id)
                           if self._verify_peer is not None else None)
                    if why is not None:
                        log.warning("refusing access logs from %s: %s", context.peer(), why)
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                    pop = node.locality.zone
                    if self._vouch is not None:
                        release = await self._vouch(context)
                self.store.ingest(pop, message.http_logs.log_entry, self.clock())
        finally:
            if release is not None:
                release()
        return als_pb2.StreamAccessLogsResponse().SerializeToString()


def add_access_log_service(
    server: grpc.aio.Server, store: AccessLogStore, clock: Callable[[], int] = wall_ms,
    *, verify_peer: NodePeerCheck | None = None, vouch: Vouch | None = None,
) -> None:
    """Host Envoy's AccessLogService on `server` (e.g. the ADS server), feeding `store`; with
    mTLS, `verify_peer` binds a stream's node to the peer's certificate. `vouch` is told of a
    stream once its node passed (a valid stream of its connection, until it ends)."""
    servicer = AccessLogServicer(store, clock, verify_peer, vouch)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "StreamAccessLogs": grpc.stream_unary_rpc_method_handler(
                servicer.stream_access_logs, request_deserializer=None, response_serializer=None
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
