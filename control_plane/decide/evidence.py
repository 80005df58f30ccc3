"""Evidence before a verdict: what one window of one origin's signals is enough to say. Pure.

Seed 002 leaves an origin "when the passive 5xx rate crosses 2% or p95 origin latency spikes past
800ms for two consecutive windows", and warns "Don't tie your shift directly to a single 5xx or
timeout". At 40 requests/s with a 5 % warm pool about six standby requests fall in a 30 s
window: one 5xx is 17 %, one slow request is the p95. So a window is judged on its evidence:

- **errors**: n = attempts the origin served (requests + connect failures), k = the failed ones.
  When n is below ``min_samples``, the window's active probes fill in (seed 002: every 5 s, a
  cacheable and an uncacheable path, so 12 in a 30 s window): n += probes, k += failed probes.
  It *breaches* only with n >= ``min_samples`` and the Wilson lower bound of k / n (95 %
  two-sided, z = 1.96) above ``error_rate_threshold``: at 20 attempts two 5xx breach (10 %,
  lower bound 2.8 %), one does not (5 %, lower bound 0.9 %).
- **latency**: n = the observations behind the quantiles (``OriginSignals.latency_samples``;
  a source that does not count them leaves it None and the completed requests stand in).
  It *breaches* only with n >= ``min_samples``, p95 above ``p95_threshold_ms`` and, where the
  source gives it, the p95's lower confidence bound (``p95_low_ms``: the order statistic the
  true p95 lies above with ~97.5 % confidence, ``quantile_lower_rank``) above it too: the p95
  is backed by several samples over the threshold, not one (at n = 10, three).

The window's verdict is ``breach`` when any signal breaches with evidence; otherwise
``inconclusive`` when either signal lacks samples (it neither breaches nor counts as healthy:
the controller keeps both streaks as they were); otherwise ``healthy`` when the point estimates
are within the thresholds and p50 < ``return_p50_ms``, else ``neither`` (enough samples, no
breach, not healthy: e.g. one 5xx in 20, or p50 over the return bar).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy

Z = 1.96  # 95 % two-sided: the confidence of every bound here
Verdict = Literal["breach", "healthy", "neither", "inconclusive"]
VERDICTS: tuple[str, ...] = ("breach", "healthy", "neither", "inconclusive")


def wilson_lower(failures: float, total: float, z: float = Z) -> float:
    """The Wilson score interval's lower bound of failures / total (0 without a total)."""
    if total <= 0:
        return 0.0
    share = min(1.0, max(0.0, failures / total))
    z2 = z * z
    centre = share + z2 / (2 * total)
    margin = z * math.sqrt(share * (1 - share) / total + z2 / (4 * total * total))
    return max(0.0, (centre - margin) / (1 + z2 / total))


def quantile_lower_rank(count: int, q: float = 0.95, z: float = Z) -> int | None:
    """The 1-based rank r such that the r-th smallest of `count` samples lies below the true
    q-quantile with ~(1 - (1 - confidence) / 2) confidence (normal approximation of the binomial
    count of samples below the quantile); None when `count` is too small for any bound."""
    if count <= 0:
        return None
    rank = math.floor(count * q - z * math.sqrt(count * q * (1 - q)))
    return rank if rank >= 1 else None


def quantile_lower(ordered: Sequence[float], q: float = 0.95) -> float | None:
    """The lower confidence bound of the q-quantile of `ordered` (ascending samples)."""
    rank = quantile_lower_rank(len(ordered), q)
    return None if rank is None else ordered[rank - 1]


@dataclass(frozen=True)
class WindowEvidence:
    """One origin's window, judged: the verdict, the breaches (with their evidence) and notes
    (what was missing, what filled in)."""

    verdict: Verdict
    breaches: tuple[str, ...]
    notes: tuple[str, ...]
    error_samples: int  # attempts (and probes, when they filled in) the error verdict used
    latency_samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "breaches": list(self.breaches),
                "notes": list(self.notes), "error_samples": self.error_samples,
                "latency_samples": self.latency_samples}


def latency_samples(signals: OriginSignals) -> int:
    """How many observations the quantiles come from (the completed requests when the source
    did not say); 0 without quantiles."""
    if signals.p95_ms is None:
        return 0
    if signals.latency_samples is None:
        return signals.requests
    return signals.latency_samples


def error_counts(signals: OriginSignals, min_samples: int) -> tuple[int, int]:
    """(failed, total) behind a window's error verdict: the attempts the origin served, with
    the window's active probes filling in when the attempts are fewer than `min_samples`."""
    total = signals.requests + signals.connect_failures
    failed = signals.errors_5xx + signals.connect_failures
    if total < min_samples and signals.probes and signals.probe_success is not None:
        total += signals.probes
        failed += round((1 - signals.probe_success) * signals.probes)
    return failed, total


def judge(signals: OriginSignals, policy: FailoverPolicy) -> WindowEvidence:
    """The verdict of one window (see the module docstring)."""
    need = policy.min_samples
    failed, total = error_counts(signals, need)
    notes: list[str] = []
    attempts = signals.requests + signals.connect_failures
    if total > attempts:
        notes.append(f"errors: {attempts} attempts < {need}; {signals.probes} probes "
                     f"({failed - signals.errors_5xx - signals.connect_failures} failed) "
                     "filled in")
    breaches: list[str] = []
    errors_known = total >= need
    rate = failed / total if total else 0.0
    if errors_known:
        low = wilson_lower(failed, total)
        if low > policy.error_rate_threshold:
            breaches.append(f"5xx {rate:.1%} > {policy.error_rate_threshold * 100:g}%")
            notes.append(f"5xx lower bound {low:.1%} ({failed} of {total})")
    else:
        notes.append(f"errors: {total} samples < min_samples {need}")
    counted = latency_samples(signals)
    if signals.latency_from == "whole_request" and counted:
        notes.append("latency from Envoy's zone histogram: a retried request's whole life "
                     "counts against the origin that answered last (no access logs here)")
    latency_known = counted >= need and signals.p95_ms is not None
    p95 = signals.p95_ms
    if latency_known and p95 is not None and p95 > policy.p95_threshold_ms:
        low_ms = signals.p95_low_ms
        if low_ms is None or low_ms > policy.p95_threshold_ms:
            breaches.append(f"p95 {p95:.0f} ms > {policy.p95_threshold_ms} ms")
            backed = "" if low_ms is None else f", lower bound {low_ms:.0f} ms"
            notes.append(f"p95 of {counted} samples ({signals.latency_from}){backed}")
        else:
            notes.append(f"p95 {p95:.0f} ms > {policy.p95_threshold_ms} ms but its lower bound "
                         f"{low_ms:.0f} ms is not: too few slow samples")
    elif not latency_known:
        notes.append(f"latency: {counted} samples < min_samples {need}")
    if breaches:
        verdict: Verdict = "breach"
    elif not (errors_known and latency_known):
        verdict = "inconclusive"
    elif (rate <= policy.error_rate_threshold and p95 is not None
          and p95 <= policy.p95_threshold_ms and signals.p50_ms is not None
          and signals.p50_ms < policy.return_p50_ms):
        verdict = "healthy"
    else:
        verdict = "neither"
    return WindowEvidence(verdict, tuple(breaches), tuple(notes), total, counted)
