"""What `observe` hands to `decide`: windows of signals per (PoP, origin group, origin), and the
pending queue of each tier cluster per (PoP, origin group, tier) for the tier actions.

Produced by the metric sources (Envoy's metrics_service sink, Prometheus) and the active probes;
consumed by the pure health score and weight controller. Times are milliseconds on the caller's
clock, so replays from the decision log are exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OriginSignals:
    """One origin as seen from one PoP over the rolling window (seed 002: 30 s), all tiers."""

    requests: int  # completed upstream requests in the window
    errors_5xx: int
    connect_failures: int  # connect failures and timeouts
    p50_ms: float | None  # None when no request completed in the window
    p95_ms: float | None
    pending_active: float  # upstream_rq_pending_active of the group's tier clusters (max)
    queue_overflow: int  # requests refused by max_pending_requests in the window
    probe_success: float | None  # share of active probes that passed; None if not probed
    observed_at_ms: int  # when the newest sample behind these numbers arrived

    @property
    def error_rate(self) -> float:
        """5xx and connect failures over all attempts; 0 with no traffic."""
        attempts = self.requests + self.connect_failures
        if attempts == 0:
            return 0.0
        return (self.errors_5xx + self.connect_failures) / attempts


# (PoP, origin group) -> origin name -> signals
GroupSignals = dict[str, OriginSignals]


@dataclass(frozen=True)
class TierPending:
    """One tier cluster of one group as seen from one PoP over the window."""

    pending_max: float  # highest upstream_rq_pending_active in the window, the PoP's Envoys summed
    observed_at_ms: int  # when the newest sample behind it arrived


# (PoP, origin group) -> tier name -> pending
GroupTierPending = dict[str, TierPending]
