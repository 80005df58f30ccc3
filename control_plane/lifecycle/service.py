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
4. compare the desired-state file with what was served before the stop (a rollout the store
   held, else the version whose bytes it kept): a file edited while Ballast was down is a new
   change through the reload (`reloading.py`: rolled out per its `rollout:`, superseding a
   stored rollout), recorded as such — before the port is bound, so reconnecting Envoys get
   its first wave at once. With replicas the leader does it once elected (the file it reads);
   a follower records that it leaves a differing file to the leader (`config_deferred`);
5. start the reconcile loop, the active probes and the desired-state watcher; report ready.
Each part is registered with what stops it as it starts (`manager.py`: one exit stack, and
what only the leader runs started and stopped with the lead), so a start-up that fails half-way
and `stop` unwind the same way: newest first, ending with the
decision log, the state store and the state directory's lock. Hot reloads are
`reloading.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from control_plane.acks.shared_acks import SharedAcks
from control_plane.admin.api import AdminApi
from control_plane.admin.auth import AdminAuth, AdminAuthError, TokenFile, check_bind
from control_plane.admin.connections import DEFAULT_ADMIN_LIMITS, AdminLimits
from control_plane.admin.dashboard import Dashboard
from control_plane.admin.decision_feed import DecisionFeed
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits
from control_plane.decisions.log import DecisionLog, Draft, draft, log_files
from control_plane.decisions.rate_limit import DEFAULT_RATE_LIMIT, RateLimit, RecordLimiter
from control_plane.decisions.read import FileSource
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import parse_desired, read_desired_bytes
from control_plane.desired.filter_types import DEFAULT_ALLOWED, AllowedFilters
from control_plane.desired.loader import watched_files
from control_plane.desired.model import Desired
from control_plane.desired.warnings import desired_warnings
from control_plane.intent.carry_over import CarryOver
from control_plane.intent.etcd_store import EtcdStore, StoreCredentials, parse_store_url
from control_plane.intent.replicated_store import ReplicatedStore
from control_plane.intent.rollout_state import Restored, Version, baseline, restored
from control_plane.intent.running import ramp_key, tier_key
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.state_dir_lock import StateDirLock
from control_plane.intent.store import VERSION_KIND, StoredIntent
from control_plane.lifecycle.heap import release_heap, reload_heap, settle_heap
from control_plane.lifecycle.log_rate_limit import limit_client_logs
from control_plane.lifecycle.manager import Manager
from control_plane.lifecycle.rollout_control import ServiceRollouts
from control_plane.lifecycle.status import (
    controller_states,
    not_ready_reason,
    origin_readings,
    service_status,
)
from control_plane.observe.access_log import (
    AccessLogStore,
    WithAttemptLatency,
    WithWaits,
    add_access_log_service,
)
from control_plane.observe.certificates import CertificateStatus
from control_plane.observe.combine import CombinedSource
from control_plane.observe.fill_in import FilledIn, PassiveSource
from control_plane.observe.load_reports import LoadReports
from control_plane.observe.lrs_service import DEFAULT_INTERVAL_MS
from control_plane.observe.probes import Prober, probe_targets
from control_plane.observe.prometheus import PrometheusSource
from control_plane.observe.sink import SinkStore, add_metrics_service
from control_plane.observe.source import MetricSource, wall_ms
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.reconcile.reconcile import Reconciler
from control_plane.reload.file_watcher import DesiredFileWatcher
from control_plane.reload.reloading import DesiredReload, log_warnings
from control_plane.replicas.replication import Replication
from control_plane.rollout.rollouts import Rollouts
from control_plane.security.peer import check_node_peer, peer_pop
from control_plane.security.terminal import escape
from control_plane.security.tls import ReloadingCredentials, ReloadingSslContext, TlsFiles
from control_plane.translate.resources import Capabilities
from control_plane.xds_port.load_reports import MetricSourceKind, host_load_reports, passive_source
from control_plane.xds_port.server import BallastServer

log = logging.getLogger(__name__)

# who asked, in the records of a change the file made while Ballast was down
EDITED_WHILE_DOWN = "the file differs from what was served before the stop: edited while " \
    "Ballast was down"


@dataclass(frozen=True)
class ServiceConfig:
    desired_path: Path
    state_dir: Path
    xds_address: str = "127.0.0.1:18000"
    admin_address: str | None = "127.0.0.1:18001"
    metrics_source: MetricSourceKind = "sink"
    lrs_interval_ms: int = DEFAULT_INTERVAL_MS  # how often clients send load reports
    lrs_endpoint_granularity: bool = False  # load reports per endpoint, not only per locality
    prometheus_url: str | None = None
    probes: bool = True
    probe_interval_ms: int | None = None  # default: the groups' health_check interval
    reconcile_interval_ms: int | None = None  # default: each group's failover interval
    reload_poll_s: float = 0.5
    rollout_poll_ms: int = 1000  # how often a rollout in progress is looked at (its gates)
    debounce_s: float = 0.1
    seed: int = 0
    routine_records: RateLimit = DEFAULT_RATE_LIMIT
    ads_limits: AdsLimits = DEFAULT_LIMITS  # what ADS clients may make the server hold
    accept_empty_state: bool = False  # a missing/empty state.db next to a decision log: start
    tls: TlsFiles | None = None  # mTLS on the xDS/sink port when set
    admin_token_file: Path | None = None  # bearer token the admin API requires when set
    admin_scrape_token_file: Path | None = None  # a read-only token for GET /metrics
    admin_tls: bool = False  # admin API on HTTPS with `tls`'s files; admin client certs accepted
    admin_limits: AdminLimits = DEFAULT_ADMIN_LIMITS  # admin connections: timeouts and cap
    admin_host_names: tuple[str, ...] = ()  # Host names the admin API answers besides IPs
    # without `tls`: SDS secrets (private keys) still go to Envoys connecting from loopback
    allow_plaintext_secrets: bool = False
    # the HTTP filter types the desired state may use (`desired/filter_types.py`; None: any)
    allowed_filters: AllowedFilters = DEFAULT_ALLOWED
    store_url: str | None = None  # etcd://HOST:PORT[,...]: replicas share the intent there
    store_credentials: StoreCredentials | None = None  # etcd client TLS and/or user, password
    replica_id: str | None = None  # this replica's name among them (default: the xDS address)
    leader_ttl_s: int = 5  # the leader's lease; a follower takes over within it
    # what start-up built kept out of full garbage collections (`lifecycle/heap.py`); the process's
    # own choice (`ballast serve` makes it), since it freezes the whole process's heap
    freeze_heap: bool = False


class BallastService:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        # every desired state this service reads (its file, stored versions) is judged alike
        self.parse = functools.partial(parse_desired, allowed_filters=config.allowed_filters)
        self.metrics = BallastMetrics()
        self.ready = False
        self.restored_groups = 0
        self.restored_tier_actions = 0
        self.started_at_ms = 0
        self._desired_bytes = b""
        self._started = False  # every part started (a `shutdown` record is due at the stop)
        self._grace = 1.0  # how long `stop` lets open xDS streams finish
        self.manager: Manager  # what runs, and what only the leader runs
        self.reload: DesiredReload
        self.rollouts: Rollouts
        self.watcher_task: asyncio.Task[None] | None = None
        self.server: BallastServer
        self.decisions: DecisionLog
        self.recorder: DecisionRecorder
        self.store: StateStore | ReplicatedStore
        self.replication: Replication | None = None
        self.reconciler: Reconciler
        self.admin: AdminApi | None = None
        self.prober: Prober | None = None
        self._passive: PassiveSource | None = None
        self.load_reports: LoadReports
        self.watcher: DesiredFileWatcher

    # -- start-up --------------------------------------------------------------------------

    async def start(self) -> None:
        """Raises DesiredStateError, StateCorrupted or OSError; nothing is left running then."""
        config = self.config
        limit_client_logs()  # what clients make the log say is rate-limited
        self.started_at_ms = wall_ms()
        self._desired_bytes = read_desired_bytes(config.desired_path)
        desired = self.parse(self._desired_bytes, str(config.desired_path))
        log_warnings(desired)
        # TLS files read and checked before anything is held: bad ones refuse the start
        tls = ReloadingCredentials(config.tls) if config.tls is not None else None
        admin_auth = self._admin_auth()
        self.manager = manager = Manager()
        try:
            await self._start(manager, desired, tls, admin_auth)
        except BaseException:
            await manager.stop()  # what was started stops, newest first, as in `stop`
            raise
        self.ready = True

    async def _start(self, manager: Manager, desired: Desired,
                     tls: ReloadingCredentials | None, admin_auth: AdminAuth) -> None:
        """Each part started and registered with what stops it, in start-up order."""
        config = self.config
        stored = await self._open_state(manager)
        # what was served before the stop, served again: a rollout the store held resumes
        # (each PoP serves what it served), else the version whose bytes it kept; the file
        # (read above) is compared with it once everything is built (`_apply_file`)
        file = Version(desired, self._desired_bytes)
        held = restored(stored.records, {file.digest: file}, self.parse,
                        self._store_where(), wall_ms())
        running = held.target if held is not None else baseline(
            stored.records, stored.desired_digest, {file.digest: file}, self.parse,
            self._store_where()) or file
        self.server = BallastServer(
            running.desired,
            xds_address=config.xds_address,
            record=self._on_ads_event,
            debounce=config.debounce_s,
            metrics=self.metrics,
            limits=config.ads_limits,
            tls=tls,
            store=self.store,
            recorder=self.recorder,
            allow_plaintext_secrets=config.allow_plaintext_secrets,
            serving=None if held is None else held.serving,
            replica="" if self.replication is None else self.replication.replica_id,
            peer_acks=dict if self.replication is None else self._peer_acks,
        )
        self._drivers(running, stored, file, held)
        await self._restore(stored, held)
        self._follow_served()  # a rollout restored: PoPs on its previous version too
        if self.replication is None:  # replicas: the leader, once elected (`_elected`)
            await self._apply_file(file)
        await self._serve(manager, admin_auth)
        await self._run(manager)
        self.recorder.record(
            "startup",
            config_version=running.desired.digest[:16],
            rule=f"serving xDS on port {self.server.port}",
            detail={"restored_groups": self.restored_groups,
                    "restored_tier_actions": self.restored_tier_actions,
                    "xds_port": self.server.port,
                    **self._defaults_note()},
        )
        self._started = True
        if config.freeze_heap:  # what start-up built lives as long as the server
            settle_heap()
            manager.hold(release_heap)

    async def _open_state(self, manager: Manager) -> StoredIntent:
        """The state directory's lock, the decision log and its recorder, the store (with
        replicas: etcd, through the replica's `Replication`); what the store holds."""
        config = self.config
        manager.hold(StateDirLock(config.state_dir).acquire().release)
        self.decisions = DecisionLog(config.state_dir)
        manager.hold(self.decisions.close)
        self.recorder = DecisionRecorder(
            self.decisions, limiter=RecordLimiter(config.routine_records), metrics=self.metrics)
        manager.hold(self._record_shutdown)
        if config.store_url is not None:
            self.replication = self._replication(config.store_url, manager)
            manager.hold_async(self.replication.etcd.close)
            self.store = self.replication.store
            manager.hold(self.store.close)
            return await self.store.read()
        history = None if config.accept_empty_state else _log_history(config.state_dir)
        self.store = StateStore(config.state_dir, history=history)
        manager.hold(self.store.close)
        return self.store.load()

    def _drivers(self, running: Version, stored: StoredIntent, file: Version,
                 held: Restored | None) -> None:
        """What drives changes: the metric source, the reconcile loop, the rollout driver (with
        the rollout the store held, baking again from now), the reload and the file watcher."""
        config = self.config
        source = self._metric_source(running.desired)
        self.reconciler = Reconciler(
            self.server.intent,
            source,
            tier_source=WithWaits(self._passive, self.access_logs),
            metrics=self.metrics,
            interval_ms=config.reconcile_interval_ms,
            seed=config.seed,
            connected=self._connected_nodes,
            reporting=self._passive.reporting_nodes
            if isinstance(self._passive, SinkStore | LoadReports | FilledIn) else None,
            source_kind=config.metrics_source,
        )
        self.rollouts = Rollouts(
            self.server.intent, self.server.acks, source, self.recorder, running,
            metrics=self.metrics, changed=self._follow_served, parse=self.parse,
            saved=stored.records.get(VERSION_KIND, {}),
            stats_after=self._passive.stats_after if isinstance(self._passive, SinkStore)
            else None,
            sheds=self.access_logs.sheds)
        if held is not None:
            self.rollouts.restore(held)
            self.rollouts.rebake("Ballast restarted")
        self.reload = DesiredReload(
            config.desired_path, config.state_dir, self.server, self.recorder, self.metrics,
            follower=self._follower, rollouts=lambda: self.rollouts,
            heap=reload_heap if config.freeze_heap else contextlib.nullcontext,
            parse=self.parse)
        self.watcher = DesiredFileWatcher(
            config.desired_path,
            self.reload.apply,
            poll=config.reload_poll_s,
            current=file.data,  # compared at start (`_apply_file`): only later edits count
            on_unreadable=self.reload.unreadable,
            on_error=self.reload.failed,
            also=lambda: watched_files(self.server.intent.intent.desired),
        )

    async def _serve(self, manager: Manager, admin_auth: AdminAuth) -> None:
        """Every PoP translated for Envoy 1.40 (FIFO queue policies; with and without the
        access log its --metrics-sink bootstrap asks for), off the loop and before the port is
        bound (a reconnect storm finds its output ready); then the xDS port, the admin API."""
        config = self.config
        for caps in (Capabilities(), Capabilities(access_log=True)):
            warm = self.server.cache.prepare_entries(caps)
            self.server.cache.commit_entries(await asyncio.to_thread(warm))
        await manager.start(self.server.start, lambda: self.server.stop(self._grace))
        if config.admin_address is not None:
            address = config.admin_address
            await manager.start(lambda: self._start_admin(address, admin_auth),
                                self._stop_admin)

    async def _run(self, manager: Manager) -> None:
        """The loops: the reconcile loop and the rollout driver's looks where this process
        leads (alone: from now on; with replicas: from each election, `_replicate`), the
        decision log's sync, the file watcher, the probes."""
        manager.leader_only(self.reconciler.run)
        manager.leader_only(lambda: self.rollouts.run(self.config.rollout_poll_ms))
        if self.replication is not None:
            self._replicate(manager, self.replication)
        manager.spawn(self._sync_decisions())
        self.watcher_task = manager.spawn(self.watcher.run())
        if self.prober is not None:
            manager.spawn(self.prober.run())
        if self.replication is None:
            await manager.lead()

    def _replicate(self, manager: Manager, replication: Replication) -> None:
        """A replica's loops (the election among them) and what the manager does on election
        and loss besides starting and stopping what only the leader runs."""
        manager.on_elected(replication.took_lead)
        manager.on_elected(self._elected)
        manager.on_lost(self._lost)
        manager.on_lost(replication.lost_lead)
        manager.hold_async(replication.leave)  # after its loops stopped
        for loop in replication.loops():
            manager.spawn(loop)
        manager.spawn(self._follower_file())

    async def _apply_file(self, file: Version) -> None:
        """The desired-state file compared with the running intent (what the target is): a
        file that differs is a new change, applied through the reload like an edit (its
        `rollout:`, superseding a rollout in progress; a version that failed its rollout is
        not applied again), its records saying it was made while Ballast was down."""
        if file.digest != self.server.intent.desired.digest:
            await self.reload.apply(file.data, by=EDITED_WHILE_DOWN)

    async def _elected(self, term: int) -> None:
        """This replica leads (the intent and the rollout read back): no pair ticks before an
        interval from now (the last leader may have ticked just before it went), and the file
        it reads applied (a file a follower left to the old leader, or one edited on this host
        while it was down, rolls out now)."""
        self.reconciler.defer_all(self.reconciler.clock())
        self.watcher.trigger()

    async def _lost(self, why: str) -> None:
        self.reconciler.readings.clear()  # the leader's now: none shown here

    async def _follower_file(self) -> None:
        """A replica that started as a follower compares its file with what the replicas serve
        once it knows who leads: a differing file is left to the leader, recorded
        (`config_deferred`). The leader reads its own file when elected (`_elected`)."""
        replication = self.replication
        if replication is None:
            return
        await replication.election.campaigned.wait()
        if not self.manager.leading:
            await replication.read_leader()
            self.watcher.trigger()

    def _follower(self) -> str | None:
        """Why this replica leaves applying a desired-state file to the leader (None: it leads,
        or is alone)."""
        replication = self.replication
        if replication is None or self.manager.leading:
            return None
        leader = replication.leader
        return (f"replica {replication.replica_id} does not lead (leader: "
                f"{'none elected' if leader is None else f'{leader[0]}, term {leader[1]}'})")

    def _peer_acks(self) -> Mapping[str, SharedAcks]:
        return {} if self.replication is None else self.replication.peer_acks()

    def _defaults_note(self) -> dict[str, str]:
        """What the `startup` record says when the state store held nothing: every weight,
        streak and tier action starts from the desired state's defaults."""
        if not isinstance(self.store, StateStore) or not self.store.blank:
            return {}
        note = {"started_from_defaults": f"{self.store.path} held no state (missing or empty): "
                "weights, streaks and tier actions start from the desired state's defaults"}
        if self.config.accept_empty_state:
            note["empty_state_accepted"] = str(self.store.path)
        return note

    async def _restore(self, stored: StoredIntent, held: Restored | None) -> None:
        """What the store held, under the carry-over rule, in one change transaction with
        start-up's bookkeeping (alone: the ramp records of pairs that are gone deleted, and
        what the store must hold of the version served or the rollout, `Rollouts.settlement`;
        replicas: only the leader writes) and its records: `state_restored` (what was restored
        and what was dropped: pairs the desired state no longer has, or whose weights no
        longer fit), `config_applied` when the store held another version and no rollout from
        it, `state_restored` of the rollout held."""
        alone = self.replication is None
        settled = self.rollouts.settlement() if alone else None
        running = self.server.intent.desired

        def records(carried: CarryOver) -> list[Draft]:
            return [*self._restored_records(stored, carried),
                    *_loaded_records(stored, running, self.config.desired_path),
                    *self._rollout_records(held)]

        carried = await self.server.intent.restore(
            stored, where=self._store_where(), save=alone,
            keep=((), ()) if settled is None else settled[:2], records=records)
        if settled is not None:
            settled[2]()
        intent = carried.intent
        self.restored_groups = len(intent.weights)
        self.restored_tier_actions = len(intent.tier_actions)

    def _restored_records(self, stored: StoredIntent, carried: CarryOver) -> list[Draft]:
        """The `state_restored` record of the pairs (none when the store held none)."""
        if not (stored.groups or stored.tier_decisions):
            return []
        intent = carried.intent
        restored = sorted(intent.weights)
        active = sorted(tier_key(*key) for key in intent.tier_actions)
        skipped = [tier_key(*key) for key in sorted(set(stored.groups) - set(intent.weights))]
        kept_tiers = {tier_key(*key) for key in intent.tier_states}
        skipped += sorted(set(stored.tier_decisions) - kept_tiers - set(skipped))
        ramps = sorted(intent.ramps.items())
        ramping = [f"{ramp_key(*key)} ({', '.join(s.ramping)})" for key, s in ramps if s.ramping]
        return [draft(
            "state_restored",
            rule=f"restored weights and streaks of {len(restored)} (PoP, group) pairs; tier "
            f"actions active for {', '.join(active) or 'none'}; standby ramps "
            f"{', '.join(ramping) or 'none'}"
            + (f"; dropped (no longer in desired state): {', '.join(skipped)}" if skipped
               else ""),
            detail={
                "restored": {tier_key(*key): intent.weights_of(*key) for key in restored},
                "tier_states": {tier_key(*k): s.to_dict()
                                for k, s in sorted(intent.tier_states.items(),
                                                   key=lambda item: tier_key(*item[0]))},
                "tier_actions_active": active,
                "ramps": {ramp_key(*k): s.to_dict() for k, s in ramps},
                "dropped": skipped,
            },
        )]

    def _rollout_records(self, held: Restored | None) -> list[Draft]:
        """The `state_restored` record of the rollout the store held (taken up where it was)."""
        if held is None:
            return []
        rollout = self.rollouts.rollout or held.rollout
        versions = self.server.intent.intent.versions()
        return [draft(
            "state_restored",
            config_version=rollout.to_version[:16],
            rule=f"rollout of {rollout.to_version[:16]} from {rollout.from_version[:16]} "
            f"restored ({rollout.phase.replace('_', ' ')}, wave {rollout.wave + 1} of "
            f"{len(rollout.waves)}): each PoP serves what it served before the stop"
            + ("" if not held.renamed else ", with the certificate files on disk now (renewed "
               "while Ballast was down: " + ", ".join(f"{old[:16]} is {new[:16]}" for old, new
                                                       in sorted(held.renamed.items())) + ")")
            + ("; it goes on from here" if rollout.in_progress else ""),
            detail={"rollout": rollout.to_dict(), "pop_versions": versions,
                    "failed_versions": sorted(held.failed), "renamed": held.renamed},
        )]

    def _replication(self, url: str, manager: Manager) -> Replication:
        config = self.config
        replica = config.replica_id or config.xds_address
        return Replication(
            EtcdStore(parse_store_url(url), credentials=config.store_credentials),
            replica,
            ttl_s=config.leader_ttl_s,
            owner=lambda: self.server.intent,
            recorder=self.recorder,
            adopt=lambda: self.rollouts.adopt,
            acks=lambda: self.server.acks,
            on_leadership=manager.leadership_changed,
            adopting=lambda: not manager.leading,
            info={"id": replica, "xds": config.xds_address, "admin": config.admin_address},
            metrics=self.metrics,
        )

    def _connected_nodes(self) -> dict[str, dict[str, int]]:
        """PoP -> node id -> since when (ms) it is connected to this replica (its metrics
        should arrive)."""
        reports = self.config.metrics_source.endswith("lrs")  # gRPC clients send nothing else
        return {pop: {entry.node_id: round(entry.connected_since * 1000) for entry in entries
                      if reports or not entry.capability_key.startswith("grpc")}
                for pop, entries in self.server.nodes.by_pop().items()}

    def _store_where(self) -> str:
        return self.store.where if isinstance(self.store, ReplicatedStore) else str(
            self.store.path)

    def _metric_source(self, desired: Desired) -> MetricSource:
        config = self.config
        # The access-log sink (measured pool wait) is hosted whatever the metric source is.
        self.access_logs = AccessLogStore(desired=desired)
        access_logs = self.access_logs
        bound = config.tls is not None  # mTLS: what a node reports is bound to its cert
        # a sink stream whose node passes the checks is a valid stream of its connection
        vouch = self.server.connections.vouch
        self.server.add_service(lambda server: add_access_log_service(
            server, access_logs, verify_peer=check_node_peer if bound else None, vouch=vouch))
        # the load-report server is hosted whatever the source is (gRPC clients report)
        self.load_reports = host_load_reports(
            self.server, desired, interval_ms=config.lrs_interval_ms,
            endpoint_granularity=config.lrs_endpoint_granularity)
        first: SinkStore | PrometheusSource | None = None
        if config.metrics_source.startswith("prometheus"):
            if not config.prometheus_url:
                raise ValueError("metrics source 'prometheus' needs a Prometheus URL")
            first = PrometheusSource(config.prometheus_url, desired=desired)
        elif config.metrics_source.startswith("sink"):
            sink = first = SinkStore(desired=desired)
            self.server.add_service(lambda grpc_server: add_metrics_service(
                grpc_server, sink, verify_peer=check_node_peer if bound else None,
                peer_pop=peer_pop if bound else None, vouch=vouch))
        passive = passive_source(config.metrics_source, first, self.load_reports)
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
        scrape = None
        if config.admin_scrape_token_file is not None:
            scrape = TokenFile(config.admin_scrape_token_file)
            if token is None and not config.admin_tls:
                raise AdminAuthError("--admin-scrape-token-file goes with --admin-token-file or "
                                     "--admin-tls: an open admin API needs no scrape token")
            if token is not None and scrape.fingerprint() == token.fingerprint():
                raise AdminAuthError("the scrape token must not be the admin token: whoever "
                                     "holds it (Prometheus) could act on rollouts")
        auth = AdminAuth(token=token, client_certs=config.admin_tls, scrape_token=scrape)
        if config.admin_address is not None:
            check_bind(config.admin_address.rpartition(":")[0] or "127.0.0.1", auth)
        return auth

    async def _start_admin(self, address: str, auth: AdminAuth) -> None:
        host, _, port = address.rpartition(":")
        feed = DecisionFeed()
        rollouts = ServiceRollouts(self.server, self.rollouts, self.reload,
                                   self.config.desired_path)
        self.decisions.add_listener(feed.publish)
        dashboard = Dashboard(nodes=self.server.nodes, intent=self.server.intent, feed=feed,
                              state_dir=self.config.state_dir, clock=lambda: datetime.now(UTC),
                              controllers=lambda pop, group: controller_states(
                                  self.server.intent, pop, group,
                                  self.reconciler.quiet_run(pop, group)),
                              rollout=rollouts.shown, origins=lambda: origin_readings(self))
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
            limits=self.config.admin_limits,
            host_names=self.config.admin_host_names,
            rollouts=rollouts,
        )
        https = ReloadingSslContext(self.config.tls) if self.config.tls and auth.client_certs \
            else None
        await self.admin.start(host or "127.0.0.1", int(port),
                               ssl_context=https.context if https is not None else None)

    async def _stop_admin(self) -> None:
        if self.admin is not None:
            await self.admin.stop()

    def _follow_served(self) -> None:
        """What follows each change of which PoP serves which desired state (a reload, a
        rollout's wave, rollback, supersede or a follower's adopt — the rollout driver's
        `changed`) besides the intent: the reconcile schedule, the metric sources' origin maps
        and the probes' targets, for every version some PoP serves."""
        running = self.server.intent.intent
        self.reconciler.forget_missing(running)
        if self._passive is not None:
            self._passive.update_served(running.desired, running.serving)
            if self._passive is not self.load_reports:
                self.load_reports.update_served(running.desired, running.serving)
            self.access_logs.update_served(running.desired, running.serving)
        if self.prober is not None:
            self.prober.retarget(probe_targets(running.desired, running.serving))

    async def _sync_decisions(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.recorder.flush()

    # -- the faces (`status.py`) -----------------------------------------------------------

    def is_ready(self) -> bool:
        return not_ready_reason(self) == ""

    def not_ready_reason(self) -> str:
        return not_ready_reason(self)

    def status(self) -> dict[str, Any]:
        return service_status(self)

    # -- events ----------------------------------------------------------------------------

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
        self.recorder.record("certificate", group=status.group, rule=rule, detail=status.as_dict())

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
        elif kind == "capability_fallback" and str(detail.get("capabilities")).startswith("grpc"):
            rule = f"gRPC client {node} not sent: {'; '.join(detail.get('notes') or [])}"
        elif kind == "capability_fallback":
            rule = f"node {node} sent a fallback: {'; '.join(detail.get('notes') or [])}"
        elif kind == "node_refused":
            rule = f"node {node} refused: {detail.get('reason')}"
        elif kind == "node_superseded":
            rule = (f"node {node}: newer stream {detail.get('stream')} replaced stream "
                    f"{detail.get('closed_stream')}, which was closed")
        else:
            rule = f"node {node} {kind.removeprefix('node_')}"
        # Connects, disconnects and fallbacks are routine and come in storms (a fleet
        # reconnecting): no fsync each; the periodic sync makes them durable within a second.
        # The rule quotes a node's text: escaped (the detail keeps it as sent, JSON-encoded).
        self.recorder.routine(kind, durable=kind == "nack", pop=pop, config_version=version,
                              rule=escape(rule), detail=detail)

    # -- shutdown --------------------------------------------------------------------------

    def install_signal_handlers(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.watcher.trigger)

    async def stop(self, grace: float = 1.0) -> None:
        """Everything start-up started, stopped in reverse order (`manager.py`): the term
        handed over at once, the loops, the admin API, the xDS streams (after `grace` s), a
        `shutdown` record, the log, the store, the lock."""
        self.ready = False
        self._grace = grace
        await self.manager.stop()

    def _record_shutdown(self) -> None:
        if self._started:
            self.recorder.note_suppressed()
            self.recorder.record("shutdown", rule="stopped: streams closed, state and log "
                                 "flushed")


def _log_history(state_dir: Path) -> str | None:
    """The decision log, when the state directory has one with records in it."""
    sizes = [path.stat().st_size for path in log_files(state_dir) if path.exists()]
    if not any(sizes):
        return None
    return f"the decision log next to it ({len(sizes)} file(s), {sum(sizes):,} bytes)"


def _loaded_records(stored: StoredIntent, desired: Desired, path: Path) -> list[Draft]:
    """The `config_applied` record of a start whose store held another version (or none)."""
    if stored.desired_digest == desired.digest:
        return []
    before = stored.desired_digest
    return [draft(
        "config_applied",
        config_version=desired.digest[:16],
        rule="desired state loaded at start-up" + (
            "" if before is None else f" on every PoP at once: the store kept no "
            f"bytes of the version served before the stop ({before[:16]}), so "
            "nothing rolls out from it"),
        detail={"source": str(path), "digest": desired.digest,
                "warnings": desired_warnings(desired), "stored_digest": before},
    )]
