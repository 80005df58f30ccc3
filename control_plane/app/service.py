"""`BallastService`: the whole running control plane, wired.

Start-up order matters and is the point of this module:
1. load and validate the desired state (refuse to start on problems);
2. open the state store and restore weights, streak counters, ramps and active tier actions
   (refuse to start on corrupted state) into the intent owner, under the same carry-over rule as
   a reload — before the gRPC port is even bound, so a reconnecting Envoy never sees default
   weights or lifted shedding mid-incident;
3. translate every PoP's resources on a worker thread (Envoys reconnecting after a restart find
   them ready), then bind xDS (ADS + the metrics_service sink on the same port), then the admin
   API;
4. start the reconcile loop, the active probes and the desired-state watcher; report ready.
Shutdown runs the other way and ends with the decision log and the state store closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import sqlite3
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from control_plane.admin.api import AdminApi
from control_plane.admin.auth import AdminAuth, AdminAuthError, TokenFile, check_bind
from control_plane.admin.dashboard import Dashboard
from control_plane.admin.decision_feed import DecisionFeed
from control_plane.ads.snapshots import SnapshotCache
from control_plane.app.heap import release_heap, settle_heap
from control_plane.app.reconcile import Reconciler
from control_plane.app.reload import DesiredFileWatcher
from control_plane.app.replication import Replication
from control_plane.app.server import BallastServer, translate_intent
from control_plane.app.tasks import cancel_all
from control_plane.decisions.budget import DEFAULT_BUDGET, BudgetConfig, RecordBudget
from control_plane.decisions.log import DecisionLog, format_time, log_files
from control_plane.decisions.read import FileSource
from control_plane.desired import DesiredStateError, parse_desired, read_desired_bytes
from control_plane.desired.model import Desired
from control_plane.desired.warnings import desired_warnings
from control_plane.intent.carry_over import carry_over
from control_plane.intent.etcd_store import Deposed, EtcdStore, StoreUnavailable, parse_store_url
from control_plane.intent.replicated_store import ReplicatedStore
from control_plane.intent.running import RunningIntent, ramp_key, tier_key
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.state_dir_lock import StateDirLock
from control_plane.intent.store import RAMP_KIND, Snapshot
from control_plane.observe.access_log import (
    AccessLogStore,
    WithAttemptLatency,
    WithWaits,
    add_access_log_service,
)
from control_plane.observe.certificates import CertificateStatus
from control_plane.observe.combine import CombinedSource
from control_plane.observe.probes import Prober, probe_targets
from control_plane.observe.prometheus import PrometheusSource
from control_plane.observe.sink import SinkStore, add_metrics_service
from control_plane.observe.source import MetricSource, wall_ms
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.security.peer import check_node_peer, peer_pop
from control_plane.security.tls import ReloadingCredentials, ReloadingSslContext, TlsFiles
from control_plane.translate import render_json
from control_plane.translate.diff import ResourceChange, diff_renderings, format_changes, summarize
from control_plane.translate.resources import Capabilities, PopResources

log = logging.getLogger(__name__)

MetricSourceKind = Literal["sink", "prometheus"]
DIFF_LINES_IN_RECORD = 60
RECORD_OVERHEAD_BYTES = 256  # time, seq, kind and the empty fields of a record
UNWRITTEN_RECORDS = 1000  # records kept in memory while the log cannot be written (disk full)
PROBLEMS_IN_RECORD = 50
MIN_FREE_BYTES = 1024 * 1024  # a reload must be able to save the state and record it


@dataclass(frozen=True)
class ServiceConfig:
    desired_path: Path
    state_dir: Path
    xds_address: str = "127.0.0.1:18000"
    admin_address: str | None = "127.0.0.1:18001"
    metrics_source: MetricSourceKind = "sink"
    prometheus_url: str | None = None
    probes: bool = True
    probe_interval_ms: int | None = None  # default: the groups' health_check interval
    reconcile_interval_ms: int | None = None  # default: each group's failover interval
    reload_poll_s: float = 0.5
    debounce_s: float = 0.1
    seed: int = 0
    routine_records: BudgetConfig = DEFAULT_BUDGET
    accept_empty_state: bool = False  # an empty state.db next to a decision log: start anyway
    tls: TlsFiles | None = None  # mTLS on the xDS/sink port when set
    admin_token_file: Path | None = None  # bearer token the admin API requires when set
    admin_tls: bool = False  # admin API on HTTPS with `tls`'s files; admin client certs accepted
    store_url: str | None = None  # etcd://HOST:PORT[,...]: replicas share the intent there
    replica_id: str | None = None  # this replica's name among them (default: the xDS address)
    leader_ttl_s: int = 5  # the leader's lease; a follower takes over within it
    # what start-up built kept out of full garbage collections (`app/heap.py`); the process's
    # own choice (`ballast serve` makes it), since it freezes the whole process's heap
    freeze_heap: bool = False


class BallastService:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.metrics = BallastMetrics()
        self.ready = False
        self.restored_groups = 0
        self.restored_tier_actions = 0
        self.started_at_ms = 0
        self._heap_settled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._desired_bytes = b""
        self._reload_lock = asyncio.Lock()  # one reload at a time (file watcher, SIGHUP)
        self.routine_budget = RecordBudget(config.routine_records)
        # records the log could not take (disk full), oldest first, written once it can again
        self._unwritten: deque[tuple[str, bool, dict[str, Any], datetime]] = deque(
            maxlen=UNWRITTEN_RECORDS)
        self.unwritten_dropped = 0
        self.log_error: str | None = None  # why the log cannot be written now
        self.reload_error: str | None = None  # an internal error of the last reload attempt
        self._watcher_task: asyncio.Task[None] | None = None
        self.server: BallastServer
        self.decisions: DecisionLog
        self.store: StateStore | ReplicatedStore
        self.replication: Replication | None = None
        self.reconciler: Reconciler
        self.admin: AdminApi | None = None
        self.prober: Prober | None = None
        self._passive: (SinkStore | PrometheusSource) | None = None
        self.watcher: DesiredFileWatcher
        self._lock: StateDirLock

    # -- start-up --------------------------------------------------------------------------

    async def start(self) -> None:
        """Raises DesiredStateError, StateCorrupted or OSError; nothing is left running then."""
        config = self.config
        self.started_at_ms = wall_ms()
        self._desired_bytes = read_desired_bytes(config.desired_path)
        desired = parse_desired(self._desired_bytes, str(config.desired_path))
        _log_warnings(desired)
        # TLS files read and checked before anything is held: bad ones refuse the start
        tls = ReloadingCredentials(config.tls) if config.tls is not None else None
        admin_auth = self._admin_auth()
        self._lock = StateDirLock(config.state_dir).acquire()
        try:
            self.decisions = DecisionLog(config.state_dir)
        except BaseException:
            self._lock.release()
            raise
        try:
            if config.store_url is not None:
                self.replication = self._replication(config.store_url)
                self.store = self.replication.store
                snapshot = await self.store.read()
            else:
                history = None if config.accept_empty_state else _log_history(config.state_dir)
                self.store = StateStore(config.state_dir, history=history)
                snapshot = self.store.load()
        except BaseException:
            self.decisions.close()
            if self.replication is not None:
                await self.replication.etcd.close()
            self._lock.release()
            raise
        self.server = BallastServer(
            desired,
            xds_address=config.xds_address,
            record=self._on_ads_event,
            debounce=config.debounce_s,
            metrics=self.metrics,
            tls=tls,
            store=self.store,
        )
        await self._restore(snapshot)
        if snapshot.desired_digest != desired.digest:
            self._record(
                "config_applied",
                config_version=desired.digest[:16],
                rule="desired state loaded at start-up",
                detail={"source": str(config.desired_path), "digest": desired.digest,
                        "warnings": desired_warnings(desired)},
            )
            if self.replication is None:  # replicas: the leader saves it with its next step
                await self.server.intent.save_digest()
        source = self._metric_source(desired)
        self.reconciler = Reconciler(
            self.server.intent,
            source,
            self.decisions,
            tier_source=WithWaits(self._passive, self.access_logs),
            metrics=self.metrics,
            interval_ms=config.reconcile_interval_ms,
            seed=config.seed,
        )
        self.watcher = DesiredFileWatcher(
            config.desired_path,
            self.apply_desired_bytes,
            poll=config.reload_poll_s,
            current=self._desired_bytes,
            on_unreadable=self._on_unreadable,
            on_error=self._on_reload_error,
        )
        # every PoP translated for Envoy 1.40 (FIFO queue policies; with and without the access
        # log its --metrics-sink bootstrap asks for), off the loop and before the port is bound:
        # a reconnect storm finds its snapshots ready
        for caps in (Capabilities(), Capabilities(access_log=True)):
            warm = self.server.cache.prepare_entries(caps)
            self.server.cache.commit_entries(await asyncio.to_thread(warm))
        try:
            await self.server.start()
            if config.admin_address is not None:
                await self._start_admin(config.admin_address, admin_auth)
        except OSError:  # a port taken: close what was opened, leave nothing running
            await self.server.stop(0)
            self.decisions.close()
            self.store.close()
            if self.replication is not None:
                await self.replication.etcd.close()
            self._lock.release()
            raise
        if self.replication is None:
            self._spawn(self.reconciler.run())
        else:  # the reconcile loop runs while this replica leads
            self.replication.start()
        self._spawn(self._sync_decisions())
        self._watcher_task = self._spawn(self.watcher.run())
        if self.prober is not None:
            self._spawn(self.prober.run())
        self._record(
            "startup",
            config_version=desired.digest[:16],
            rule=f"serving xDS on port {self.server.port}",
            detail={"restored_groups": self.restored_groups,
                    "restored_tier_actions": self.restored_tier_actions,
                    "xds_port": self.server.port,
                    **({"empty_state_accepted": str(self.store.path)}
                       if isinstance(self.store, StateStore) and self.store.blank else {})},
        )
        if config.freeze_heap:  # what start-up built lives as long as the server
            settle_heap()
            self._heap_settled = True
        self.ready = True

    async def _restore(self, snapshot: Snapshot) -> None:
        """What the store held, under the carry-over rule; a `state_restored` record says what
        was restored and what was dropped (pairs the desired state no longer has, or whose
        weights no longer fit). Ramp states of pairs that are gone leave the store."""
        owner = self.server.intent
        carried = owner.restore(snapshot, where=self._store_where())
        intent = carried.intent
        restored = sorted(intent.weights)
        active = sorted(tier_key(*key) for key in intent.tier_actions)
        skipped = [tier_key(*key) for key in sorted(set(snapshot.groups) - set(intent.weights))]
        kept_tiers = {tier_key(*key) for key in intent.tier_states}
        skipped += sorted(set(snapshot.tier_decisions) - kept_tiers - set(skipped))
        ramps = sorted(intent.ramps.items())
        if self.replication is None:  # replicas: only the leader writes
            await owner.forget_records(
                RAMP_KIND, sorted(set(snapshot.ramps) - {ramp_key(*key) for key, _ in ramps}))
        ramping = [f"{ramp_key(*key)} ({', '.join(s.ramping)})" for key, s in ramps if s.ramping]
        self.restored_groups = len(restored)
        self.restored_tier_actions = len(active)
        if snapshot.groups or snapshot.tier_decisions:
            self._record(
                "state_restored",
                rule=f"restored weights and streaks of {len(restored)} (PoP, group) pairs; tier "
                f"actions active for {', '.join(active) or 'none'}; standby ramps "
                f"{', '.join(ramping) or 'none'}"
                + (f"; dropped (no longer in desired state): {', '.join(skipped)}" if skipped
                   else ""),
                detail={
                    "restored": {tier_key(*key): owner.weights(*key) for key in restored},
                    "tier_states": {tier_key(*k): s.to_dict()
                                    for k, s in sorted(intent.tier_states.items(),
                                                       key=lambda item: tier_key(*item[0]))},
                    "tier_actions_active": active,
                    "ramps": {ramp_key(*k): s.to_dict() for k, s in ramps},
                    "dropped": skipped,
                },
            )

    def _replication(self, url: str) -> Replication:
        config = self.config
        replica = config.replica_id or config.xds_address
        return Replication(
            EtcdStore(parse_store_url(url)),
            replica,
            ttl_s=config.leader_ttl_s,
            owner=lambda: self.server.intent,
            decisions=self.decisions,
            reconciler=lambda: self.reconciler,
            info={"id": replica, "xds": config.xds_address, "admin": config.admin_address},
            record=self._record,
            metrics=self.metrics,
        )

    def _store_where(self) -> str:
        return self.store.where if isinstance(self.store, ReplicatedStore) else str(
            self.store.path)

    def _metric_source(self, desired: Desired) -> MetricSource:
        config = self.config
        # The access-log sink (measured pool wait) is hosted whatever the metric source is.
        self.access_logs = AccessLogStore(desired=desired)
        access_logs = self.access_logs
        bound = config.tls is not None  # mTLS: what a node reports is bound to its cert
        self.server.add_service(lambda server: add_access_log_service(
            server, access_logs, verify_peer=check_node_peer if bound else None))
        passive: SinkStore | PrometheusSource
        if config.metrics_source == "prometheus":
            if not config.prometheus_url:
                raise ValueError("metrics source 'prometheus' needs a Prometheus URL")
            passive = PrometheusSource(config.prometheus_url, desired=desired)
        else:
            sink = SinkStore(desired=desired)
            self.server.add_service(lambda grpc_server: add_metrics_service(
                grpc_server, sink, verify_peer=check_node_peer if bound else None,
                peer_pop=peer_pop if bound else None))
            passive = sink
        self._passive = passive  # host stats map to origins through the desired state
        # each origin's latency from the attempts it answered, where Envoys send access logs
        attributed = WithAttemptLatency(passive, access_logs)
        if not config.probes:
            return attributed
        self.prober = Prober(probe_targets(desired), interval_ms=config.probe_interval_ms,
                             on_certificate=self._on_certificate)
        return CombinedSource(attributed, self.prober)

    def _admin_auth(self) -> AdminAuth:
        """The admin API's authentication, checked against its bind before anything starts."""
        config = self.config
        token = TokenFile(config.admin_token_file) if config.admin_token_file else None
        if config.admin_tls and config.tls is None:
            raise AdminAuthError("the admin API's HTTPS uses the xDS port's TLS files: give "
                                 "--tls-cert, --tls-key and --client-ca too")
        auth = AdminAuth(token=token, client_certs=config.admin_tls)
        if config.admin_address is not None:
            check_bind(config.admin_address.rpartition(":")[0] or "127.0.0.1", auth)
        return auth

    async def _start_admin(self, address: str, auth: AdminAuth) -> None:
        host, _, port = address.rpartition(":")
        feed = DecisionFeed()
        self.decisions.add_listener(feed.publish)
        dashboard = Dashboard(nodes=self.server.nodes, intent=self.server.intent, feed=feed,
                              state_dir=self.config.state_dir, clock=lambda: datetime.now(UTC),
                              controllers=self.controller_states)
        self.admin = AdminApi(
            nodes=self.server.nodes,
            intent=self.server.intent,
            cache=self.server.cache,
            decisions=FileSource(self.config.state_dir),
            metrics=self.metrics,
            ready=self.is_ready,
            not_ready_reason=self.not_ready_reason,
            degraded=self.replication.degraded if self.replication else lambda: None,
            status=self.status,
            dashboard=dashboard,
            auth=auth,
        )
        https = ReloadingSslContext(self.config.tls) if self.config.tls and auth.client_certs \
            else None
        await self.admin.start(host or "127.0.0.1", int(port),
                               ssl_context=https.context if https is not None else None)

    async def _sync_decisions(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self._flush_unwritten()
            self._note_suppressed()
            try:
                self.decisions.sync()
            except OSError as err:
                log.error("cannot sync the decision log: %s", err)

    def _note_suppressed(self) -> None:
        """One record of the routine records the budget kept out since the last such note."""
        counts = self.routine_budget.pending_note()
        if counts is None:
            return
        budget = self.routine_budget.config
        self._record(
            "records_suppressed",
            rule=f"{sum(counts.values())} routine records not written: clients caused more "
            f"than the budget ({budget.burst_bytes:,} bytes at once, {budget.bytes_per_s:,} "
            "bytes/s); decisions are never suppressed",
            detail={"suppressed": counts,
                    "total_since_start": self.routine_budget.suppressed_total},
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.append(task)
        return task

    def is_ready(self) -> bool:
        return self.ready and self.not_ready_reason() == ""

    def not_ready_reason(self) -> str:
        """Why /readyz fails: not started, hot reload broken, or the log cannot be written."""
        if not self.ready:
            return "not ready: controller state not restored or desired state not loaded yet"
        task = self._watcher_task
        if task is not None and task.done():
            error = None if task.cancelled() else task.exception()
            return f"desired-state watcher stopped ({error!r}): hot reload and SIGHUP are off"
        if self.log_error is not None:
            return (f"decision log cannot be written ({self.log_error}); "
                    f"{len(self._unwritten)} records waiting")
        if self.reload_error is not None:
            return (f"the last desired-state reload failed with an internal error "
                    f"({self.reload_error}); the running state is kept")
        return ""

    # -- the faces -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        desired = self.server.intent.desired
        return {
            "desired": {"source": desired.source, "digest": desired.digest},
            "started_at_ms": self.started_at_ms,
            "restored_groups": self.restored_groups,
            "restored_tier_actions": self.restored_tier_actions,
            "xds_port": self.server.port,
            "xds_tls": self.server.tls.status() if self.server.tls is not None else None,
            "admin_auth": self._admin_auth_summary(),
            "state_dir": str(self.config.state_dir),
            "metrics_source": self.config.metrics_source,
            "ready": self.is_ready(),
            "certificates": self.prober.certificates_json() if self.prober else [],
            **({"replication": self.replication.status()} if self.replication else {}),
        }

    def _admin_auth_summary(self) -> str:
        ways = (["token"] if self.config.admin_token_file else []) + (
            ["client certificate (HTTPS)"] if self.config.admin_tls else [])
        return " or ".join(ways) or "none (loopback only)"

    def controller_states(self, pop: str, group: str) -> dict[str, dict[str, Any] | None]:
        """The reconcile loop's state of one (PoP, group) beyond its weights (None: idle)."""
        tier = self.server.intent.tier_state((pop, group))
        ramp = self.server.intent.ramp_state((pop, group))
        return {
            "Tier controller": None if tier.idle else tier.to_dict(),
            "Failover ramp": ramp.to_dict() if ramp.ramping else None,
        }

    # -- events ----------------------------------------------------------------------------

    def _record(self, kind: str, *, durable: bool = True, **fields: Any) -> None:
        """Write a record; when the log cannot take it (a full disk), keep it (and those after
        it, in order) until `_flush_unwritten` can write them, every second."""
        if self._unwritten:
            self._flush_unwritten()
        if self._unwritten:
            self._keep_unwritten(kind, durable, fields)
            return
        try:
            self.decisions.record(kind, durable=durable, **fields)
        except OSError as err:
            self.log_error = f"{type(err).__name__}: {err}"
            log.error("cannot write a %s record to the decision log (%s); kept until it can",
                      kind, err)
            self._keep_unwritten(kind, durable, fields)
            return
        self.metrics.decisions.labels(kind).inc()

    def _keep_unwritten(self, kind: str, durable: bool, fields: dict[str, Any]) -> None:
        if len(self._unwritten) == self._unwritten.maxlen:
            self.unwritten_dropped += 1
        self._unwritten.append((kind, durable, fields, datetime.now(UTC)))

    def _flush_unwritten(self) -> None:
        while self._unwritten:
            kind, durable, fields, at = self._unwritten[0]
            detail = fields.get("detail")
            late = {**(detail if isinstance(detail, dict) else {"detail": detail}),
                    "recorded_late": {"happened_at": format_time(at),
                                      "reason": self.log_error}}
            try:
                self.decisions.record(kind, durable=durable, **{**fields, "detail": late})
            except OSError as err:
                self.log_error = f"{type(err).__name__}: {err}"
                return
            self._unwritten.popleft()
            self.metrics.decisions.labels(kind).inc()
        if self.log_error is not None:
            log.warning("decision log writable again (%s); records kept meanwhile written%s",
                        self.log_error,
                        f", {self.unwritten_dropped} dropped" if self.unwritten_dropped else "")
            self.log_error = None
            self.unwritten_dropped = 0

    def _on_certificate(
        self, status: CertificateStatus, previous: CertificateStatus | None
    ) -> None:
        """Gauges follow every check; the log gets a record when a certificate starts failing
        (or is failing at the first check) and when it passes again."""
        if self.prober is not None:
            self.metrics.set_certificates(
                (s.group, s.origin, s.days_to_expiry, s.passed)
                for s in self.prober.certificates.values())
        before = previous.state if previous is not None else "ok"
        if status.state == before:
            return
        where = f"origin {status.origin} of group {status.group}"
        if status.passed:
            rule = (f"certificate of {where} passes again ({status.days_to_expiry:.1f} days "
                    "to expiry); its probes count again")
        else:
            rule = (f"certificate of {where} {status.problem}; its active probes fail until "
                    "it is fixed")
        self._record("certificate", group=status.group, rule=rule, detail=status.as_dict())

    def _on_ads_event(self, kind: str, fields: dict[str, Any]) -> None:
        detail = dict(fields)
        pop = detail.pop("pop", None)
        version = detail.get("version")
        node = detail.get("node", "?")
        if kind == "nack":
            rule = (
                f"node {node} rejected {detail.get('type')} version {version}: "
                f"{detail.get('message', '')}"
            )
        elif kind == "capability_fallback":
            rule = f"node {node} lacks adaptive LIFO: FIFO sent"
        elif kind == "node_refused":
            rule = f"node {node} refused: {detail.get('reason')}"
        elif kind == "node_superseded":
            rule = (f"node {node}: newer stream {detail.get('stream')} replaced stream "
                    f"{detail.get('closed_stream')}, which was closed")
        else:
            rule = f"node {node} {kind.removeprefix('node_')}"
        size = RECORD_OVERHEAD_BYTES + len(rule) + len(
            json.dumps(detail, separators=(",", ":"), ensure_ascii=False, default=str)
        )
        if not self.routine_budget.take(kind, size):
            if self.routine_budget.suppressed_total == 1:
                log.warning("routine records over budget: counting them instead of writing")
            return
        # Connects, disconnects and fallbacks are routine and come in storms (a fleet
        # reconnecting): no fsync each; the periodic sync makes them durable within a second.
        self._record(kind, durable=kind == "nack", pop=pop, config_version=version, rule=rule,
                     detail=detail)

    # -- hot reload ------------------------------------------------------------------------

    def _on_unreadable(self, err: DesiredStateError) -> None:
        self._reject("unreadable", [str(p) for p in err.problems])

    def _on_reload_error(self, err: Exception) -> None:
        self.reload_error = f"{type(err).__name__}: {err}"[:300]
        self._reject("internal-error", [f"internal error while reloading: {self.reload_error}"])

    async def apply_desired_bytes(self, data: bytes) -> bool:
        """Validate and apply a new desired state; on any problem keep running as is.

        Everything that grows with the desired state (parsing, the per-PoP diffs, translating
        every cached PoP) runs on a worker thread from inputs read on the loop; the loop keeps
        answering Envoys and pushing weight changes meanwhile, and only the swap (plus an
        incremental re-translation of PoPs whose weights moved during the work) runs on it.
        """
        async with self._reload_lock:
            try:
                applied = await self._apply_desired_bytes(data)
            except Exception as err:  # anything unforeseen: rejected, running state kept
                log.exception("applying %s failed", self.config.desired_path)
                self._on_reload_error(err)
                return False
            self.reload_error = None
            return applied

    async def _apply_desired_bytes(self, data: bytes) -> bool:
        source = str(self.config.desired_path)
        digest = hashlib.sha256(data).hexdigest()
        try:
            new = await asyncio.to_thread(parse_desired, data, source)
        except DesiredStateError as err:
            self._reject(digest, [str(p) for p in err.problems])
            return False
        owner, cache = self.server.intent, self.server.cache
        before = owner.intent
        if new.digest == before.desired.digest:
            return False
        carried = carry_over(before, new)
        diffs = pop_diffs_from(cache, before, carried.intent)
        prepare = cache.prepare(carried.intent)
        try:
            changes, prepared = await asyncio.to_thread(lambda: (diffs(), prepare()))
        except Exception as err:  # translation of a valid file failed: never half-apply
            log.exception("applying %s failed", source)
            self._reject(digest, [f"{source}: cannot translate: {err}"])
            return False
        free = _free_bytes(self.config.state_dir)
        if free < MIN_FREE_BYTES:  # a full disk rejects the apply: nothing half-done
            self._reject(digest, [f"{source}: only {free:,} bytes free where the state is saved "
                                  f"({self.config.state_dir}); not applied"])
            return False
        async with owner.changing:  # a reconcile tick does not land between save and swap
            try:  # saved before it applies (replicas: by the leader, the others follow etcd)
                if self.replication is None or self.replication.term is not None:
                    await owner.save_desired(before, carried.intent)  # the digest, pairs gone
            except (OSError, sqlite3.Error, StoreUnavailable, Deposed) as err:
                log.error("cannot save the desired-state digest: %s", err)
                self._reject(digest, [f"{source}: cannot save the state ({err}); not applied"])
                return False
            # weights may have moved meanwhile (the save is awaited too): the same rule, over
            # the intent running now, with nothing awaited between it and the swap
            current = carried if owner.intent is before else carry_over(owner.intent, new)
            changed_pops = owner.apply(current, lambda intent: cache.commit(prepared, intent))
        self._desired_bytes = data
        self.reconciler.forget_missing(new)
        if self._passive is not None:
            self._passive.update_desired(new)
            self.access_logs.update_desired(new)
        if self.prober is not None:
            self.prober.retarget(probe_targets(new))
        lines = [f"pop {pop}: {summarize(c)}" for pop, c in sorted(changes.items())]
        diff = [
            line
            for pop, c in sorted(changes.items())
            for line in [f"pop {pop}:", *format_changes(c)]
        ]
        self._record(
            "config_applied",
            config_version=new.digest[:16],
            rule=f"desired state applied ({'; '.join(lines)}); pushed to "
            f"{', '.join(sorted(changed_pops)) or 'no PoP'}",
            detail={"digest": new.digest, "pushed_pops": sorted(changed_pops),
                    "diff": diff[:DIFF_LINES_IN_RECORD], "diff_lines": len(diff),
                    "warnings": desired_warnings(new)},
        )
        _log_warnings(new)
        self.metrics.config_reloads.labels("applied").inc()
        log.info("applied %s: %s", source, "; ".join(lines))
        return True

    def _reject(self, digest: str, problems: list[str]) -> None:
        self._record(
            "config_rejected",
            config_version=digest[:16],
            rule=f"desired state rejected ({len(problems)} problems); running state kept",
            detail={"problems": problems[:PROBLEMS_IN_RECORD], "problem_count": len(problems)},
        )
        self.metrics.config_reloads.labels("rejected").inc()
        log.error("rejected new desired state, keeping the running one:\n%s", "\n".join(problems))

    # -- shutdown --------------------------------------------------------------------------

    def install_signal_handlers(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.watcher.trigger)

    async def stop(self, grace: float = 1.0) -> None:
        self.ready = False
        if self.replication is not None:  # the term handed over at once, records handed on
            await self.replication.stop()
        await cancel_all(self._tasks)
        await self.server.stop(grace)
        if self.admin is not None:
            await self.admin.stop()
        self._note_suppressed()
        self._record("shutdown", rule="stopped: streams closed, state and log flushed")
        self.decisions.close()
        self.store.close()
        if self._heap_settled:
            release_heap()
            self._heap_settled = False
        if self.replication is not None:
            await self.replication.etcd.close()
        self._lock.release()


def _free_bytes(directory: Path) -> int:
    status = os.statvfs(directory)
    return status.f_bavail * status.f_frsize


def _log_history(state_dir: Path) -> str | None:
    """The decision log, when the state directory has one with records in it."""
    sizes = [path.stat().st_size for path in log_files(state_dir) if path.exists()]
    if not any(sizes):
        return None
    return f"the decision log next to it ({len(sizes)} file(s), {sum(sizes):,} bytes)"


def _pops(old: Desired, new: Desired) -> list[str]:
    return sorted(set(old.pop_names) | set(new.pop_names))


def pop_diffs_from(
    cache: SnapshotCache[RunningIntent], before: RunningIntent, after: RunningIntent
) -> Callable[[], dict[str, list[ResourceChange]]]:
    """Read what the diffs need from the cache now; the returned call computes, per PoP, what it
    gets differently under the carried-over intent `after` than under `before` (Envoys without
    adaptive LIFO) and touches nothing of the cache, so it may run on a worker thread."""
    caps = Capabilities()
    cached = {pop: cache.cached(pop, caps) for pop in before.desired.pop_names}

    def diffs() -> dict[str, list[ResourceChange]]:
        return {pop: diff_pop(before, after, pop, cached.get(pop))
                for pop in _pops(before.desired, after.desired)}

    return diffs


def diff_pop(
    before: RunningIntent, after: RunningIntent, pop: str,
    before_resources: PopResources | None = None,
) -> list[ResourceChange]:
    """What `pop` gets differently under `after` than under `before` (Envoys without adaptive
    LIFO): exactly what applying `after` pushes to them. `before_resources`: what it is served
    now, when at hand."""
    caps = Capabilities()
    if pop not in before.desired.pop_names:
        old = {}
    else:
        old = render_json(before_resources or translate_intent(before, pop, caps))
    if pop not in after.desired.pop_names:
        return diff_renderings(old, {})
    return diff_renderings(old, render_json(translate_intent(after, pop, caps)))


def _log_warnings(desired: Desired) -> None:
    """What `ballast validate` warns about, in the server log too (e.g. TLS verification off)."""
    for warning in desired_warnings(desired):
        log.warning("%s: %s", desired.source, warning)
