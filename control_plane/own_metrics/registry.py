"""Ballast's own Prometheus metrics, served at the admin API's `/metrics`.

One registry per server (not the process-global one), so several servers in one test process
never share series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from control_plane.desired.model import TierActions

CONVERGENCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 30.0)


class BallastMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._xds(self.registry)
        self._controllers(self.registry)
        self._replicas(self.registry)
        self._certificates(self.registry)
        self._rollouts(self.registry)

    def _xds(self, r: CollectorRegistry) -> None:
        """The ADS streams: nodes, responses, ACKs and NACKs, convergence."""
        self.connected_nodes = Gauge(
            "ballast_connected_nodes", "Envoy nodes with an open ADS stream", ["pop"], registry=r
        )
        self.pushes = Counter(
            "ballast_xds_pushes", "xDS responses sent", ["type"], registry=r
        )
        self.push_bytes = Counter(
            "ballast_xds_push_bytes", "Bytes of xDS responses sent", ["type"], registry=r
        )
        self.acks = Counter("ballast_xds_acks", "xDS ACKs received", ["type"], registry=r)
        self.nacks = Counter("ballast_xds_nacks", "xDS NACKs received", ["type"], registry=r)
        self.capability_fallbacks = Counter(
            "ballast_capability_fallbacks",
            "Streams (and CDS versions of a stream) served a capability fallback; the decision "
            "log records a node's fallback only when it differs from the last one recorded",
            ["pop"], registry=r,
        )
        self.convergence = Histogram(
            "ballast_xds_convergence_seconds",
            "Time from sending a response to its ACK",
            ["type"],
            buckets=CONVERGENCE_BUCKETS,
            registry=r,
        )

    def _controllers(self, r: CollectorRegistry) -> None:
        """The reconcile loop, its decisions and what it reads; reloads."""
        self.reconcile_tick = Histogram(
            "ballast_reconcile_tick_seconds", "Duration of one reconcile tick", registry=r
        )
        self.decisions = Counter(
            "ballast_decisions", "Decision log records written", ["kind"], registry=r
        )
        self.weight = Gauge(
            "ballast_origin_weight",
            "Current weight of an origin in a PoP (percent)",
            ["pop", "group", "origin"],
            registry=r,
        )
        self.source_staleness = Gauge(
            "ballast_metric_source_staleness_seconds",
            "Age of the newest metric sample per PoP and origin group",
            ["pop", "group"],
            registry=r,
        )
        self.tier_action_active = Gauge(
            "ballast_tier_action_active",
            "1 while a tier action is active in a PoP (action demote: part of the tier's "
            "requests go to a less critical tier; shed: the tier is answered at the edge; lend: "
            "the tier borrows unused concurrency), 0 while it is configured but off",
            ["pop", "group", "action", "tier"],
            registry=r,
        )
        self.config_reloads = Counter(
            "ballast_config_reloads", "Desired-state reloads by result", ["result"], registry=r
        )

    def _replicas(self, r: CollectorRegistry) -> None:
        """Replicas on etcd: who leads, in which term, whether etcd answers."""
        self.replica_leading = Gauge(
            "ballast_replica_leading",
            "1 while this replica leads (reconciles) among replicas on etcd; its term",
            ["replica"], registry=r,
        )
        self.leader_term = Gauge(
            "ballast_leader_term", "The term this replica leads (0: it follows)", ["replica"],
            registry=r,
        )
        self.intent_store_reachable = Gauge(
            "ballast_intent_store_reachable",
            "1 while this replica reaches the shared intent store (etcd); 0: reconcile paused",
            ["replica"], registry=r,
        )

    def _certificates(self, r: CollectorRegistry) -> None:
        """Origins' certificates (probes) and the certificates TLS listeners serve."""
        self.certificate_days = Gauge(
            "ballast_origin_certificate_days_to_expiry",
            "Days until the certificate a TLS origin presents expires (negative: expired), "
            "from the latest probe",
            ["group", "origin"],
            registry=r,
        )
        self.certificate_ok = Gauge(
            "ballast_origin_certificate_ok",
            "1 while a TLS origin's certificate verifies and is outside the expiry warning "
            "window, 0 while its probes fail because of it",
            ["group", "origin"],
            registry=r,
        )
        self.served_certificate_days = Gauge(
            "ballast_served_certificate_days_to_expiry",
            "Days until a certificate a TLS listener serves (over SDS) expires (negative: "
            "expired)",
            ["listener", "certificate"],
            registry=r,
        )

    def _rollouts(self, r: CollectorRegistry) -> None:
        """The latest rollout and the version each PoP serves."""
        self.rollout_phase = Gauge(
            "ballast_rollout_phase",
            "1 for the phase of the latest rollout of a desired-state version (baking, paused, "
            "passed, rolled_back, aborted, superseded), 0 for the others",
            ["phase"], registry=r,
        )
        self.rollout_wave = Gauge(
            "ballast_rollout_wave", "The wave of the latest rollout (1-based) and how many it "
            "has", ["of"], registry=r,
        )
        self.pop_config_version = Gauge(
            "ballast_pop_config_version",
            "1 for the desired-state version (digest, 16 hex digits) each PoP serves",
            ["pop", "version"], registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def set_weights(self, weights: Mapping[str, Mapping[str, Mapping[str, int]]]) -> None:
        """Make `ballast_origin_weight` exactly `weights` (PoP -> group -> origin -> weight)."""
        self.weight.clear()
        for pop, groups in weights.items():
            for group, origins in groups.items():
                for origin, value in origins.items():
                    self.weight.labels(pop, group, origin).set(value)

    def set_tier_actions(
        self,
        active: Mapping[str, Mapping[str, TierActions]],
        configured: Mapping[str, Mapping[str, TierActions]] | None = None,
    ) -> None:
        """Make `ballast_tier_action_active` exactly: 1 for each action in `active`, 0 for each
        action in `configured` (PoP -> group -> actions) that is not active."""
        self.tier_action_active.clear()
        for value, by_pop in ((0, configured or {}), (1, active)):
            for pop, groups in by_pop.items():
                for group, actions in groups.items():
                    for action, tier in tier_action_parts(actions):
                        self.tier_action_active.labels(pop, group, action, tier).set(value)


    def set_rollout(self, phase: str | None, phases: Iterable[str], wave: int, waves: int,
                    versions: Mapping[str, str]) -> None:
        """The rollout gauges: `phase` of `phases` (None: no rollout yet), the wave (0-based)
        of `waves`, and each PoP's version (PoP -> digest)."""
        self.rollout_phase.clear()
        if phase is not None:
            for name in phases:
                self.rollout_phase.labels(name).set(int(name == phase))
            self.rollout_wave.labels("current").set(wave + 1)
            self.rollout_wave.labels("total").set(waves)
        self.pop_config_version.clear()
        for pop, digest in versions.items():
            self.pop_config_version.labels(pop, digest[:16]).set(1)

    def set_certificates(self, checks: Iterable[tuple[str, str, float | None, bool]]) -> None:
        """Make the certificate gauges exactly these checks: (group, origin, days to expiry or
        None when no certificate was fetched, passed)."""
        self.certificate_days.clear()
        self.certificate_ok.clear()
        for group, origin, days, passed in checks:
            if days is not None:
                self.certificate_days.labels(group, origin).set(round(days, 3))
            self.certificate_ok.labels(group, origin).set(int(passed))


    def set_served_certificates(self, days: Iterable[tuple[str, str, float]]) -> None:
        """Make `ballast_served_certificate_days_to_expiry` exactly these (listener,
        certificate, days to expiry)."""
        self.served_certificate_days.clear()
        for listener, certificate, left in days:
            self.served_certificate_days.labels(listener, certificate).set(round(left, 3))


def tier_action_parts(actions: TierActions) -> list[tuple[str, str]]:
    """(action, tier) of each part that does something: ("demote", tier), ("shed", tier) (the
    re-prioritization's and utilization's), ("lend", tier) for a tier borrowing concurrency."""
    parts = []
    if actions.demote_tier and actions.demote_to and actions.demote_share:
        parts.append(("demote", actions.demote_tier))
    parts.extend(("shed", tier) for tier in sorted(actions.shed))
    parts.extend(("lend", tier) for tier, _ in actions.limits)
    return parts
