"""Health score of one origin as seen from one PoP: a pure function of its signals.

Each signal maps to a sub-score in 0..1 (1 = perfect). A "badness ratio" q = value / threshold is
turned into a sub-score by ``1 - q / 5`` clamped to 0..1: at the threshold the sub-score is 0.8,
at five times the threshold it is 0.

- ``errors``: 5xx + connect failures over all attempts, against ``error_rate_threshold``
  (so 7.9 % against 2 % scores 0.21).
- ``latency``: p95 against ``p95_threshold_ms``.
- ``saturation``: the worse of pending requests against the adaptive-LIFO high watermark
  (seed 001: 80) and the share of requests refused by ``max_pending_requests`` against
  ``error_rate_threshold`` (a refused request is a failed request).
- ``probe``: the share of active probes that passed.

Seed 002 combines them with the **weighted minimum**, not the average, so one failing signal pulls
the whole score down::

    composite = min over signals with evidence of (1 - w_i * (1 - s_i))

``w_i`` in 0..1 (``SIGNAL_WEIGHTS``) says how far signal i alone can pull the composite down: with
w = 1 a dead signal makes the composite 0, with w = 0.8 it makes it 0.2. A signal without evidence
(no completed request, no probe) is left out: an idle origin is not an unhealthy one. Saturation
always has evidence (the pending gauge), so an idle origin with an empty queue scores 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control_plane.decide.evidence import judge
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
    """1 - (value / threshold) / 5, clamped to 0..1."""
    return _clamp01(1.0 - (value / threshold) / ZERO_AT_RATIO)


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
    errors = ratio_score(signals.error_rate, policy.error_rate_threshold) if attempts else None
    latency = (
        ratio_score(signals.p95_ms, policy.p95_threshold_ms)
        if signals.p95_ms is not None
        else None
    )
    offered = attempts + signals.queue_overflow
    overflow_rate = signals.queue_overflow / offered if offered else 0.0
    saturation = min(
        ratio_score(signals.pending_active, pending_watermark),
        ratio_score(overflow_rate, policy.error_rate_threshold),
    )
    probe = _clamp01(signals.probe_success) if signals.probe_success is not None else None
    terms = weighted_terms(
        {"errors": errors, "latency": latency, "saturation": saturation, "probe": probe}
    )
    limiting = min(terms, key=lambda name: terms[name])
    return HealthScore(errors, latency, saturation, probe, terms[limiting], limiting)


def breach_reasons(signals: OriginSignals, policy: FailoverPolicy) -> tuple[str, ...]:
    """Why this window breaches seed 002's leave thresholds with enough evidence
    (``decide/evidence.py``); empty when it does not."""
    return judge(signals, policy).breaches


def is_healthy_window(signals: OriginSignals, policy: FailoverPolicy) -> bool:
    """A window that counts towards returning: enough samples, within the thresholds and p50
    below ``return_p50_ms``. A window without enough samples is no evidence of health."""
    return judge(signals, policy).verdict == "healthy"
