"""Health score of one origin as seen from one PoP: a pure function of its signals.

Each signal maps to a sub-score (1 = perfect). A "badness ratio" q = value / threshold is turned
into a sub-score by ``1 - q / 5`` (at most 1): at the threshold the sub-score is 0.8, at twice
it 0.6, at five times it 0 (the failover source's "0.0 (dead)").

- ``errors``: 5xx + connect failures over all attempts, against ``error_rate_threshold``
  (so 7.9 % against 2 % scores 0.21), or the abandoned attempts over the started ones against
  ``abandon_threshold`` (an origin whose attempts a hedge keeps winning), whichever is worse.
- ``latency``: p95 against ``p95_threshold_ms``.
- ``saturation``: the worse of pending requests against the adaptive-LIFO high watermark (the
  queue-policy source: 80) and the share of requests refused by ``max_pending_requests`` against
  ``error_rate_threshold`` (a refused request is a failed request); clamped to 0..1.
- ``probe``: the share of active probes that passed (0..1).

Errors and latency are not clamped at 0: past five times the threshold they go on falling, one
threshold's worth (0.2) per threshold, so two origins failing past "dead" still order (60 % 5xx
scores -5, 95 % -8.5: the failover source's "an origin that's 70% healthy shouldn't be treated the
same as one that's 0% healthy") and the failover ``compare_margin`` (0.1: half a threshold's worth)
means the same at both ends. A strictly lower 5xx rate or p95 gives a strictly lower badness and,
where that signal is the composite's minimum, a strictly better composite. A composite below 0 is a
health-proportional target of 0 (the warm pool holds), and the dashboard draws it at 0.

The failover source combines them with the **weighted minimum**, not the average, so one failing
signal pulls the whole score down::

    composite = min over signals with evidence of (1 - w_i * (1 - s_i))

``w_i`` in 0..1 (``SIGNAL_WEIGHTS``) says how far signal i alone can pull the composite down: with
w = 1 a dead signal makes the composite 0 (and below, past dead), with w = 0.8 it makes it 0.2.
A signal without evidence (no completed request, no probe) is left out: an idle origin is not an
unhealthy one. Saturation always has evidence (the pending gauge), so an idle origin with an
empty queue scores 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control_plane.decide.evidence import abandoned_share, judge
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import AdaptiveLifo, FailoverPolicy

SIGNAL_WEIGHTS: dict[str, float] = {
    "errors": 1.0,
    "latency": 1.0,
    "saturation": 0.8,
    "probe": 0.8,
}
SIGNAL_ORDER: tuple[str, ...] = tuple(SIGNAL_WEIGHTS)
ZERO_AT_RATIO = 5.0  # a signal at this many times its threshold scores 0
DEFAULT_PENDING_WATERMARK = AdaptiveLifo().high_watermark


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def weighted_terms(sub_scores: dict[str, float | None]) -> dict[str, float]:
    """``1 - w_i * (1 - s_i)`` for every signal with evidence, in ``SIGNAL_ORDER``."""
    return {
        name: 1.0 - SIGNAL_WEIGHTS[name] * (1.0 - value)
        for name, value in sub_scores.items()
        if value is not None
    }


def ratio_score(value: float, threshold: float) -> float:
    """1 - (value / threshold) / 5, at most 1: 0 at five times the threshold, below 0 past it
    (errors and latency keep their order at the bad end; see the module docstring)."""
    return min(1.0, 1.0 - (value / threshold) / ZERO_AT_RATIO)


@dataclass(frozen=True)
class HealthScore:
    """Every sub-score (None = no evidence), the composite, and which signal was the minimum."""

    errors: float | None
    latency: float | None
    saturation: float
    probe: float | None
    composite: float
    limiting: str  # the signal whose weighted term is the minimum

    def sub_scores(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in SIGNAL_ORDER}

    def terms(self) -> dict[str, float]:
        """The weighted terms the composite is the minimum of (signals with evidence only)."""
        return weighted_terms(self.sub_scores())

    def describe(self) -> str:
        """E.g. ``0.21 = min(errors 0.21, latency 0.64, saturation 1.00)``."""
        inner = ", ".join(f"{name} {value:.2f}" for name, value in self.terms().items())
        return f"{self.composite:.2f} = min({inner})"

    def to_dict(self) -> dict[str, Any]:
        return {**self.sub_scores(), "composite": self.composite, "limiting": self.limiting}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthScore:
        return cls(
            errors=data["errors"],
            latency=data["latency"],
            saturation=data["saturation"],
            probe=data["probe"],
            composite=data["composite"],
            limiting=data["limiting"],
        )


def score_origin(
    signals: OriginSignals,
    policy: FailoverPolicy,
    pending_watermark: int = DEFAULT_PENDING_WATERMARK,
) -> HealthScore:
    """The health score of one origin from one window of its signals."""
    attempts = signals.requests + signals.connect_failures
    errors = min(ratio_score(signals.error_rate, policy.error_rate_threshold),
                 ratio_score(abandoned_share(signals), policy.abandon_threshold)
                 if policy.abandon_threshold > 0 else 1.0) if attempts else None
    latency = (
        ratio_score(signals.p95_ms, policy.p95_threshold_ms)
        if signals.p95_ms is not None
        else None
    )
    offered = attempts + signals.queue_overflow
    overflow_rate = signals.queue_overflow / offered if offered else 0.0
    saturation = _clamp01(min(
        ratio_score(signals.pending_active, pending_watermark),
        ratio_score(overflow_rate, policy.error_rate_threshold),
    ))
    probe = _clamp01(signals.probe_success) if signals.probe_success is not None else None
    terms = weighted_terms(
        {"errors": errors, "latency": latency, "saturation": saturation, "probe": probe}
    )
    limiting = min(terms, key=lambda name: terms[name])
    return HealthScore(errors, latency, saturation, probe, terms[limiting], limiting)


def breach_reasons(signals: OriginSignals, policy: FailoverPolicy) -> tuple[str, ...]:
    """Why this window breaches the failover source's leave thresholds with enough evidence
    (``decide/evidence.py``); empty when it does not."""
    return judge(signals, policy).breaches


def is_healthy_window(signals: OriginSignals, policy: FailoverPolicy) -> bool:
    """A window that counts towards returning: enough samples, within the thresholds and p50
    below ``return_p50_ms``. A window without enough samples is no evidence of health."""
    return judge(signals, policy).verdict == "healthy"
