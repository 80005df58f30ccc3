"""Pure arithmetic on what a run recorded: percentiles, time series, the headline numbers."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from bench.scenarios.load import Sample


@dataclass
class RunResult:
    """Everything one variant (Ballast or baseline) of a scenario recorded, times in seconds
    after the load started."""

    label: str
    samples: list[Sample]
    weights: list[tuple[float, str, dict[str, int]]] = field(default_factory=list)
    origin_load: list[tuple[float, str, int]] = field(default_factory=list)
    records: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, pop)
    events: list[tuple[float, str]] = field(default_factory=list)  # (t, what), e.g. kill -9
    # (t, s): how late the bench's own event loop ran a 0.1 s timer; large values mean the
    # machine starved the load generator and origins, and latencies then include that wait
    loop_lag: list[tuple[float, float]] = field(default_factory=list)
    after_restart: list[str] = field(default_factory=list)  # the first records after a restart


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def failed(sample: Sample) -> bool:
    """A user-visible error: no answer or a 5xx that is not a deliberate shed."""
    return not sample.shed and (sample.status == 0 or sample.status >= 500)


def between(samples: Iterable[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.at < end]


def error_rate(samples: Sequence[Sample]) -> float:
    return sum(failed(s) for s in samples) / len(samples) if samples else math.nan


def shed_rate(samples: Sequence[Sample]) -> float:
    return sum(s.shed for s in samples) / len(samples) if samples else math.nan


def success_rate(samples: Sequence[Sample]) -> float:
    return sum(200 <= s.status < 300 for s in samples) / len(samples) if samples else math.nan


def latencies(samples: Iterable[Sample]) -> list[float]:
    """Latency of every request that was not shed (errors and timeouts count: users wait)."""
    return [s.latency_ms for s in samples if not s.shed]


def binned(samples: Iterable[Sample], width: float) -> dict[int, list[Sample]]:
    bins: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        bins[int(s.at // width)].append(s)
    return dict(sorted(bins.items()))


def series(samples: Iterable[Sample], width: float, fn: Any) -> tuple[list[float], list[float]]:
    """(bin centres, fn(bin samples)) for every non-empty bin."""
    xs, ys = [], []
    for index, group in binned(samples, width).items():
        xs.append((index + 0.5) * width)
        ys.append(fn(group))
    return xs, ys


def peak_rps(samples: Iterable[Sample], origin: str, width: float = 1.0) -> float:
    counts = [sum(s.origin == origin for s in group)
              for group in binned(samples, width).values()]
    return max(counts, default=0) / width


def peak_load(run: RunResult, origin: str, start: float, end: float) -> int:
    return max((n for t, o, n in run.origin_load if o == origin and start <= t < end), default=0)


def first_shift_after(run: RunResult, t: float) -> float:
    """When the first weight shift after `t` was recorded; the run's end when none was."""
    shifts = [at for at, kind, _ in run.records if at > t and kind == "weight_shift"]
    return min(shifts, default=max((s.at for s in run.samples), default=t))


def weight_range(run: RunResult, pop: str, origin: str) -> tuple[int, int]:
    values = [w.get(origin, 0) for _, p, w in run.weights if p == pop and w]
    return (min(values), max(values)) if values else (0, 0)


def weight_changes(run: RunResult, pop: str, origin: str) -> int:
    """How often the origin's weight in this PoP changed (sampled)."""
    values = [w.get(origin, 0) for _, p, w in run.weights if p == pop and w]
    return sum(a != b for a, b in pairwise(values))


def weight_travel(run: RunResult, pop: str, origin: str) -> int:
    """Total points the origin's weight moved, up and down: the oscillation a flap causes."""
    values = [w.get(origin, 0) for _, p, w in run.weights if p == pop and w]
    return sum(abs(a - b) for a, b in pairwise(values))


def largest_rise(run: RunResult, pop: str, origin: str) -> int:
    """The most points the origin's weight gained between two samples: a binary failover
    hands a standby everything at once (100), a gradual one a step at a time."""
    values = [w.get(origin, 0) for _, p, w in run.weights if p == pop and w]
    return max((b - a for a, b in pairwise(values)), default=0)


def ratio(baseline: float, ballast: float) -> float:
    """baseline / Ballast: above 1 means Ballast's number is smaller."""
    if math.isnan(baseline) or math.isnan(ballast):
        return math.nan
    if ballast == 0:
        return math.inf if baseline > 0 else 1.0
    return baseline / ballast
