"""Pure arithmetic on what a run recorded: percentiles, time series, the headline numbers."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from bench.scenarios.load import Sample
from bench.scenarios.origin import OriginStats


@dataclass
class RunResult:
    """Everything one variant (Ballast or baseline) of a scenario recorded in one run, times in
    seconds after the load started. `store.write_run` keeps it (every request with its origin
    attempts), `store.read_run` reads it back: reports are computed from what was read."""

    label: str  # the variant
    samples: list[Sample]  # every request the load sent, with its attempts at the origins
    seed: int = 0
    run: int = 0  # which of the interleaved runs (0, 1, ...)
    weights: list[tuple[float, str, dict[str, int]]] = field(default_factory=list)
    # (t, pop, hosts out): a baseline's hosts failing their health check (`:hc`) or ejected by
    # outlier detection (`:od`), sampled with the weights
    unhealthy: list[tuple[float, str, tuple[str, ...]]] = field(default_factory=list)
    records: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, pop)
    events: list[tuple[float, str]] = field(default_factory=list)  # (t, what), e.g. kill -9
    # (t, s): how late the bench's own event loop ran a 0.1 s timer; large values mean the
    # machine starved the load generator and origins, and latencies then include that wait
    loop_lag: list[tuple[float, float]] = field(default_factory=list)
    after_restart: list[str] = field(default_factory=list)  # the first records after a restart
    origin_stats: list[tuple[float, str, OriginStats]] = field(default_factory=list)
    decisions: Counter[str] = field(default_factory=Counter)  # Ballast's records by kind
    decision_examples: dict[str, str] = field(default_factory=dict)  # kind → its first rule
    # the issue-21 checks on Ballast's records (`held_though_better`, `shed_while_idle`):
    # how many records each check looked at, and the words of each record that failed it
    nowhere_better: int = 0  # "nowhere better" holds recorded
    held_though_better: list[str] = field(default_factory=list)
    shed_onsets: int = 0  # tier_action on (with a shed tier) and tier_shed on
    shed_with_idle_slots: list[str] = field(default_factory=list)
    envoy_stats: dict[str, dict[str, int]] = field(default_factory=dict)  # pop → counters
    probes: dict[str, dict[str, int]] = field(default_factory=dict)  # origin → path → count
    load_before: str = ""  # the machine's load average (1, 5, 15 min) at the run's start
    load_after: str = ""  # ... and at its end
    started_utc: str = ""
    # restart: the span from the kill to Ballast's next shift in this run's Ballast variant
    # (`focus_on_restart`, computed from the runs, not stored)
    focus: tuple[float, float] | None = None

    @property
    def origin_load(self) -> list[tuple[float, str, int]]:
        return [(t, name, st.load) for t, name, st in self.origin_stats]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; nan for no values (inf when the rank falls on an infinite
    value: `every_latency`)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def failed(sample: Sample) -> bool:
    """Every request that did not get its intended answer: any 5xx (the origin's, Envoy's,
    an overloaded origin's), a shed (503 or 202 from the edge), a timeout, a reset."""
    return sample.cause != ""


def between(samples: Iterable[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.at < end]


def error_rate(samples: Sequence[Sample]) -> float:
    return sum(failed(s) for s in samples) / len(samples) if samples else math.nan


def shed_rate(samples: Sequence[Sample]) -> float:
    """Answered by the edge instead of an origin (503 or 202 with x-ballast-shed)."""
    return sum(s.shed for s in samples) / len(samples) if samples else math.nan


def causes(samples: Iterable[Sample]) -> Counter[str]:
    """Why requests failed: cause → count (only failed requests)."""
    return Counter(s.cause for s in samples if failed(s))


def statuses(samples: Iterable[Sample]) -> Counter[int]:
    """The status codes of failed requests (0: no answer)."""
    return Counter(s.status for s in samples if failed(s))


def answered(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if not failed(s)]


def goodput(samples: Sequence[Sample], deadline_s: float) -> float:
    """Share of `samples` answered 200 by an origin within `deadline_s` of being sent: what the
    users got in time. A late 200 is no better than an error; nan for no samples."""
    if not samples:
        return math.nan
    return sum(not failed(s) and s.latency_ms <= deadline_s * 1000 for s in samples) / len(samples)


def every_latency(samples: Iterable[Sample]) -> list[float]:
    """The latency of every request, a request without its intended answer counted as
    infinitely late: percentiles of these are what every user saw, and a variant cannot
    improve them by failing its slow requests."""
    return [math.inf if failed(s) else s.latency_ms for s in samples]


def latencies(samples: Iterable[Sample]) -> list[float]:
    """Latency of every request that got its intended answer; the rest are errors, counted
    in the error rate and reported beside the latencies as excluded."""
    return [s.latency_ms for s in answered(samples)]


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


@dataclass(frozen=True)
class Spread:
    """One metric over the repeated runs of a variant."""

    values: tuple[float, ...]

    @property
    def clean(self) -> list[float]:
        return sorted(v for v in self.values if not math.isnan(v))

    @property
    def median(self) -> float:
        c = self.clean
        if not c:
            return math.nan
        mid = len(c) // 2
        return c[mid] if len(c) % 2 else (c[mid - 1] + c[mid]) / 2

    @property
    def low(self) -> float:
        return self.clean[0] if self.clean else math.nan

    @property
    def high(self) -> float:
        return self.clean[-1] if self.clean else math.nan


def verdict(ballast: Spread, other: Spread, smaller_is_better: bool = True) -> str:
    """"better" / "worse" (for Ballast) only where the ranges over the runs do not overlap."""
    if not ballast.clean or not other.clean or len(ballast.clean) < 2 or len(other.clean) < 2:
        return "-"
    if ballast.high < other.low:
        return "better" if smaller_is_better else "worse"
    if ballast.low > other.high:
        return "worse" if smaller_is_better else "better"
    return "no difference shown"


def origin_rates(run: RunResult, origin: str, width: float = 1.0
                 ) -> list[tuple[float, float, float, float, int]]:
    """Per `width` bin: (bin end, requests/s, cache hit ratio of the bin's cacheable
    requests (nan: none), backend fetches/s, open connections at the bin's end)."""
    pts = [(t, st) for t, o, st in run.origin_stats if o == origin]
    out, last_t, last = [], 0.0, None
    for t, st in pts:
        if last is None:
            last_t, last = t, st
            continue
        if t - last_t >= width:
            span = t - last_t
            looked = (st.hits - last.hits) + (st.misses - last.misses)
            out.append((t, (st.requests - last.requests) / span,
                        (st.hits - last.hits) / looked if looked else math.nan,
                        (st.misses - last.misses) / span, st.connections))
            last_t, last = t, st
    return out


def origin_requests(run: RunResult, origin: str, start: float, end: float) -> int:
    """Requests (attempts, retries included) the origin received in [start, end)."""
    pts = [(t, st.requests) for t, o, st in run.origin_stats if o == origin and start <= t < end]
    return pts[-1][1] - pts[0][1] if len(pts) >= 2 else 0


def mean_weight(run: RunResult, origin: str, start: float, end: float) -> float:
    """The origin's weight averaged over the PoPs' samples in [start, end)."""
    values = [w.get(origin, 0) for t, _, w in run.weights if w and start <= t < end]
    return sum(values) / len(values) if values else math.nan


# --- checks on the decision records (issue 21: "compare, don't only threshold"; "no shed while
# the shedding tier's origin has idle slots") -----------------------------------------------

Record = Mapping[str, Any]


def is_nowhere_better(record: Record) -> bool:
    return record.get("kind") == "hold" and "nowhere better" in str(record.get("rule", ""))


def held_though_better(record: Record, margin: float, breach_windows: int) -> str | None:
    """For a "nowhere better" hold: the words of an origin whose composite score was better
    than a sick origin's (breach streak at ``breach_windows`` or more) by ``margin`` in the
    record's own inputs; None when none was (what the controller promises)."""
    if not is_nowhere_better(record):
        return None
    scores = {name: float(score["composite"])
              for name, score in ((record.get("inputs") or {}).get("scores") or {}).items()}
    streaks = ((record.get("detail") or {}).get("state") or {}).get("unhealthy_windows") or {}
    sick = [name for name, count in streaks.items() if count >= breach_windows]
    for name in sick:
        for other, score in scores.items():
            if other != name and name in scores and score - scores[name] >= margin - 1e-9:
                return (f"{record.get('pop', '')}: {other} scored {score:.2f}, sick {name} "
                        f"{scores[name]:.2f} (margin {margin:g})")
    return None


def is_shed_onset(record: Record) -> bool:
    """A record that starts shedding: re-prioritization on with a shed tier, or utilization
    shedding on."""
    detail = record.get("detail") or {}
    if detail.get("change") != "on":
        return False
    if record.get("kind") == "tier_shed":
        return True
    actions = detail.get("actions") or {}
    return record.get("kind") == "tier_action" and bool(
        actions.get("shed_tier") or actions.get("shed_tiers"))


def shed_while_idle(record: Record, guarantees: Mapping[str, int]) -> str | None:
    """For a shed onset: words saying how the origin had idle slots in the record's window;
    None when it had none. Re-prioritization (`tier_action`) sheds to relieve its trigger
    tier's queue: idle means that tier's worst Envoy peaked below its slots (guarantee plus
    borrowed slots) with nothing pending and no queue overloaded. Utilization shedding
    (`tier_shed`): idle means the utilization it read was at or below ``shed_threshold``."""
    if not is_shed_onset(record):
        return None
    inputs = record.get("inputs") or {}
    detail = record.get("detail") or {}
    pop = record.get("pop", "")
    if record.get("kind") == "tier_shed":
        used, threshold = float(detail.get("utilization", 0.0)), inputs.get("shed_threshold", 1.0)
        return (f"{pop}: utilization {used:.2f} <= shed_threshold {threshold:g}"
                if used <= threshold else None)
    tier = str(inputs.get("trigger_tier", ""))
    reading = (inputs.get("readings") or {}).get(tier)
    if reading is None or tier not in guarantees:
        return None
    lent = ((inputs.get("state_before") or {}).get("lent") or {}).get(tier, 0)
    slots = guarantees[tier] + lent
    active = max((float(peak) for _, peak in reading.get("active_by_node") or ()), default=0.0)
    demand = active + float(reading.get("pending_max", 0.0))
    if demand < slots and not reading.get("overloaded_max"):
        return (f"{pop}: {tier} peaked at {demand:g} of its {slots} slots, nothing pending "
                f"(trigger {inputs.get('trigger')})")
    return None


def focus_on_restart(runs: Mapping[str, Sequence[RunResult]]) -> None:
    """restart: every variant's run of a seed gets the same span, from Ballast's kill in that
    seed's run to its first weight shift after the restart (`RunResult.focus`)."""
    for ballast in runs.get("ballast", ()):
        if len(ballast.events) < 2:
            continue
        killed = ballast.events[0][0]
        span = (killed, first_shift_after(ballast, ballast.events[1][0]))
        for rs in runs.values():
            for r in rs:
                if r.seed == ballast.seed:
                    r.focus = span


# --- the priority-inversion check (issue 35): "a critical request was shed or timed out while a
# lower-tier request started at the same origin within 50 ms" ------------------------------------

INVERSION_WINDOW_S = 0.05
TIER_RANK = {"critical": 0, "normal": 1, "background": 2}
LOST = ("shed", "deferred", "timeout")  # the causes the check looks at


@dataclass(frozen=True)
class Inversions:
    """One run's count: `lost` critical requests shed (or deferred) or timed out, `inverted`
    of them with a lower-tier request starting work at the same origin within the window of
    the moment the critical one was lost (its client's end), and the `starts` of lower-tier
    requests involved (each counted once)."""

    lost: int
    inverted: int
    starts: int


def inversions(run: RunResult, window_s: float = INVERSION_WINDOW_S) -> Inversions:
    """`Inversions` of one run from its requests and their origin attempts. "The same origin":
    an origin the critical request had an attempt at; one shed at the edge before reaching
    any could have gone to every origin of the run."""
    starts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s in run.samples:
        if TIER_RANK[s.tier] > TIER_RANK["critical"]:
            for v in s.attempts:
                if v.start is not None:
                    starts[v.origin].append((v.start, s.n))
    for values in starts.values():
        values.sort()
    lost = inverted = 0
    involved: set[tuple[str, int, float]] = set()
    for s in run.samples:
        if s.tier != "critical" or s.cause not in LOST:
            continue
        lost += 1
        where = {v.origin for v in s.attempts if not v.mirror} or set(starts)
        found = set()
        for origin in where:
            values = starts.get(origin, [])
            i = bisect.bisect_left(values, (s.end - window_s, -1))
            while i < len(values) and values[i][0] <= s.end + window_s:
                found.add((origin, values[i][1], values[i][0]))
                i += 1
        inverted += bool(found)
        involved |= found
    return Inversions(lost, inverted, len(involved))
