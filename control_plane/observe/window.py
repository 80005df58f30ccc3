"""Pure window math: counter increases across resets, histogram quantiles, per-origin sums.

No I/O and no clocks: every function takes the samples and the window bounds it needs, so the
sink, the Prometheus source and the tests share one definition of "what happened in the window".
Times are integer milliseconds; a window is the half-open interval (start_ms, end_ms].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Sample = tuple[int, float]  # (time ms, cumulative counter value)
Buckets = tuple[tuple[float, float], ...]  # (upper bound ms, cumulative count), bounds ascending


def counter_increase(samples: Sequence[Sample], start_ms: int, end_ms: int) -> float:
    """How much a cumulative counter grew within (start_ms, end_ms]; never negative.

    The baseline is the newest sample at or before `start_ms` (else the first sample inside the
    window, whose own value is not counted: it may carry history from before the window). A drop
    in value is a reset (CDS update, restart): the counter restarted from zero, so the value
    after the drop is all new growth. Samples must be in time order.
    """
    baseline: float | None = None
    total = 0.0
    for t, value in samples:
        if t > end_ms:
            break
        if not math.isfinite(value) or value < 0:
            continue
        if t <= start_ms or baseline is None:
            baseline = value
            continue
        total += value - baseline if value >= baseline else value
        baseline = value
    return total


def add_buckets(a: Buckets, b: Buckets) -> Buckets:
    """Sum two histograms; bounds that only one side has are kept (counts carried forward)."""
    if not a:
        return b
    if not b:
        return a
    bounds = sorted({bound for bound, _ in a} | {bound for bound, _ in b})
    return tuple((bound, _cumulative_at(a, bound) + _cumulative_at(b, bound)) for bound in bounds)


def _cumulative_at(buckets: Buckets, bound: float) -> float:
    count = 0.0
    for upper, cumulative in buckets:
        if upper > bound:
            break
        count = cumulative
    return count


def quantile(q: float, buckets: Buckets, total: float | None = None) -> float | None:
    """The q-quantile of a bucketed distribution, interpolated linearly inside a bucket.

    Same rule as PromQL's `histogram_quantile`: the lower edge of the first bucket is 0, and a
    rank beyond the last finite bound answers that bound. `total` is the observation count when
    it exceeds the last bucket (Envoy's sink omits the +Inf bucket). None when empty.
    """
    if not buckets:
        return None
    count = max(total or 0.0, buckets[-1][1])
    if count <= 0:
        return None
    rank = q * count
    lower_bound, lower_count = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank and cumulative > lower_count:
            if math.isinf(upper):
                return lower_bound
            share = (rank - lower_count) / (cumulative - lower_count)
            return lower_bound + (upper - lower_bound) * share
        lower_bound, lower_count = upper, cumulative
    return lower_bound


@dataclass(frozen=True)
class OriginWindow:
    """One (PoP, cluster, origin) over a window, before tiers are merged into the group."""

    requests: float = 0.0
    errors_5xx: float = 0.0
    latency: Buckets = ()
    latency_count: float = 0.0
    observed_at_ms: int = 0

    def merge(self, other: OriginWindow) -> OriginWindow:
        return OriginWindow(
            requests=self.requests + other.requests,
            errors_5xx=self.errors_5xx + other.errors_5xx,
            latency=add_buckets(self.latency, other.latency),
            latency_count=self.latency_count + other.latency_count,
            observed_at_ms=max(self.observed_at_ms, other.observed_at_ms),
        )


def merge_all(windows: Iterable[OriginWindow]) -> OriginWindow:
    merged = OriginWindow()
    for window in windows:
        merged = merged.merge(window)
    return merged


def split_cluster(cluster: str) -> tuple[str, str] | None:
    """`shop.critical` -> (`shop`, `critical`); clusters without a tier (ballast_xds) -> None."""
    group, dot, tier = cluster.rpartition(".")
    if not dot or not group or not tier:
        return None
    return group, tier


@dataclass(frozen=True)
class HostWindow:
    """One origin's per-host (per-attempt) counters over a window, tiers and Envoys summed.

    `requests` = host `rq_total` (every attempt, retried ones included), `errors` = `rq_error`
    minus `cx_connect_fail` (attempts answered 5xx or failed by reset/timeout; Envoy counts a
    connect failure as an `rq_error` too), `connect_failures` = `cx_connect_fail`, `abandoned`
    = the attempts neither answered nor failed (`rq_total - rq_success - errors`: a hedge won,
    the client left; `decide/evidence.py` `abandoned_attempts`), 0 where `rq_success` was not
    reported.
    """

    requests: float = 0.0
    errors: float = 0.0
    connect_failures: float = 0.0
    observed_at_ms: int = 0
    abandoned: float = 0.0

    def merge(self, other: HostWindow) -> HostWindow:
        return HostWindow(
            requests=self.requests + other.requests,
            errors=self.errors + other.errors,
            connect_failures=self.connect_failures + other.connect_failures,
            observed_at_ms=max(self.observed_at_ms, other.observed_at_ms),
            abandoned=self.abandoned + other.abandoned,
        )
