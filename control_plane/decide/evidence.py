"""Evidence before a verdict: what one window of one origin's signals is enough to say. Pure.

The failover source leaves an origin "when the passive 5xx rate crosses 2% or p95 origin latency
spikes past 800ms for two consecutive windows", and warns "Don't tie your shift directly to a single
5xx or timeout". At 40 requests/s with a 5 % warm pool about six standby requests fall in a 30 s
window: one 5xx is 17 %, one slow request is the p95. So a window is judged on its evidence:

- **errors**: n = attempts the origin served (requests + connect failures), k = the failed ones.
  When n is below ``min_samples``, the window's active probes fill in (the failover source: every 5
  s, a cacheable and an uncacheable path, so 12 in a 30 s window): n += probes, k += failed probes.
  It *breaches* only with n >= ``min_samples`` and the Wilson lower bound of k / n (95 % two-sided,
  z = 1.96) above ``error_rate_threshold``: at 20 attempts two 5xx breach (10 %, lower bound 2.8 %),
  one does not (5 %, lower bound 0.9 %).
- **latency**: n = the observations behind the quantiles (``OriginSignals.latency_samples``;
  a source that does not count them leaves it None and the completed requests stand in).
  It *breaches* only with n >= ``min_samples``, p95 above ``p95_threshold_ms`` and, where the
  source gives it, the p95's lower confidence bound (``p95_low_ms``: the order statistic the
  true p95 lies above with ~97.5 % confidence, ``quantile_lower_rank``) above it too: the p95
  is backed by several samples over the threshold, not one (at n = 10, three).

- **abandoned attempts**: attempts the origin started and never finished (``abandoned``: no
  answer, no failure) because another attempt of the request won (a hedge after
  ``hedge_delay``) or the client went away. Envoy resets them: they count in the host's
  ``rq_total`` only, with no ``rq_success``, no ``rq_error`` and no latency sample, so a
  hedged tier hides an origin that answers too late however badly it answers (measured on
  Envoy 1.40: a primary 200 ms slow and 40 % 5xx behind a 50 ms hedge showed 1 % errors and no
  latency sample). Envoy's own outlier detection counts the per-try timeout that starts a hedge
  as a timeout of that host; here n = the attempts the origin started, k = the abandoned ones,
  and the window *breaches* with n >= ``min_samples`` and the Wilson lower bound of k / n above
  ``abandon_threshold`` (10 %: ordinary hedging, an origin's tail beyond the hedge delay, loses
  a few percent of its attempts and stays well below; docs/benchmarks.md has the measured
  shares). An origin with abandoned attempts of which none of its started attempts (at least
  ``NONE_COMPLETED_MIN``) succeeded breaches whatever ``min_samples`` says: it answered
  nothing, it is not inconclusive.

The window's verdict is ``breach`` when any signal breaches with evidence; otherwise
``inconclusive`` when either signal lacks samples (it neither breaches nor counts as healthy:
the controller keeps both streaks as they were); otherwise ``healthy`` when the point estimates
(the abandoned share included) are within the thresholds and p50 < ``return_p50_ms``, else
``neither`` (enough samples, no breach, not healthy: e.g. one 5xx in 20, or p50 over the return
bar).

**No evidence** (``no_evidence``): a window in which no origin of the group has a conclusive
verdict (every one inconclusive, even with no request at all while Envoys report) says nothing
about the group: the controller holds with its own rule, never "steady: within thresholds".

The same rules hold for every metric source (Envoy's sinks, Prometheus, a load-report source):
a source fills ``OriginSignals.requests`` with the attempts started, ``errors_5xx`` with the
failed ones, ``abandoned`` with ``abandoned_attempts(started, succeeded, failed)``; the judging
is here only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy

Z = 1.96  # 95 % two-sided: the confidence of every bound here
# started attempts of a window that, all unfinished, make a breach without min_samples: one
# attempt still in flight when the window closed is not an origin that answers nothing
NONE_COMPLETED_MIN = 2
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


def abandoned_attempts(started: float, succeeded: float, failed: float,
                       in_flight_change: float = 0.0) -> int:
    """Attempts of a window that an origin started and never finished: ``started`` minus the
    ``succeeded`` and ``failed`` ones (increases over the window, any unit), less the growth
    of the attempts in flight where the source knows it (``in_flight_change``: a load report's
    ``total_requests_in_progress`` at the end minus at the start). Never negative. For Envoy's
    per-host counters: ``rq_total - rq_success - (rq_error - cx_connect_fail)`` (a connect
    failure is an ``rq_error`` without ``rq_total``)."""
    return max(0, round(started - succeeded - failed - in_flight_change))


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
    # counters read apart (a 5xx counter and a request counter of different flushes) can
    # disagree: a rate is never above 100 %
    failed = min(signals.errors_5xx + signals.connect_failures, total)
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
    abandoned_ok = _abandoned(signals, policy, breaches, notes)
    if breaches:
        verdict: Verdict = "breach"
    elif not (errors_known and latency_known):
        verdict = "inconclusive"
    elif (rate <= policy.error_rate_threshold and abandoned_ok and p95 is not None
          and p95 <= policy.p95_threshold_ms and signals.p50_ms is not None
          and signals.p50_ms < policy.return_p50_ms):
        verdict = "healthy"
    else:
        verdict = "neither"
    return WindowEvidence(verdict, tuple(breaches), tuple(notes), total, counted)


def abandoned_share(signals: OriginSignals) -> float:
    """The share of the origin's started attempts it never finished (0 with none started)."""
    if signals.requests <= 0:
        return 0.0
    return min(1.0, signals.abandoned / signals.requests)


def _abandoned(signals: OriginSignals, policy: FailoverPolicy, breaches: list[str],
               notes: list[str]) -> bool:
    """The abandoned-attempts rule (module docstring): appends its breach and notes; whether
    the point estimate is within ``abandon_threshold``."""
    started, abandoned = signals.requests, min(signals.abandoned, signals.requests)
    if abandoned <= 0:
        return True
    share = abandoned / started
    if abandoned + signals.errors_5xx >= started and started >= NONE_COMPLETED_MIN:
        failed = started - abandoned
        breaches.append(f"none of its {started} attempts succeeded ({abandoned} abandoned: "
                        f"another attempt won or the client left"
                        + (f"; {failed} failed)" if failed else ")"))
        return False
    limit = policy.abandon_threshold
    if started >= policy.min_samples:
        low = wilson_lower(abandoned, started)
        if low > limit:
            breaches.append(f"abandoned {share:.1%} > {limit * 100:g}%")
            notes.append(f"abandoned lower bound {low:.1%} ({abandoned} of {started} attempts "
                         "unfinished: another attempt won or the client left)")
        else:
            notes.append(f"abandoned {share:.1%} of {started} attempts (lower bound {low:.1%}, "
                         f"breach above {limit * 100:g}%)")
    else:
        notes.append(f"abandoned: {abandoned} of {started} attempts < min_samples "
                     f"{policy.min_samples}")
    return share <= limit


def no_evidence(evidence: Mapping[str, WindowEvidence]) -> bool:
    """Whether a group's window is no evidence at all: every origin's verdict inconclusive
    (module docstring). False without origins (that is the caller's fail static)."""
    return bool(evidence) and all(e.verdict == "inconclusive" for e in evidence.values())
