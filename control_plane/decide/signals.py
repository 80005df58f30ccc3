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
    """One origin as seen from one PoP over the rolling window (the failover source: 30 s),
    all tiers."""

    requests: int  # completed upstream requests in the window
    errors_5xx: int
    connect_failures: int  # connect failures and timeouts
    p50_ms: float | None  # None when no request completed in the window
    p95_ms: float | None
    pending_active: float  # upstream_rq_pending_active of the group's tier clusters (max)
    queue_overflow: int  # requests refused by max_pending_requests in the window
    probe_success: float | None  # share of active probes that passed; None if not probed
    observed_at_ms: int  # when the newest sample behind these numbers arrived
    # How many observations p50/p95 come from (None: the source did not count them; the
    # completed requests stand in), the p95's lower confidence bound where the source has the
    # samples (`decide/evidence.py`), and what the latency measures: `final_attempt` (the
    # origin's own answer, from Envoy's access logs), `whole_request` (Envoy's zone histogram,
    # which books a retried request's whole life, failed attempts and backoff included, to the
    # origin that answered last) or `probes` (Ballast's active probes filled in).
    latency_samples: int | None = None
    p95_low_ms: float | None = None
    latency_from: str = "whole_request"
    probes: int = 0  # active probes in the window (probe_success is their passing share)
    # Attempts of `requests` the origin never finished: neither answered nor failed, because
    # another attempt of the request won (a hedge) or the client went away; Envoy resets them
    # (`decide/evidence.py` `abandoned_attempts`). 0 where the source cannot tell.
    abandoned: int = 0
    # requests in progress at the window's end, the PoP's clients summed (load reports; 0 where
    # the source does not say): shown, not judged
    in_flight: float = 0.0

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
class WaitQuantiles:
    """Pool wait of one tier's requests in the window, from sampled access-log entries: the
    time from the request's first byte to its first byte sent upstream
    (`time_to_first_upstream_tx_byte`), of requests that took one attempt."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    samples: int
    excluded: int = 0  # retried or hedged requests of the window, not samples of the wait

    def quantile(self, name: str) -> float:
        return {"p50": self.p50_ms, "p95": self.p95_ms, "p99": self.p99_ms}[name]


@dataclass(frozen=True)
class TierPending:
    """One tier cluster of one group as seen from one PoP over the window.

    The adaptive LIFO watermarks and the breakers apply to each Envoy's own pool, so the numbers
    are per Envoy: the worst Envoy of the PoP counts (not the PoP's sum).
    """

    pending_max: float  # highest upstream_rq_pending_active in the window of the worst Envoy
    observed_at_ms: int  # when the newest sample behind it arrived
    # Each Envoy's highest upstream_rq_active of the tier pool in the window (node id -> peak).
    active_by_node: tuple[tuple[str, float], ...] = ()
    overloaded_max: float | None = None  # upstream_queue_overloaded, worst Envoy (if reported)
    wait: WaitQuantiles | None = None  # from the access logs; None: no sampled request

    @property
    def active_max(self) -> float:
        return max((peak for _, peak in self.active_by_node), default=0.0)

    @property
    def demand(self) -> float:
        """Requests the tier's pool held at its peak (active + waiting), worst Envoy."""
        return self.active_max + self.pending_max


# (PoP, origin group) -> tier name -> pending
GroupTierPending = dict[str, TierPending]
