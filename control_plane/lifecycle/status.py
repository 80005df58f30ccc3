"""What a running service says about itself: readiness (`/readyz`) and status (`/status`,
`ballast status`), read from its parts, changing nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from control_plane.decide import damping
from control_plane.decide.rollout import timeline
from control_plane.decide.runs import QuietRun
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.intent.owner import IntentOwner
from control_plane.observe.certificates import served_certificates
from control_plane.observe.load_reports import LoadReports
from control_plane.observe.probes import Prober
from control_plane.observe.source import silent_fix, wall_ms
from control_plane.reconcile.reconcile import Reconciler
from control_plane.reload.reloading import DesiredReload
from control_plane.replicas.replication import Replication
from control_plane.rollout.rollouts import Rollouts
from control_plane.xds_port.load_reports import MetricSourceKind
from control_plane.xds_port.server import BallastServer


class ShownConfig(Protocol):
    """What /status shows of the service's configuration (`service.py`'s `ServiceConfig`)."""

    @property
    def admin_token_file(self) -> Path | None: ...
    @property
    def admin_scrape_token_file(self) -> Path | None: ...
    @property
    def admin_tls(self) -> bool: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def metrics_source(self) -> MetricSourceKind: ...


class RunningParts(Protocol):
    """What readiness and status read of a running service, and nothing else: its parts
    (`service.py`'s `BallastService` has them), read, never changed. A protocol, so this module
    needs nothing of the service's module (which imports it)."""

    @property
    def config(self) -> ShownConfig: ...
    @property
    def ready(self) -> bool: ...
    @property
    def started_at_ms(self) -> int: ...
    @property
    def restored_groups(self) -> int: ...
    @property
    def restored_tier_actions(self) -> int: ...
    @property
    def watcher_task(self) -> asyncio.Task[None] | None: ...
    @property
    def recorder(self) -> DecisionRecorder: ...
    @property
    def reload(self) -> DesiredReload: ...
    @property
    def server(self) -> BallastServer: ...
    @property
    def load_reports(self) -> LoadReports: ...
    @property
    def prober(self) -> Prober | None: ...
    @property
    def replication(self) -> Replication | None: ...
    @property
    def reconciler(self) -> Reconciler: ...
    @property
    def rollouts(self) -> Rollouts: ...


def not_ready_reason(service: RunningParts) -> str:
    """Why /readyz fails ("" when ready): not started, hot reload broken, or the log cannot be
    written."""
    if not service.ready:
        return "not ready: controller state not restored or desired state not loaded yet"
    task = service.watcher_task
    if task is not None and task.done():
        error = None if task.cancelled() else task.exception()
        return f"desired-state watcher stopped ({error!r}): hot reload and SIGHUP are off"
    recorder = service.recorder
    if recorder.error is not None:
        return (f"decision log cannot be written ({recorder.error}); "
                f"{recorder.waiting} records waiting")
    if service.reload.error is not None:
        return (f"the last desired-state reload failed with an internal error "
                f"({service.reload.error}); the running state is kept")
    return ""


def service_status(service: RunningParts) -> dict[str, Any]:
    config, server = service.config, service.server
    desired = server.intent.desired
    ways = (["token"] if config.admin_token_file else []) + (
        ["client certificate (HTTPS)"] if config.admin_tls else []) + (
        ["scrape token (GET /metrics only)"] if config.admin_scrape_token_file else [])
    return {
        "desired": {"source": desired.source, "digest": desired.digest},
        "started_at_ms": service.started_at_ms,
        "restored_groups": service.restored_groups,
        "restored_tier_actions": service.restored_tier_actions,
        "xds_port": server.port,
        "xds_tls": server.tls.status() if server.tls is not None else None,
        "admin_auth": " or ".join(ways) or "none (loopback only)",
        "state_dir": str(config.state_dir),
        "metrics_source": config.metrics_source,
        "load_reports": load_report_streams(service),
        "ready": not_ready_reason(service) == "",
        "certificates": service.prober.certificates_json() if service.prober else [],
        "served_certificates": [c.as_dict() for c in served_certificates(desired, wall_ms())],
        **({"replication": service.replication.status()} if service.replication else {}),
        "metrics_silent": [
            {"pop": pop, "nodes": list(nodes),
             "fix": silent_fix(pop, nodes, config.metrics_source)}
            for pop, nodes in sorted(service.reconciler.silent.items())],
        "pop_versions": pop_versions(server),
        "rollout": rollout_status(service.rollouts),
        "origins": origin_readings(service),
    }


def origin_readings(service: RunningParts) -> dict[str, dict[str, dict[str, Any]]]:
    """PoP -> origin group -> what the reconcile loop's last tick of the pair read and scored
    (`read_at_ms`), per origin: the weight in force, the requests of its window, the 5xx rate
    (5xx and connect failures over all attempts, in percent), the p95 (ms) and the health score
    (1 perfect, 0 dead, below 0 past five times a threshold: `decide/health.py`) with the
    signal that limits it; None where the tick had no signal of the origin. Rounded as the
    dashboard shows them. Empty on a replica that does not lead (the leader reconciles)."""
    owner = service.server.intent
    shown: dict[str, dict[str, dict[str, Any]]] = {}
    for (pop, group), reading in sorted(service.reconciler.readings.items()):
        if not owner.has_pop(pop):
            continue
        origins = {}
        for origin, weight in owner.weights(pop, group).items():
            signals, score = reading.signals.get(origin), reading.scores.get(origin)
            origins[origin] = {
                "weight": weight,
                "requests": None if signals is None else signals.requests,
                "error_rate_pct": None if signals is None else round(
                    signals.error_rate * 100, 1),
                "p95_ms": None if signals is None or signals.p95_ms is None else round(
                    signals.p95_ms),
                "score": None if score is None else round(score.composite, 2),
                "limiting": None if score is None else score.limiting,
            }
        shown.setdefault(pop, {})[group] = {"read_at_ms": reading.at_ms, "origins": origins}
    return shown


LISTED_REPORTERS = 100  # load-report streams listed in /status (all are counted)


def load_report_streams(service: RunningParts) -> dict[str, Any]:
    """The open load-report streams: how many per PoP, and the first `LISTED_REPORTERS` by
    node id (node, PoP, reports, the newest one's time, clusters named, per endpoint)."""
    reporters = sorted(service.load_reports.reporters(), key=lambda r: str(r["node"]))
    per_pop: dict[str, int] = {}
    for reporter in reporters:
        per_pop[str(reporter["pop"])] = per_pop.get(str(reporter["pop"]), 0) + 1
    return {"streams": len(reporters), "per_pop": per_pop,
            "listed": reporters[:LISTED_REPORTERS]}


def pop_versions(server: BallastServer) -> dict[str, dict[str, Any]]:
    """PoP -> the desired-state version (digest) it serves and its nodes against it: applied
    (ACKed all of it), pending, NACKed."""
    acks = server.acks
    return {pop: acks.pop(pop).as_dict() for pop in server.intent.intent.pop_names}


def rollout_status(rollouts: Rollouts) -> dict[str, Any] | None:
    """The latest rollout (None: nothing applied since the state was new), the versions that
    failed theirs."""
    rollout = rollouts.rollout
    if rollout is None:
        return None
    return {**rollout.to_dict(), "timeline": timeline(rollout),
            "failed_versions": dict(rollouts.failed)}


def controller_states(owner: IntentOwner, pop: str, group: str, run: QuietRun | None = None
                      ) -> dict[str, dict[str, Any] | None]:
    """The reconcile loop's state of one (PoP, group) beyond its weights (None: idle); `run`:
    its quiet run now (a hold shows its reason and rule: "no_evidence", "fail_static", ...)."""
    tier = owner.tier_state((pop, group))
    ramp = owner.ramp_state((pop, group))
    flaps = owner.controller((pop, group)).flaps
    policy = owner.desired.group(group).failover
    return {
        "Weight controller": None if run is None or run.kind != "hold" else {
            "holding": run.reason, "since_ms": run.started_ms, "ticks": run.ticks,
            "rule": run.last_rule},
        "Tier controller": None if tier.idle else tier.to_dict(),
        "Failover ramp": ramp.to_dict() if ramp.ramping else None,
        "Flap damping": damping.shown(flaps, policy, wall_ms()) if flaps else None,
    }
