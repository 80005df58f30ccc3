"""The report of a scenario over its repeated runs, computed from the runs' files alone
(`store.read_runs`) by `render`: goodput within each tier's deadline as the headline, beside
the raw error rate; percentiles of every request (a miss counted as infinitely late) beside
those of answered requests; median and range per variant with a verdict only where the ranges
do not overlap; the checks (priority inversions, Ballast's decision records); Envoy's own
counters showing each baseline's mechanisms act; every failed request by cause; the standby's
warming; the machine's load per run; what the time compression costs; every variant's
configuration in full."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.scenarios.analysis import (
    TIER_RANK,
    RunResult,
    Spread,
    between,
    causes,
    error_rate,
    every_latency,
    failed,
    goodput,
    inversions,
    latencies,
    mean_weight,
    origin_rates,
    origin_requests,
    peak_load,
    percentile,
    shed_rate,
    statuses,
    verdict,
    weight_travel,
)
from bench.scenarios.load import CAUSES, CLIENT_TIMEOUT_S, MIX, Sample
from bench.scenarios.origin import SIGMA
from bench.scenarios.plots import write_plots
from bench.scenarios.runner import Scenario, scenario_tiers
from bench.scenarios.stack import (
    CLASSIFIER,
    FAILOVER_BASELINES,
    OUTLIER_INTERVAL_S,
    PRIORITY_BASELINES,
    ballast_desired,
    failover_bootstrap,
    give_up_s,
    outlier_volume,
    priority_bootstrap,
)
from bench.scenarios.timers import COMPRESSION, compressed
from bench.scenarios.timers import table as timer_table

LATE_LOOP_S = 0.1  # a run whose loop lag p99 is above this: the machine delayed the bench
FELL_OVER_ERRORS = 0.10  # a standby "falls over" when over 10 % of what it answers fails ...
TAKEOVER = 0.5  # ... in the seconds after it first carries half the offered load


@dataclass(frozen=True)
class Deadline:
    tier: str
    seconds: float
    source: str


# An answer later than seed 000's edge would have waited for (`stack.give_up_s`) is lost.
DEADLINES = {
    tier: Deadline(tier, give_up_s(tier), f"seed 000 tier {TIER_RANK[tier]}: `timeoutMs: "
                   f"{timeout_ms}` x (1 + `retryBudget: {budget}`)")
    for tier, (timeout_ms, budget) in CLASSIFIER.items()
}


def deadline_s(sample: Sample) -> float:
    return DEADLINES[sample.tier].seconds


def on_time(samples: Sequence[Sample]) -> float:
    """Share answered 200 within each request's own tier's deadline (`goodput` per tier)."""
    if not samples:
        return math.nan
    return sum(not failed(s) and s.latency_ms <= deadline_s(s) * 1000
               for s in samples) / len(samples)


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[Scenario, RunResult], float]
    smaller_is_better: bool = True
    judged: bool = True  # False: a description (a split, a weight), no better or worse


Rows = list[tuple[Metric, dict[str, Spread]]]


def window(scenario: Scenario) -> tuple[float, float]:
    a, b = scenario.incident
    return a * scenario.duration_s, b * scenario.duration_s


def _during(scenario: Scenario, run: RunResult, kind: str = "") -> list[Sample]:
    start, end = window(scenario)
    return [s for s in between(run.samples, start, end) if not kind or s.kind == kind]


# --- the headline -----------------------------------------------------------------------------


def goodput_metrics() -> list[Metric]:
    rows = [Metric("all requests: answered within their tier's deadline (%)",
                   lambda sc, r: 100 * on_time(_during(sc, r)), smaller_is_better=False)]
    for kind in MIX:
        d = DEADLINES[kind.tier].seconds
        rows.append(Metric(f"{kind.name} ({kind.tier}): answered within {d:g} s (%)",
                           lambda sc, r, k=kind.name, d=d: 100 * goodput(_during(sc, r, k), d),
                           smaller_is_better=False))
    rows.append(Metric("all requests: error rate, every cause (%)",
                       lambda sc, r: 100 * error_rate(_during(sc, r))))
    for kind in MIX:
        rows.append(Metric(f"{kind.name}: error rate, every cause (%)",
                           lambda sc, r, k=kind.name: 100 * error_rate(_during(sc, r, k))))
    # how many of the failures the edge answered itself: a shed is a failure, judged in the
    # error rate above; this row says how the variant failed
    rows.append(Metric("checkout: shed at the edge (%)",
                       lambda sc, r: 100 * shed_rate(_during(sc, r, "checkout")), judged=False))
    rows.append(Metric("image: shed at the edge (%)",
                       lambda sc, r: 100 * shed_rate(_during(sc, r, "image")), judged=False))
    return rows


QUANTILES = {"checkout": (50, 95, 99), "html": (50, 95), "image": (50, 95)}


def latency_metrics() -> list[Metric]:
    rows = []
    for kind, qs in QUANTILES.items():
        for q in qs:
            rows.append(Metric(f"{kind}: p{q} of every request (ms; a miss is ∞)",
                               lambda sc, r, k=kind, q=q: percentile(
                                   every_latency(_during(sc, r, k)), q)))
            rows.append(Metric(f"{kind}: p{q} of answered requests (ms)",
                               lambda sc, r, k=kind, q=q: percentile(
                                   latencies(_during(sc, r, k)), q)))
        rows.append(Metric(f"{kind}: not answered, left out of the line above (count)",
                           lambda sc, r, k=kind: sum(failed(s) for s in _during(sc, r, k))))
    return rows


def _takeover(scenario: Scenario, run: RunResult) -> float:
    """When the standby first carried half the offered requests/s (1 s bins); nan: never."""
    offered = scenario.rps_per_pop * len(scenario.pops)
    return next((t for t, rps, *_ in origin_rates(run, scenario.standby)
                 if rps >= TAKEOVER * offered), math.nan)


def standby_errors_after_takeover(scenario: Scenario, run: RunResult) -> float:
    """% of the standby's answers that were not 200 in the 5 s (50 s real) after takeover."""
    t = _takeover(scenario, run)
    if math.isnan(t):
        return math.nan
    mine = [s for s in between(run.samples, t - 1, t + compressed(50))
            if s.origin == scenario.standby]
    return 100 * sum(s.status != 200 for s in mine) / len(mine) if mine else math.nan


def standby_hit_after_takeover(scenario: Scenario, run: RunResult) -> float:
    t = _takeover(scenario, run)
    hits = [h for at, _, h, _, _ in origin_rates(run, scenario.standby)
            if t <= at < t + compressed(50) and not math.isnan(h)]
    return 100 * min(hits) if hits else math.nan


def _peak(run: RunResult, origin: str, field: str) -> float:
    return max((getattr(st, field) for _, o, st in run.origin_stats if o == origin), default=0)


def _split(scenario: Scenario, run: RunResult) -> float:
    start, end = window(scenario)
    got = {o: origin_requests(run, o, start, end) for o in scenario.origins}
    total = sum(got.values())
    return got[scenario.standby] / total if total else math.nan


def _after_kill(scenario: Scenario, run: RunResult) -> float:
    """Over the same span for every variant of a run (`RunResult.focus`): from the kill to
    Ballast's next weight shift after the restart."""
    if run.focus is None:
        return math.nan
    return 100 * error_rate(between(run.samples, *run.focus))


def _standby_early_p95(scenario: Scenario, run: RunResult) -> float:
    """What clients waited for the standby's answers while it warmed (retried requests include
    their first attempt)."""
    start, _ = window(scenario)
    return percentile([s.latency_ms for s in between(run.samples, start, start + 10)
                       if s.origin == scenario.standby and s.status == 200], 95)


def scenario_metrics(scenario: Scenario) -> list[Metric]:
    if not scenario.standby:
        origin = next(iter(scenario.origins))
        return [Metric("origin: peak load (working + waiting)",
                       lambda sc, r: peak_load(r, origin, 0, sc.duration_s), judged=False)]
    standby = scenario.standby
    spec = scenario.origins[standby]
    rows = [
        Metric(f"standby: peak load (working + waiting; full at {spec.workers + spec.max_waiting})",
               lambda sc, r: peak_load(r, standby, 0, sc.duration_s)),
        Metric(f"standby: peak open connections (cap {spec.max_connections})",
               lambda sc, r: _peak(r, standby, "connections")),
        Metric("standby: not-200 share of its answers, 5 s after it took half the load (%)",
               standby_errors_after_takeover),
        Metric("standby: lowest hit ratio in those 5 s (%)", standby_hit_after_takeover, False),
        Metric("standby: p95 of what it answered, first 10 s of the incident (ms)",
               _standby_early_p95, judged=False),
        Metric("standby: share of origin requests, incident, retries included (%)",
               lambda sc, r: 100 * _split(sc, r), judged=False),
        Metric("standby: mean weight, incident (%)",
               lambda sc, r: mean_weight(r, standby, *window(sc)), judged=False),
    ]
    rows += [Metric(f"weight moved in {pop} (points up and down; primary's share)",
                    lambda sc, r, pop=pop: weight_travel(r, pop, "primary"))
             for pop in scenario.pops]
    if scenario.kill_at is not None:
        rows.append(Metric("error rate from the kill to Ballast's next shift (%)", _after_kill))
    return rows


def tables(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]]
           ) -> list[tuple[str, Rows]]:
    """The report's three headline tables, each metric as a Spread over every variant's
    runs."""
    def spreads(metrics: list[Metric]) -> Rows:
        return [(m, {v: Spread(tuple(m.fn(scenario, r) for r in rs)) for v, rs in runs.items()})
                for m in metrics]

    return [("Goodput within each tier's deadline, and the raw error rate", spreads(
                goodput_metrics())),
            ("Latency: of every request (a miss counts as ∞) beside answered requests only",
             spreads(latency_metrics())),
            ("What the scenario is about" if scenario.standby else "The origin",
             spreads(scenario_metrics(scenario)))]


def _num(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cell(spread: Spread) -> str:
    if not spread.clean:
        return "-"
    return f"{_num(spread.median)} [{_num(spread.low)}-{_num(spread.high)}]"


def markdown_table(rows: Rows, variants: Sequence[str]) -> list[str]:
    baselines = [v for v in variants if v != "ballast"]
    head = ["metric", *variants, *(f"vs {b}" for b in baselines)]
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(variants) + "---|" * len(baselines)]
    for metric, spreads in rows:
        cells = [_cell(spreads[v]) for v in variants]
        cells += [_short(verdict(spreads["ballast"], spreads[b], metric.smaller_is_better))
                  if metric.judged else "" for b in baselines]
        lines.append(f"| {metric.name} | " + " | ".join(cells) + " |")
    return lines


def _short(word: str) -> str:
    return {"better": "**better**", "worse": "**worse**", "no difference shown": "overlap"}.get(
        word, word)


def lost_rows(tables_: Sequence[tuple[str, Rows]]) -> list[tuple[Metric, str, Spread, Spread]]:
    """(metric, baseline, the baseline's spread, Ballast's) wherever Ballast is worse."""
    out = []
    for _, rows in tables_:
        for metric, spreads in rows:
            for variant, spread in spreads.items():
                if variant != "ballast" and metric.judged and verdict(
                        spreads["ballast"], spread, metric.smaller_is_better) == "worse":
                    out.append((metric, variant, spread, spreads["ballast"]))
    return out


def summary_counts(tables_: Sequence[tuple[str, Rows]]) -> Counter[str]:
    """How many verdicts of each kind a report has (for the command's printout)."""
    out: Counter[str] = Counter()
    for _, rows in tables_:
        for metric, spreads in rows:
            for variant, spread in spreads.items():
                if variant != "ballast" and metric.judged:
                    out[verdict(spreads["ballast"], spread, metric.smaller_is_better)] += 1
    return out


# --- why Ballast loses a row, from the records ---------------------------------------------------

KIND_OF_METRIC = {k.name: k for k in MIX}

# the mechanisms behind a lost row, Ballast's side; the numbers under them come from this
# report's own requests and records
WHY = {
    ("failover", "checkout"): (
        "during Ballast's gradual shift (a step per tick after two breached windows) part of "
        "the traffic stays on the bleeding primary, where a baseline's health check or "
        "ejections take it all off at once; what stays meets the primary's 5xx, and retries, "
        "capped at 15 % of requests (seed 002's budget) in Ballast and the baselines alike, "
        "cannot cover a failure rate above that (the attempts per failed request below)"),
    ("failover", "html"): (
        "as for checkout: the share left on the bleeding primary during the gradual shift "
        "meets its 5xx, and the normal tier's one retry is capped by the same 15 % budget"),
    ("failover", "image"): (
        "Ballast's background tier has no retries of its own (seed 000 gives tier 2 "
        "`retryBudget: 0`, and Ballast's default tier set follows it), so an image "
        "revalidation fails on the first 5xx of an origin that worked on it — the bleeding "
        "primary's — where every baseline retries any request up to twice on another host and "
        "priority; only an attempt no origin served (the standby's 503 at its connection cap or "
        "full wait line) is retried, once, on the other origin (since issue 35; in runs made "
        "before, such refusals were final: \"refused\" below); and while part of the traffic "
        "stays on the primary, images meet its creeping latency in a pool of 5 % of the "
        "group's slots"),
    ("failover", "all"): (
        "the tiers' rows together (see each tier's): what Ballast leaves on the bleeding "
        "primary during its gradual shift meets the primary's 5xx, and its background tier "
        "does not retry"),
    ("failover", "standby"): (
        "Ballast sends the standby its warm pool and a mirror from the start and moves weight "
        "to it a step per tick, so the standby carries traffic and connections all along; "
        "the standby section below gives each run"),
    ("priority", "checkout"): (
        "the critical tier's queue is bounded in time (seed 000's 800 ms `queue_timeout`: its "
        "limit is its slots x 800 ms / the origin's measured p50), so a checkout request that "
        "finds it full is answered 503 at the edge at once; its slots are 70 % of the origin's "
        "and the tier controller lends only idle ones: while every tier wants more than its "
        "slots, critical cannot take any back (issue 35's priority inversion)"),
    ("priority", "html"): (
        "while checkout's pool wait is over its trigger the tier controller demotes half of the "
        "normal tier into the background pool, and both pools' queues are bounded in time: "
        "HTML past them is answered 503 at the edge at once"),
    ("priority", "image"): (
        "background requests are shed at the edge while the tier controller protects checkout "
        "(seed 000: shed P2 first) and when the background tier's time-bounded queue overflows"),
    ("priority", "all"): (
        "the sum of the tiers' rows: the tier controller sheds and demotes lower tiers at the "
        "edge, and its critical queue sheds what it cannot serve within 800 ms"),
}


def _family(scenario: Scenario) -> str:
    return "failover" if scenario.standby else "priority"


def _metric_kind(metric: Metric) -> str:
    word = metric.name.split(":")[0].split(" ")[0]
    if word in KIND_OF_METRIC or word == "standby":
        return word
    if word == "weight":
        return "standby"
    if word in ("all", "error"):
        return "all"
    return ""


def _causes_line(samples: Sequence[Sample]) -> str:
    """What happened to `samples`: failures by cause, how many attempts the failed ones had at
    the origins and how their last attempt ended there, answers after the deadline."""
    why = causes(samples)
    late = sum(not failed(s) and s.latency_ms > deadline_s(s) * 1000 for s in samples)
    parts = [f"{why[c]} {c}" for c in CAUSES if why.get(c)]
    tries = [[v for v in s.attempts if not v.mirror] for s in samples if failed(s)]
    attempts = Counter(min(len(t), 3) for t in tries)
    last = Counter(f"{t[-1].origin} {t[-1].result}" for t in tries if t)
    words = {0: "no attempt at an origin", 1: "one attempt", 2: "two", 3: "three or more"}
    how = (" — attempts per failed request: " + ", ".join(
               f"{attempts[n]} {words[n]}" for n in sorted(attempts))
           + "; their last attempt at the origin: " + (", ".join(
               f"{n} {what}" for what, n in last.most_common(4)) or "none")) if tries else ""
    return (f"{len(samples)} requests: " + (", ".join(parts) or "none failed") + how
            + f"; {late} answered after the deadline")


def where_ballast_loses(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]],
                        tables_: Sequence[tuple[str, Rows]]) -> list[str]:
    lines = ["## Where Ballast loses, and why", ""]
    lost = lost_rows(tables_)
    if not lost:
        return [*lines, "No row where a baseline's range lies wholly on the better side of "
                "Ballast's; rows marked \"overlap\" are wins for neither.", ""]
    for metric, variant, theirs, ours in lost:
        lines.append(f"- **{metric.name}** against {variant}: {_cell(ours)} vs {_cell(theirs)}")
    lines += ["", "From the requests of every run (incident window, all runs together) and "
              "Ballast's records:", ""]
    kinds = sorted({_metric_kind(m) for m, *_ in lost} - {""},
                   key=lambda k: [*KIND_OF_METRIC, "all", "standby"].index(k))
    family = _family(scenario)
    for kind in kinds:
        if kind == "standby":
            lines.append(f"- **standby**: {WHY[(family, kind)]}.")
            continue
        against = sorted({v for m, v, *_ in lost if _metric_kind(m) == kind},
                         key=list(runs).index)
        ours = [s for r in runs["ballast"] for s in _during(scenario, r, "" if kind == "all"
                                                            else kind)]
        lines.append(f"- **{kind}**: {WHY[(family, kind)]}. Ballast: {_causes_line(ours)}.")
        for variant in against:
            theirs = [s for r in runs[variant] for s in _during(scenario, r, "" if kind == "all"
                                                                else kind)]
            lines.append(f"  {variant}: {_causes_line(theirs)}.")
    lines += ["", "Ballast's records per run (seeds "
              + ", ".join(str(r.seed) for r in runs["ballast"]) + "): " + ", ".join(
                  f"`{kind}` " + "/".join(str(r.decisions.get(kind, 0)) for r in runs["ballast"])
                  for kind in _telling(runs["ballast"])) + ".", ""]
    return lines


def _telling(ours: Sequence[RunResult]) -> list[str]:
    """The record kinds that say why traffic moved or was shed."""
    kinds = {k for r in ours for k in r.decisions}
    return [k for k in ("weight_shift", "return", "ramp_back_off", "tier_action", "tier_shed",
                        "tier_queue", "tier_lend", "tier_reclaim") if k in kinds]


# --- checks -------------------------------------------------------------------------------------


def inversion_check(runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    lines = ["### Priority inversions (issue 35)", "",
             "\"A critical request was shed or timed out while a lower-tier request started at "
             "the same origin within 50 ms\", counted per run over every request of the run "
             "(the whole run, not only the incident): critical requests shed (or deferred) or "
             "timed out; how many of them had a lower-tier request start work at the same "
             "origin within 50 ms of the moment the client got the shed or gave up (origin-side "
             "start times from the origins' own records); and the lower-tier starts involved. "
             "A critical request shed at the edge before reaching an origin could have gone to "
             "any origin of the run.", "",
             "| variant | critical shed or timed out, per run | ... of them inverted | "
             "lower-tier starts involved |", "|---|---|---|---|"]
    for variant, rs in runs.items():
        found = [inversions(r) for r in rs]
        lines.append(f"| {variant} | {' / '.join(str(f.lost) for f in found)} | "
                     f"{' / '.join(str(f.inverted) for f in found)} | "
                     f"{' / '.join(str(f.starts) for f in found)} |")
    return [*lines, ""]


def record_checks(runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    """Issue 21's two checks, counted over every decision record of every Ballast run."""
    ours = runs["ballast"]

    def per_run(values: Iterable[int]) -> str:
        return " / ".join(str(v) for v in values)

    found = [text for r in ours for text in (*r.held_though_better, *r.shed_with_idle_slots)]
    lines = [
        "### Ballast's decision records", "",
        "Counted over every record of every run (seeds " + ", ".join(str(r.seed) for r in ours)
        + "), each with the run's own desired state. A \"nowhere better\" hold fails the first "
        "check when its own inputs show an origin whose composite score was better than a sick "
        "origin's by `compare_margin`. A shed onset (re-prioritization with a shed tier, or "
        "utilization shedding) fails the second when its window shows idle slots: the trigger "
        "tier's worst Envoy peaked below its slots (guarantee plus borrowed) with nothing "
        "pending and no queue overloaded, or the utilization read was at or below "
        "`shed_threshold`.", "",
        "| check | per run |", "|---|---|",
        f"| \"nowhere better\" holds recorded | {per_run(r.nowhere_better for r in ours)} |",
        "| ... while an origin scored better than a sick one by the margin | "
        f"{per_run(len(r.held_though_better) for r in ours)} |",
        f"| shed onsets recorded | {per_run(r.shed_onsets for r in ours)} |",
        "| ... while the shedding tier's origin had idle slots | "
        f"{per_run(len(r.shed_with_idle_slots) for r in ours)} |",
        "",
    ]
    if found:
        lines += ["The records that failed a check:", "", "```", *found[:20], "```", ""]
    return lines


# --- Envoy's own evidence -----------------------------------------------------------------------


def _stat(run: RunResult, suffix: str, cluster: Callable[[str], bool] = lambda c: True) -> int:
    total = 0
    for stats in run.envoy_stats.values():
        for name, value in stats.items():
            if name.endswith("." + suffix) and cluster(name[len("cluster."):-len(suffix) - 1]):
                total += value
    return total


def _went_out(run: RunResult, why: str) -> int:
    """How many times a host went out (`hc`: failed its health check, `od`: ejected), from
    the 0.5 s samples of every PoP."""
    count = 0
    for pop in {p for _, p, _ in run.unhealthy}:
        before: set[str] = set()
        for _, p, out in run.unhealthy:
            if p != pop:
                continue
            now = {h for h in out if h.endswith(":" + why)}
            count += len(now - before)
            before = now
    return count


def _mirror(name: str) -> bool:
    return "mirror" in name


def _evidence_cells(r: RunResult) -> list[str]:
    return [
        f"{_stat(r, 'outlier_detection.ejections_enforced_total')} "
        f"({_stat(r, 'outlier_detection.ejections_enforced_consecutive_5xx')} / "
        f"{_stat(r, 'outlier_detection.ejections_enforced_failure_percentage')} / "
        f"{_stat(r, 'outlier_detection.ejections_enforced_success_rate')})",
        str(_stat(r, "outlier_detection.ejections_detected_failure_percentage")),
        str(_went_out(r, "od")),
        f"{_stat(r, 'health_check.failure')} of {_stat(r, 'health_check.attempt')}",
        str(_went_out(r, "hc")),
        f"{_stat(r, 'upstream_rq_total', _mirror)} / "
        f"{sum(v.mirror for s in r.samples for v in s.attempts)}",
        str(_stat(r, "upstream_rq_retry", lambda c: not _mirror(c))),
        str(_stat(r, "upstream_rq_pending_overflow", lambda c: not _mirror(c))),
        str(_stat(r, "upstream_rq_timeout") + _stat(r, "upstream_rq_per_try_timeout")),
    ]


def envoy_evidence(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    hedges = (f" The checkout route hedges: each attempt unanswered after "
              f"{scenario.hedge_delay_ms} ms is a per-try timeout that sends a hedge, counted "
              "among the retries too." if scenario.hedge_delay_ms else "")
    lines = ["## Envoy's own evidence that each mechanism acted", "",
             "Envoy's counters at the end of each run (`/stats`, summed over the PoPs' Envoys), "
             "and how often a host went out, from `/clusters` sampled every 0.5 s. Ballast's "
             "Envoys run no health checks or outlier detection of their own (its probes and "
             "signals decide, its records say what it did); their mirror and overflow counters "
             "are Envoy's." + hedges, "",
             "| variant | seed | ejections enforced (consecutive 5xx / failure % / success "
             "rate) | failure-% ejections detected | hosts ejected (samples) | health-check "
             "failures of attempts | hosts failed by health checks (samples) | mirror requests "
             "(Envoy / seen by the standby) | retries | queue overflows | timeouts (route + per "
             "try) |", "|---|---|" + "---:|" * 9]
    for variant, rs in runs.items():
        for r in rs:
            lines.append(f"| {variant} | {r.seed} | " + " | ".join(_evidence_cells(r)) + " |")
    return [*lines, ""]


# --- every failed request -----------------------------------------------------------------------


def breakdown(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    """Failed requests by cause and status code, per variant and tier, all runs together."""
    lines = ["## Every failed request, by cause and status (incident window, all runs together)",
             "",
             "A request fails when it does not get its intended answer (a 200 from an origin): "
             "a 5xx from an origin or from Envoy, a shed at the edge (Ballast's 503 with "
             "`x-ballast-shed`, or Envoy's own 503 when a pool's queue overflows, "
             "`x-envoy-overloaded`) or a deferral (202), a timeout (504, or no answer within the "
             f"client's {CLIENT_TIMEOUT_S:g} s), a reset. Status 0: no answer. \"Late\": "
             "answered 200 after the tier's deadline.", "",
             "| variant | tier | requests | failed (%) | late | " + " | ".join(CAUSES)
             + " | status codes |", "|---|---|---:|---:|---:|" + "---:|" * len(CAUSES) + "---|"]
    for variant, rs in runs.items():
        for kind in MIX:
            sel = [s for r in rs for s in _during(scenario, r, kind.name)]
            why = causes(sel)
            late = sum(not failed(s) and s.latency_ms > deadline_s(s) * 1000 for s in sel)
            codes = ", ".join(f"{c}x{n}" for c, n in sorted(statuses(sel).items()))
            lines.append(f"| {variant} | {kind.tier} ({kind.name}) | {len(sel)} | "
                         f"{_num(100 * error_rate(sel))} | {late} | "
                         + " | ".join(str(why.get(c, 0)) for c in CAUSES) + f" | {codes} |")
    return [*lines, ""]


# --- the standby --------------------------------------------------------------------------------


def standby_section(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    if not scenario.standby:
        return []
    spec = scenario.origins[scenario.standby]
    ttl = spec.cache_ttl_s or 0.0
    lines = ["## The standby: did it fall over?", "",
             f"The standby has {spec.workers} workers and {spec.max_waiting} places to wait "
             f"(beyond them it answers 503 at once), at most {spec.max_connections} open "
             f"connections (a new one costs {spec.connect_ms:.0f} ms), a cache that forgets an "
             f"object not asked for in {ttl:g} s ({COMPRESSION * ttl:.0f} s real), misses "
             f"costing {spec.miss_ms:.0f} ms of backend work. It **falls over** "
             f"here when more than {FELL_OVER_ERRORS:.0%} of what it answers fails in the "
             f"{compressed(50):g} s ({50} s real) after it first carries half the offered "
             "load (seed 002: it \"fell over fifteen seconds later\").", "",
             "| variant | run (seed) | took half the load at (s) | not-200 of its answers "
             "after (%) | lowest hit ratio after (%) | peak load | peak connections | "
             "peak fetches/s | fell over |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for variant, rs in runs.items():
        for r in rs:
            t = _takeover(scenario, r)
            errors = standby_errors_after_takeover(scenario, r)
            fell = "-" if math.isnan(errors) else (
                "**yes**" if errors > 100 * FELL_OVER_ERRORS else "no")
            lines.append(
                f"| {variant} | {r.seed} | {_num(t)} | {_num(errors)} | "
                f"{_num(standby_hit_after_takeover(scenario, r))} | "
                f"{peak_load(r, scenario.standby, 0, scenario.duration_s)} | "
                f"{_num(_peak(r, scenario.standby, 'connections'))} | "
                f"{_num(max((f for *_, f, _ in origin_rates(r, scenario.standby)), default=0))}"
                f" | {fell} |")
    lines += ["", "Real origin split against the weight split (incident window, median over the "
              "runs; seed 002: \"80/20 can become 80/35 once retries are included\"):", "",
              "| variant | standby's mean weight (%) | standby's share of origin requests (%) |",
              "|---|---:|---:|"]
    for variant, rs in runs.items():
        w = Spread(tuple(mean_weight(r, scenario.standby, *window(scenario)) for r in rs))
        share = Spread(tuple(100 * _split(scenario, r) for r in rs))
        lines.append(f"| {variant} | {_cell(w)} | {_cell(share)} |")
    return [*lines, ""]


ROUTINE = ("failover_tick", "steady", "steady_ended", "config_applied", "startup",
           "node_connected", "node_disconnected", "capability_fallback")


def decisions(runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    """What Ballast decided, from its decision log: the evidence for the "why" above."""
    ours = runs["ballast"]
    kinds = sorted({k for r in ours for k in r.decisions if k not in ROUTINE})
    if not kinds:
        return []
    lines = ["## What Ballast decided (its decision records, per run)", "",
             "Counts per run (seeds " + ", ".join(str(r.seed) for r in ours) + ") and the "
             "first such record's rule, in Ballast's words:", "",
             "| record | per run | first rule |", "|---|---|---|"]
    for kind in kinds:
        counts = " / ".join(str(r.decisions.get(kind, 0)) for r in ours)
        example = next((r.decision_examples[kind] for r in ours
                        if kind in r.decision_examples), "")
        lines.append(f"| `{kind}` | {counts} | {example.replace('|', '/')} |")
    if ours[0].after_restart:
        lines += ["", "What the restarted Ballast recorded first in its first run (seconds into "
                  "the run):", "", "```", *ours[0].after_restart, "```"]
    return [*lines, ""]


# --- the machine and the compression -------------------------------------------------------------


def machine(runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    lines = ["## The machine while each run ran", "",
             "Load average (1, 5, 15 min) at each run's start and end, and how late the bench's "
             "own event loop (load generator and origins) ran a 0.1 s timer — a late loop adds "
             "to every latency of that run:", "",
             "| variant | seed | started | load at start | load at end | loop lag p50 / p99 / "
             "max (ms) |", "|---|---|---|---|---|---|"]
    for variant, rs in runs.items():
        for r in rs:
            lags = [lag * 1000 for _, lag in r.loop_lag]
            lines.append(f"| {variant} | {r.seed} | {r.started_utc} | {r.load_before} | "
                         f"{r.load_after} | {percentile(lags, 50):.0f} / "
                         f"{percentile(lags, 99):.0f} / {max(lags, default=0):.0f} |")
    return [*lines, ""]


def _slope(samples: Sequence[Sample]) -> float:
    """Least-squares growth of answered latency over the send time (ms per s)."""
    pts = [(s.at, s.latency_ms) for s in samples if not failed(s)]
    if len(pts) < 3:
        return math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var if var else math.nan


def _answered_after(scenario: Scenario, run: RunResult) -> float:
    """Share of the incident's requests answered 200 after the incident ended."""
    _, end = window(scenario)
    sel = _during(scenario, run)
    return 100 * sum(not failed(s) and s.end >= end for s in sel) / len(sel) if sel else math.nan


def compression(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]]) -> list[str]:
    start, end = window(scenario)
    length = end - start
    seed_s = length * COMPRESSION
    lines = [*timer_table(), "### What the compression costs in this scenario", ""]
    if scenario.seed_length:
        lines += [scenario.seed_length, ""]
    lines += [f"Control loops see the incident's {length:g} s as {seed_s / 60:.3g} minutes; "
              "requests, queues and origins live it in real time. A queue that grows for the "
              f"whole incident grows for {length:g} s here, not {seed_s:g} s: whoever lets "
              f"requests wait is judged on a queue {COMPRESSION:g} times shorter-lived than "
              "the seed's. How many of the incident's requests were answered only after it "
              "ended, per variant (%): " + "; ".join(
                  f"{v} {_cell(Spread(tuple(_answered_after(scenario, r) for r in rs)))}"
                  for v, rs in runs.items()) + ".", ""]
    if scenario.standby:
        offered = scenario.rps_per_pop
        window_s = compressed(30)
        per_window = offered * 0.05 * window_s
        interval = compressed(OUTLIER_INTERVAL_S)
        lines += [f"The origin's own latency creeps with the incident's script (seed 002's "
                  "50 ms per real minute), so it grows ten times faster per bench second than "
                  "the seed's; latency growth here is not a queue's. Samples per controller "
                  f"window: {offered:.0f} requests/s per PoP x {window_s:g} s = "
                  f"{offered * window_s:.0f} per PoP (a real 30 s window: "
                  f"{offered * window_s * COMPRESSION:.0f}); on the standby at its 5 % warm pool "
                  f"{per_window:.1f}, so a p95 read there is in effect the window's largest. "
                  f"Outlier detection's interval is compressed too ({interval:g} s for Envoy's "
                  f"{OUTLIER_INTERVAL_S} s): " + "; ".join(
                      f"a primary host of {name} receives about "
                      f"{offered / b.hosts * interval:.1f} requests per interval, and its "
                      f"request volume is set to {outlier_volume(b, offered)}"
                      for name, b in FAILOVER_BASELINES.items() if name in runs)
                  + " (Envoy's default, 100, assumes ten times the traffic a compressed "
                  "interval holds).", ""]
        return lines
    lines += [f"The origin's latency holds still during the slowdown, so answered latency "
              "that grows over it is a queue growing. Per variant and tier: how fast "
              "answered latency grew over the incident (least squares, ms per second; median "
              "over the runs), and when, at that rate, the latency of the incident's first "
              "tenth would pass the tier's deadline (seconds into the incident; the seed's "
              f"incident lasts {seed_s:g} s, so a queue that passes its deadline within that "
              "time but after this run's incident ended is one the compression hid). Answered "
              "latency never passes a route timeout: a queue that outgrows it shows as "
              "timeouts, in the error rate.", "",
              "| variant | " + " | ".join(f"{k.name} ({k.tier})" for k in MIX) + " |",
              "|---|" + "---|" * len(MIX)]
    for variant, rs in runs.items():
        cells = []
        for kind in MIX:
            slope = Spread(tuple(_slope(_during(scenario, r, kind.name)) for r in rs)).median
            first = Spread(tuple(percentile(latencies(
                [s for s in _during(scenario, r, kind.name) if s.at < start + length / 10]), 50)
                for r in rs)).median
            d = DEADLINES[kind.tier].seconds * 1000
            if math.isnan(slope) or math.isnan(first):
                cross = "-"
            elif first >= d:
                cross = "past it from the start"
            elif slope <= 0:
                cross = "never"
            else:
                at = (d - first) / slope
                cross = f"at {at:,.0f} s" + (
                    " (**hidden**)" if length < at <= seed_s else "")
            cells.append(f"{_num(slope)} ms/s, {cross}")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return [*lines, ""]


# --- the configurations -------------------------------------------------------------------------


def configs(scenario: Scenario, variants: Sequence[str]) -> list[str]:
    """Every variant's configuration in full (PoP ewr; ports as placeholders)."""
    origins = {name: [8001 + 10 * i + k for k in range(spec.endpoints)]
               for i, (name, spec) in enumerate(scenario.origins.items())}
    lines = ["## The variants' configurations, in full", "",
             "Ports are placeholders (each run takes free ones). **ballast**: `ballast serve` "
             "on this desired state, one real Envoy 1.40 per PoP fed over ADS:", "", "```yaml",
             ballast_desired(list(scenario.pops), {p: 10000 + i for i, p in
                                                   enumerate(scenario.pops)},
                             {n: ports[0] for n, ports in origins.items()},
                             concurrency=scenario.origin_concurrency,
                             hedge_delay_ms=scenario.hedge_delay_ms).rstrip(), "```", ""]
    for variant in variants[1:]:
        boot = _bootstrap(scenario, variant, origins)
        lines += [f"**{variant}**: one real Envoy 1.40 per PoP, this static bootstrap "
                  f"(`static_resources`). Why: {_why(variant)}.", "", "```json",
                  json.dumps(boot["static_resources"], indent=1), "```", ""]
    return lines


def _bootstrap(scenario: Scenario, variant: str, origins: dict[str, list[int]]
               ) -> dict[str, Any]:
    if variant in FAILOVER_BASELINES:
        return failover_bootstrap(variant, "ewr", 10000, 9901, origins,
                                  scenario.origin_concurrency, scenario.rps_per_pop,
                                  scenario.hedge_delay_ms)
    return priority_bootstrap(variant, "ewr", 10000, 9901, origins[next(iter(origins))][0],
                              scenario.origin_concurrency, scenario_tiers(scenario, variant))


def _why(variant: str) -> str:
    if variant in FAILOVER_BASELINES:
        return FAILOVER_BASELINES[variant].why
    return PRIORITY_BASELINES[variant].why


def _variants_list(scenario: Scenario, variants: Sequence[str]) -> list[str]:
    lines = ["- **ballast**: `ballast serve` with the seeds' defaults (every control timer "
             "compressed), one real Envoy per PoP."]
    for v in variants[1:]:
        lines.append(f"- **{v}**: {_why(v)}.")
    if not scenario.standby:
        for v in ("static-tiers-naive", "static-tiers"):
            if v in variants:
                lines.append(f"  {v}'s numbers here: " + _tier_numbers(scenario, v) + ".")
    return [*lines, ""]


def _tier_numbers(scenario: Scenario, variant: str) -> str:
    """A static-tiers baseline's pools, and how long a full queue of each waits at the
    origin's mean service time when healthy and during the slowdown."""
    spec = next(iter(scenario.origins.values()))
    slow_p50 = scenario.script((scenario.incident[0] + scenario.incident[1]) / 2)[
        next(iter(scenario.origins))].p50_ms
    mean = math.exp(SIGMA**2 / 2) / 1000  # the log-normal's mean over its p50
    return "; ".join(
        f"{t.name} {t.slots} slots, {t.pending} pending (a full queue waits "
        f"{t.pending * spec.healthy_p50_ms * mean / t.slots:.1f} s while the origin is "
        f"healthy, {t.pending * slow_p50 * mean / t.slots:.1f} s while it is slow), route "
        f"timeout {t.timeout_s:g} s" for t in scenario_tiers(scenario, variant))


# --- the whole report ---------------------------------------------------------------------------

WHAT = {"checkout": "checkout API", "html": "HTML", "image": "image revalidation"}


def _mix(scenario: Scenario) -> str:
    hedged = f", hedged after {scenario.hedge_delay_ms} ms" if scenario.hedge_delay_ms else ""
    return ", ".join(f"{k.share * 100:g} % {WHAT[k.name]} ({k.tier}"
                     + (hedged if k.tier == "critical" else "") + ")" for k in scenario.mix)



def render(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]], meta: Mapping[str, Any],
           plots: Sequence[str]) -> tuple[str, list[tuple[str, Rows]]]:
    """The report's Markdown and its headline tables, from the runs and the scenario's meta
    (`store`) alone."""
    tables_ = tables(scenario, runs)
    start, end = window(scenario)
    variants = list(runs)
    made = {v: len(rs) for v, rs in runs.items()}
    failed_runs = [f"{e['variant']} (seed {e['seed']}): {e['failed']}" for e in meta["runs"]
                   if e.get("failed")]
    seeds = ", ".join(str(s) for s in meta["seeds"])
    loads = [float(r.load_before.split(",")[0]) for rs in runs.values() for r in rs
             if r.load_before]
    lagged = [r for rs in runs.values() for r in rs
              if percentile([lag for _, lag in r.loop_lag], 99) > LATE_LOOP_S]
    lines = [
        f"# Scenario `{scenario.name}` (seed {scenario.seed_ref}): Ballast against "
        f"{', '.join(variants[1:])}",
        "",
        f"Made by `{meta['command']}` at commit {meta['commit']}, {meta['started']} to "
        f"{meta['ended']}, on {meta['machine']}; 1-minute load average "
        f"{min(loads, default=0):.1f} to {max(loads, default=0):.1f} at the runs' starts (per "
        "run below)"
        + (f"; in {len(lagged)} of {sum(map(len, runs.values()))} runs the bench's own event "
           f"loop ran more than {LATE_LOOP_S * 1000:.0f} ms late in over 1 % of its ticks, and "
           "their latencies include that wait (\"The machine while each run ran\")"
           if lagged else "") + ". Recompute this report from its data (every request of "
        "every run, in "
        f"`{scenario.name}/`): `python -m bench.scenarios report {meta['out']}`.",
        "",
        f"Runs per variant: {', '.join(f'{v} {n}' for v, n in made.items())}; interleaved (run "
        f"i of every variant, then run i + 1), seeds {seeds} (the same requests for every "
        f"variant of a run); {scenario.duration_s:g} s per run, {scenario.rps_per_pop:.0f} "
        f"requests/s per PoP ({', '.join(scenario.pops)}), mix {_mix(scenario)}, Poisson "
        "arrivals"
        + ("".join(f", plus {s.rps_per_pop:.0f} requests/s more {s.kind} from "
                   f"{s.start * scenario.duration_s:g} s to {s.end * scenario.duration_s:g} s"
                   for s in scenario.surges)) + "."
        + (" Runs that failed: " + "; ".join(failed_runs) + "." if failed_runs else ""),
        "",
        scenario.summary,
        "",
        "The variants:",
        "",
        *_variants_list(scenario, variants),
        f"## Headline (incident window {start:g} to {end:g} s)",
        "",
        "Each cell: median [lowest-highest] over the runs, over the requests sent during the "
        "incident. **Goodput**: the share answered 200 within the tier's deadline — a late "
        "answer counts as lost, like an error; beside it the raw error rate (every request "
        "without its intended answer). Percentiles **of every request** count a miss as "
        "infinitely late (∞: more of the tier failed than the percentile leaves out), so "
        "failing slow requests cannot improve them; those of answered requests beside them "
        "leave the misses out. Verdicts compare Ballast with each baseline: **better** or "
        "**worse** only where the ranges do not overlap, else overlap.",
        "",
        "| tier | deadline | from |", "|---|---:|---|",
        *[f"| {d.tier} | {d.seconds:g} s | {d.source} |" for d in DEADLINES.values()],
        "",
    ]
    for title, rows in tables_:
        lines += [f"### {title}", "", *markdown_table(rows, variants), ""]
    lines += [*where_ballast_loses(scenario, runs, tables_),
              "## Checks", "", *inversion_check(runs), *record_checks(runs),
              *envoy_evidence(scenario, runs), *breakdown(scenario, runs),
              *standby_section(scenario, runs), *decisions(runs), *machine(runs),
              *compression(scenario, runs), "## Plots (first run of each variant)", ""]
    for plot in plots:
        lines += [f"![{plot}]({scenario.name}-{plot}.png)", ""]
    lines += ["Grey band: the incident window. Green lines: Ballast's decision records "
              "(weight shifts, returns, ramp steps, tier actions); dashed black: kill -9 / "
              "restart.", ""]
    if scenario.notes:
        lines += ["## Notes", ""] + [line for note in scenario.notes for line in (note, "")]
    lines += configs(scenario, variants)
    return "\n".join(lines), tables_


def write_report(scenario: Scenario, runs: Mapping[str, Sequence[RunResult]], out: Path,
                 meta: Mapping[str, Any]) -> list[tuple[str, Rows]]:
    """`out/NAME.md` and its plots, from the runs (read back from their files) and meta."""
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(scenario, {v: list(rs) for v, rs in runs.items()}, out)
    text, tables_ = render(scenario, runs, meta, plots)
    (out / f"{scenario.name}.md").write_text(text)
    return tables_


README_METRICS = (
    "all requests: answered within their tier's deadline (%)",
    f"checkout (critical): answered within {give_up_s('critical'):g} s (%)",
    f"image (background): answered within {give_up_s('background'):g} s (%)",
    "all requests: error rate, every cause (%)",
    "checkout: p95 of every request (ms; a miss is ∞)",
)


def readme_rows(scenario: Scenario, tables_: Sequence[tuple[str, Rows]]) -> list[str]:
    """The README's rows for this scenario: each variant's medians and ranges of
    `README_METRICS`, and for each baseline Ballast's verdict against it on each."""
    rows = {m.name: (m, spreads) for _, rs in tables_ for m, spreads in rs}
    out = []
    for variant in rows[README_METRICS[0]][1]:
        cells = []
        for name in README_METRICS:
            metric, spreads = rows[name]
            cell = _cell(spreads[variant])
            if variant != "ballast":
                word = verdict(spreads["ballast"], spreads[variant], metric.smaller_is_better)
                cell += f" ({_short(word).replace('**', '')})" if word in (
                    "better", "worse") else ""
            cells.append(cell)
        where = (f"[`{scenario.name}`](docs/scenarios/{scenario.name}.md)"
                 if variant == "ballast" else "")
        out.append(f"| {where} | {variant} | " + " | ".join(cells) + " |")
    return out
