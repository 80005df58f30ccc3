"""The report of a scenario over its repeated runs: the headline as median and range per
variant with a verdict only where the ranges do not overlap, the errors by cause and status per
tier, the standby's warming, the real origin split against the weights, the baselines' full
configs, the time compression, PNG plots (matplotlib, Agg) of the first run of each variant."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image

from bench.scenarios.analysis import (
    RunResult,
    Spread,
    between,
    causes,
    error_rate,
    failed,
    latencies,
    mean_weight,
    origin_rates,
    origin_requests,
    peak_load,
    percentile,
    series,
    shed_rate,
    statuses,
    verdict,
    weight_travel,
)
from bench.scenarios.load import CAUSES, MIX
from bench.scenarios.runner import Scenario
from bench.scenarios.stack import (
    FAILOVER_BASELINES,
    ballast_desired,
    failover_bootstrap,
    priority_bootstrap,
)
from bench.scenarios.timers import COMPRESSION, compressed
from bench.scenarios.timers import table as timer_table

COLOURS = {"ballast": "tab:blue", "binary": "tab:red", "priority-spill": "tab:orange",
           "fifo": "tab:red", "static-tiers": "tab:orange"}
TIER_OF = {k.name: k.tier for k in MIX}
DPI = 72
FELL_OVER_ERRORS = 0.10  # a standby "falls over" when over 10 % of what it answers fails ...
TAKEOVER = 0.5  # ... in the seconds after it first carries half the offered load


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[Scenario, RunResult], float]
    smaller_is_better: bool = True
    judged: bool = True  # False: a description (a split, a weight), no better or worse


def window(scenario: Scenario) -> tuple[float, float]:
    a, b = scenario.incident
    return a * scenario.duration_s, b * scenario.duration_s


def _during(scenario: Scenario, run: RunResult, kind: str = "") -> list:
    start, end = window(scenario)
    return [s for s in between(run.samples, start, end) if not kind or s.kind == kind]


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


def _weight_moved(scenario: Scenario, run: RunResult) -> float:
    return sum(weight_travel(run, p, "primary") for p in scenario.pops)


def _kind_metrics(kind: str, quantiles: tuple[int, ...]) -> list[Metric]:
    out = [Metric(f"{kind}: error rate (%)",
                  lambda sc, r: 100 * error_rate(_during(sc, r, kind)))]
    out += [Metric(f"{kind}: p{q} of answered (ms)",
                   lambda sc, r, q=q: percentile(latencies(_during(sc, r, kind)), q))
            for q in quantiles]
    out.append(Metric(f"{kind}: not answered, excluded from its latencies (count)",
                      lambda sc, r: sum(failed(s) for s in _during(sc, r, kind))))
    return out


def metrics(scenario: Scenario) -> list[Metric]:
    rows = [Metric("error rate during the incident, every cause (%)",
                   lambda sc, r: 100 * error_rate(_during(sc, r)))]
    rows += _kind_metrics("checkout", (50, 95, 99))
    rows.append(Metric("checkout: shed by the edge (%)",
                       lambda sc, r: 100 * shed_rate(_during(sc, r, "checkout"))))
    rows += _kind_metrics("html", (50, 95))
    rows += [Metric("image: error rate (%)",
                    lambda sc, r: 100 * error_rate(_during(sc, r, "image"))),
             Metric("image: shed by the edge (%)",
                    lambda sc, r: 100 * shed_rate(_during(sc, r, "image")))]
    if not scenario.standby:
        origin = next(iter(scenario.origins))
        return [*rows, Metric("origin: peak load (working + waiting)",
                              lambda sc, r: peak_load(r, origin, 0, sc.duration_s))]
    standby = scenario.standby
    spec = scenario.origins[standby]
    rows += [
        Metric(f"standby: peak load (working + waiting; full at {spec.workers + spec.max_waiting})",
               lambda sc, r: peak_load(r, standby, 0, sc.duration_s)),
        Metric(f"standby: peak open connections (cap {spec.max_connections})",
               lambda sc, r: _peak(r, standby, "connections")),
        Metric("standby: not-200 share of its answers, 5 s after it took half the load (%)",
               standby_errors_after_takeover),
        Metric("standby: lowest hit ratio in those 5 s (%)", standby_hit_after_takeover, False),
        Metric("standby: p95 of what it answered, first 10 s of the incident (ms)",
               _standby_early_p95, judged=False),
        Metric("standby: peak backend fetches/s",
               lambda sc, r: max((f for *_, f, _ in origin_rates(r, standby)), default=0)),
        Metric("standby: share of origin requests, incident, retries included (%)",
               lambda sc, r: 100 * _split(sc, r), judged=False),
        Metric("standby: mean weight, incident (%)",
               lambda sc, r: mean_weight(r, standby, *window(sc)), judged=False),
        Metric("weight moved (points up and down, all PoPs)", _weight_moved),
    ]
    if scenario.kill_at is not None:
        rows.append(Metric("error rate from the kill to Ballast's next shift (%)", _after_kill))
    return rows


def _standby_early_p95(scenario: Scenario, run: RunResult) -> float:
    """What clients waited for the standby's answers while it warmed: the latency a ramp's
    "p95 over 800 ms" rule should see (retried requests include their first attempt)."""
    start, _ = window(scenario)
    return percentile([s.latency_ms for s in between(run.samples, start, start + 10)
                       if s.origin == scenario.standby and s.status == 200], 95)


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


def headline(scenario: Scenario, runs: dict[str, list[RunResult]]
             ) -> list[tuple[Metric, dict[str, Spread]]]:
    return [(m, {v: Spread(tuple(m.fn(scenario, r) for r in rs)) for v, rs in runs.items()})
            for m in metrics(scenario)]


def markdown_table(rows: Sequence[tuple[Metric, dict[str, Spread]]], variants: Sequence[str]
                   ) -> str:
    baselines = [v for v in variants if v != "ballast"]
    head = ["metric", *variants, *(f"Ballast vs {b}" for b in baselines)]
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(variants) + "---|" * len(baselines)]
    for metric, spreads in rows:
        cells = [_cell(spreads[v]) for v in variants]
        cells += [verdict(spreads["ballast"], spreads[b], metric.smaller_is_better)
                  if metric.judged else "(description)" for b in baselines]
        lines.append(f"| {metric.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown(scenario: Scenario, runs: dict[str, list[RunResult]]) -> list[str]:
    """Failed requests by cause and status code, per variant and tier, all runs together."""
    lines = ["## Every failed request, by cause and status (incident window, all runs together)",
             "",
             "A request fails when it does not get its intended answer (a 200 from an origin): "
             "a 5xx from an origin or from Envoy, a shed (503 from the edge) or a deferral "
             "(202), a timeout (504 or no answer within 10 s), a reset. Status 0: no answer.",
             "", "| variant | tier | requests | failed (%) | " + " | ".join(CAUSES)
             + " | status codes |", "|---|---|---:|---:|" + "---:|" * len(CAUSES) + "---|"]
    for variant, rs in runs.items():
        for kind in MIX:
            sel = [s for r in rs for s in _during(scenario, r, kind.name)]
            why = causes(sel)
            codes = ", ".join(f"{c}x{n}" for c, n in sorted(statuses(sel).items()))
            lines.append(f"| {variant} | {kind.tier} ({kind.name}) | {len(sel)} | "
                         f"{_num(100 * error_rate(sel))} | "
                         + " | ".join(str(why.get(c, 0)) for c in CAUSES) + f" | {codes} |")
    return [*lines, ""]


def standby_section(scenario: Scenario, runs: dict[str, list[RunResult]]) -> list[str]:
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
    offered = scenario.rps_per_pop
    window_s = compressed(30)
    per_window = offered * 0.05 * window_s
    lines += ["", f"Samples per controller window on the standby at its warm pool (5 %): "
              f"{offered:.0f} requests/s per PoP x 5 % x {window_s:g} s = {per_window:.1f} "
              "requests per PoP and window, every one in the access-log signal "
              f"(`sample_rate: 1.0`); the primary's window holds {offered * 0.95 * window_s:.0f}. "
              f"A p95 over {per_window:.0f} samples is in effect the window's largest: the rules "
              "reading the standby at its warm pool act on one or two requests. That is the "
              "compression's cost: the same request rate over a real 30 s window would give "
              f"{per_window * COMPRESSION:.0f}; holding that here would take "
              f"{COMPRESSION:.0f}x the load, more than this shared machine can generate "
              "without its own lag showing in the latencies.", ""]
    lines += ["Real origin split against the weight split (incident window, median over the "
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


def decisions(runs: dict[str, list[RunResult]]) -> list[str]:
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
    return [*lines, ""]


def record_checks(runs: dict[str, list[RunResult]]) -> list[str]:
    """Issue 21's two checks, counted over every decision record of every Ballast run."""
    ours = runs["ballast"]

    def per_run(values: Sequence[int]) -> str:
        return " / ".join(str(v) for v in values)

    found = [text for r in ours for text in (*r.held_though_better, *r.shed_with_idle_slots)]
    lines = [
        "## Checks on Ballast's decision records", "",
        "Counted over every record of every run (seeds " + ", ".join(str(r.seed) for r in ours)
        + "), each with the run's own desired state. A \"nowhere better\" hold fails the first "
        "check when its own inputs show an origin whose composite score was better than a sick "
        "origin's by `compare_margin`. A shed onset (re-prioritization with a shed tier, or "
        "utilization shedding) fails the second when its window shows idle slots: the trigger "
        "tier's worst Envoy peaked below its slots (guarantee plus borrowed) with nothing "
        "pending and no queue overloaded, or the utilization read was at or below "
        "`shed_threshold`. (Requests answered by a tier's bounded queue overflowing are "
        "Envoy's, not records; a queue overflows only with every slot of its pool busy.)", "",
        "| check | per run |", "|---|---|",
        f"| \"nowhere better\" holds recorded | {per_run([r.nowhere_better for r in ours])} |",
        "| ... while an origin scored better than a sick one by the margin | "
        f"{per_run([len(r.held_though_better) for r in ours])} |",
        f"| shed onsets recorded | {per_run([r.shed_onsets for r in ours])} |",
        "| ... while the shedding tier's origin had idle slots | "
        f"{per_run([len(r.shed_with_idle_slots) for r in ours])} |",
        "",
    ]
    if found:
        lines += ["The records that failed a check:", "", "```", *found[:20], "```", ""]
    return lines


def configs(scenario: Scenario) -> list[str]:
    """Every variant's configuration in full (PoP ewr; ports as placeholders)."""
    origins = {name: [8001 + 10 * i + k for k in range(spec.endpoints)]
               for i, (name, spec) in enumerate(scenario.origins.items())}
    lines = ["## The variants' configurations, in full", "",
             "Ports are placeholders (each run takes free ones). **ballast**: `ballast serve` "
             "on this desired state, one real Envoy 1.40 per PoP fed over ADS:", "", "```yaml",
             ballast_desired(list(scenario.pops), {p: 10000 + i for i, p in
                                                   enumerate(scenario.pops)},
                             {n: ports[0] for n, ports in origins.items()},
                             concurrency=scenario.origin_concurrency).rstrip(), "```", ""]
    for variant in scenario.variants[1:]:
        if variant in FAILOVER_BASELINES:
            hosts = {n: ports[:FAILOVER_BASELINES[variant]] for n, ports in origins.items()}
            boot = failover_bootstrap("ewr", 10000, 9901, hosts, scenario.origin_concurrency)
            doc = (failover_bootstrap.__doc__ or "").split("\n\n")[0]
        else:
            boot = priority_bootstrap(variant, "ewr", 10000, 9901,
                                      origins[next(iter(origins))][0],
                                      scenario.origin_concurrency)
            doc = (priority_bootstrap.__doc__ or "").split("\n\n")[0]
        lines += [f"**{variant}**: one real Envoy 1.40 per PoP, this static bootstrap. "
                  + " ".join(doc.split()), "", "```json",
                  json.dumps(boot["static_resources"], indent=1), "```", ""]
    return lines


def _save(fig: plt.Figure, path: Path) -> None:
    """PNG with a 64-colour palette: the plots are line art, a third of the bytes."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def _marks(ax: plt.Axes, run: RunResult, scenario: Scenario) -> None:
    start, end = window(scenario)
    ax.axvspan(start, end, color="0.93", zorder=0)
    for t, _, _ in run.records:
        ax.axvline(t, color="tab:green", alpha=0.2, linewidth=0.8)
    for t, _ in run.events:
        ax.axvline(t, color="black", linestyle="--", linewidth=1.2)


def plot_weights(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    fig, axes = plt.subplots(len(scenario.pops), 1, figsize=(8, 2.2 * len(scenario.pops)),
                             sharex=True, squeeze=False)
    for ax, pop in zip(axes[:, 0], scenario.pops, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = [(t, w.get("primary", 0)) for t, p, w in run.weights if p == pop and w]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.step(xs, ys, where="post", color=COLOURS[label],
                        label=f"{label}: primary", linewidth=1.6)
        ax.set_ylabel(f"{pop}: primary %")
        ax.set_ylim(-5, 105)
        ax.legend(loc="lower left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds (grey: incident; green: Ballast decision records; "
                           "dashed: kill/restart)")
    fig.suptitle(f"{scenario.name}: primary's share per PoP (first run of each variant)")
    fig.tight_layout()
    _save(fig, path)


def plot_latency(scenario: Scenario, runs: dict[str, RunResult], path: Path, width: float
                 ) -> None:
    kinds = [k.name for k in MIX]
    fig, axes = plt.subplots(1, len(kinds), figsize=(10, 3.2), sharey=True)
    for ax, kind in zip(axes, kinds, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            samples = [s for s in run.samples if s.kind == kind and not failed(s)]
            for q, style in ((50, ":"), (95, "-")):
                xs, ys = series(samples, width,
                                lambda g, q=q: percentile([s.latency_ms for s in g], q))
                ax.plot(xs, ys, style, color=COLOURS[label], linewidth=1.2,
                        label=f"{label} p{q}")
        ax.set_title(f"{kind} ({TIER_OF[kind]}), answered only", fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
    axes[0].set_ylabel("client latency (ms)")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    _save(fig, path)


def plot_errors(scenario: Scenario, runs: dict[str, RunResult], path: Path, width: float
                ) -> None:
    fig, ax = plt.subplots(figsize=(8, 3))
    _marks(ax, runs["ballast"], scenario)
    for label, run in runs.items():
        xs, ys = series(run.samples, width, lambda g: 100 * error_rate(g))
        ax.plot(xs, ys, color=COLOURS[label], label=f"{label}: failed (every cause)")
        xs, ys = series(run.samples, width, lambda g: 100 * shed_rate(g))
        if any(ys):
            ax.plot(xs, ys, ":", color=COLOURS[label], label=f"{label}: of which shed")
    ax.set_ylabel("% of requests")
    ax.set_xlabel("seconds")
    ax.legend(fontsize=8)
    ax.set_title(f"{scenario.name}: requests without their intended answer")
    fig.tight_layout()
    _save(fig, path)


def plot_origins(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    names = list(scenario.origins)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3), sharey=True,
                             squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = [(t, n) for t, o, n in run.origin_load if o == name]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, color=COLOURS[label], linewidth=0.9, label=label)
        spec = scenario.origins[name]
        if spec.workers:
            ax.axhline(spec.workers + spec.max_waiting, color="black", linewidth=0.8,
                       linestyle=":")
        ax.set_title(f"{name}: requests inside (working + waiting)", fontsize=10)
        ax.set_xlabel("seconds")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_standby(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3))
    titles = ("standby: cache hit ratio (%)", "standby: backend fetches/s",
              "standby: open connections")
    for i, (ax, title) in enumerate(zip(axes, titles, strict=True)):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = origin_rates(run, scenario.standby)
            if pts:
                ys = [(100 * p[2] if i == 0 else p[3] if i == 1 else p[4]) for p in pts]
                ax.plot([p[0] for p in pts], ys, color=COLOURS[label], linewidth=1.0,
                        label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


# Why Ballast can lose a row: the mechanism behind each metric (the evidence line under the
# list gives this report's numbers for it)
WHY = {
    "image: shed": (
        "background requests are answered at the edge (503 with `x-ballast-shed`) two ways: "
        "the tier controller sheds the background tier while checkout's measured pool wait is "
        "over its trigger (35 ms) or the origin's utilization over 85 % (seed 000: shed P2 to "
        "protect P0; \"shed onsets recorded\" in the checks below), and the background "
        "tier's queue, bounded in time (its slots x 3000 ms / the origins' p50, `tier_queue`), "
        "overflows; every shed counts as a failed request here"),
    "image": (
        "background requests are shed at the edge or wait behind the background tier's 5 % "
        "share of the origin's slots; the baselines give them the same pool as everything else"),
    "html": (
        "Ballast's tier routes allow queue timeout + read timeout x attempts (9.5 s for the "
        "normal tier) where the failover baselines time out at 4 s, so a slow request is "
        "answered late (in the latencies) instead of failing (in the error rate); and during "
        "a shift part of the traffic stays on the slow primary"),
    "checkout: shed": (
        "the critical tier's queue is bounded in time (seed 000's 800 ms `queue_timeout`): its "
        "pending limit is slots x 800 ms / the origins' measured p50 (`tier_queue` records), so "
        "while the origin is slow a checkout request that finds the queue at that limit is "
        "answered 503 at the edge (`x-ballast-shed: critical`, the tier's `shed_action`) "
        "instead of waiting up to its route timeout as the baselines' requests do"),
    "checkout": (
        "during the shift Ballast keeps most traffic on the primary, whose time to first byte "
        "rises by up to 600 ms (the evidence line gives its standby's mean weight), and its "
        "critical route allows 0.8 s of queueing + 2 s x 3 attempts (6.8 s) where the failover "
        "baselines time out at 4 s, so slow requests are answered late instead of failing"),
    "error rate": (
        "Ballast moved weight off the failing primary more slowly than the baselines' outlier "
        "detection ejected it: two breached windows first, then at most 10-15 points a tick, "
        "with the cold-standby ramp capping the standby at its step and backing it off to its "
        "warm pool whenever its window's p95 read over 800 ms; what stays on the primary meets "
        "its 5xx rate, and background requests shed by the tier controller count as failed"),
    "standby": (
        "Ballast sends the standby its warm pool and ramped shares from the start, so it "
        "carries traffic (and connections) that a baseline only sends it after flipping"),
}


# seed 000's `priority`: one origin, tiers instead of one queue
WHY_PRIORITY = {
    "html": (
        "while the tier controller acts (`tier_action`) half of the normal tier's requests are "
        "demoted into the background tier's pool, and both pools' queues are bounded in time "
        "(`tier_queue`: normal 5 slots x 1500 ms / 480 ms, about 15 waiting; background 1 "
        "slot plus borrowed x 3000 ms / 480 ms): HTML past those limits is answered 503 at the "
        "edge at once (the shed column of the breakdown below) instead of after a wait; one "
        "FIFO queue lets HTML compete on equal terms (most of FIFO's requests fail at its 4 s "
        "timeout, so the HTML it does answer is answered sooner), and static tiers keep HTML "
        "in its own pool with a 9.5 s route timeout (fewer fail, later)"),
    "checkout": (
        "the critical tier's queue is bounded in time: while the origin answers in 480 ms its "
        "pending limit is its 14 slots (more while it borrows) x 800 ms / 480 ms, about 23 "
        "(`tier_queue` records), and checkout "
        "requests past it are answered 503 at the edge (\"checkout: shed by the edge\"), where "
        "static tiers let them wait up to the 6.8 s route timeout and answer most of them late. "
        "Ballast's records also show it lending critical's idle slots to normal and background "
        "before the slowdown (`tier_lend`); while borrowed slots are busy the origin's 20 "
        "workers are oversubscribed and checkout can wait at the origin until they are "
        "reclaimed"),
    "error rate": (
        "the tier controller answers background requests at the edge with 503 (shed, counted "
        "as failed) and demotes half of the normal tier into the background tier's pool, "
        "where many end as 503 or time out; static tiers shed nothing and keep HTML in its "
        "own pool, so fewer of their requests fail, and later"),
}


def _evidence(scenario: Scenario, runs: dict[str, list[RunResult]]) -> str:
    """What the runs show about Ballast's side of a lost row (medians over its runs)."""
    ours = runs["ballast"]

    def per_run(kind: str) -> str:
        return "/".join(str(r.decisions.get(kind, 0)) for r in ours)

    shed = Spread(tuple(100 * shed_rate(_during(scenario, r, "image")) for r in ours)).median
    checkout = Spread(tuple(100 * shed_rate(_during(scenario, r, "checkout"))
                            for r in ours)).median
    parts = [f"in these runs the tier controller shed {_num(shed)} % of background requests "
             f"(`tier_action` records per run: {per_run('tier_action')}), and the critical "
             f"tier's time-bounded queue answered {_num(checkout)} % of checkout requests at "
             f"the edge (`tier_queue` records per run: {per_run('tier_queue')})"]
    if scenario.standby:
        weight = Spread(tuple(mean_weight(r, scenario.standby, *window(scenario))
                              for r in ours)).median
        parts.insert(0, f"Ballast's standby weight averaged {_num(weight)} % over the incident, "
                        f"its ramp backed off {per_run('ramp_back_off')} times per run (the "
                        "p95 each back-off read is in \"What Ballast decided\"; compare the "
                        "standby's p95 as clients saw it in the table above)")
    return "; ".join(parts)


def _where_baseline_wins(scenario: Scenario, rows: Sequence[tuple[Metric, dict[str, Spread]]],
                         runs: dict[str, list[RunResult]]) -> list[str]:
    lines = ["## Where Ballast does not beat the baseline, and why", ""]
    lost = []
    for metric, spreads in rows:
        for variant, spread in spreads.items():
            if variant != "ballast" and metric.judged and verdict(
                    spreads["ballast"], spread, metric.smaller_is_better) == "worse":
                lost.append((metric, variant, spread, spreads["ballast"]))
    if not lost:
        return [*lines, "No row where a baseline's range lies wholly on the better side of "
                "Ballast's; rows marked \"no difference shown\" are not wins for either.", ""]
    why_of = WHY if scenario.standby else {**WHY, **WHY_PRIORITY}
    for metric, variant, theirs, ours in lost:
        why = next((text for key, text in why_of.items() if metric.name.startswith(key)),
                   "no mechanism verified; treat it as measured, not explained")
        lines.append(f"- **{metric.name}**, against {variant} ({_cell(ours)} vs "
                     f"{_cell(theirs)}): {why}.")
    return [*lines, "", "Evidence from the runs: " + _evidence(scenario, runs) + ".", ""]


PLOTS = ("weights", "latency", "errors", "origins", "standby")


def write_report(
    scenario: Scenario, runs: dict[str, list[RunResult]], out: Path, *, command: str,
    machine: str, date: str, load: str, extra: Sequence[str] = (),
) -> list[tuple[Metric, dict[str, Spread]]]:
    out.mkdir(parents=True, exist_ok=True)
    first = {v: rs[0] for v, rs in runs.items()}
    width = max(1.0, scenario.duration_s / 60)
    plots = [p for p in PLOTS if p != "standby" or scenario.standby]
    plot_weights(scenario, first, out / f"{scenario.name}-weights.png")
    plot_latency(scenario, first, out / f"{scenario.name}-latency.png", width)
    plot_errors(scenario, first, out / f"{scenario.name}-errors.png", width)
    plot_origins(scenario, first, out / f"{scenario.name}-origins.png")
    if scenario.standby:
        plot_standby(scenario, first, out / f"{scenario.name}-standby.png")
    rows = headline(scenario, runs)
    start, end = window(scenario)
    n = min(len(rs) for rs in runs.values())
    seeds = ", ".join(str(r.seed) for r in runs["ballast"])
    variants = list(runs)
    lines = [
        f"# Scenario `{scenario.name}` (seed {scenario.seed_ref}): Ballast against "
        f"{', '.join(variants[1:])}",
        "",
        f"Command: `{command}`  ",
        f"Run: {date} on {machine}; load average {load}. {n} runs per variant, interleaved "
        f"(run i of every variant, then run i + 1), seeds {seeds} (one per run; the same "
        f"requests for every variant of a run); {scenario.duration_s:.0f} s per run, "
        f"{scenario.rps_per_pop:.0f} requests/s per PoP ({', '.join(scenario.pops)}), mix "
        "20 % checkout API (critical), 50 % HTML (normal), 30 % image revalidation "
        "(background), Poisson arrivals"
        + (", plus " + ", ".join(f"{s.rps_per_pop:.0f} requests/s more {s.kind} from "
                                 f"{s.start:.0%} to {s.end:.0%} of the run"
                                 for s in scenario.surges) if scenario.surges else "") + ".",
        "",
        scenario.summary,
        "",
        f"## Headline (incident window {start:.0f} to {end:.0f} s)",
        "",
        "Each cell: median [lowest-highest] over the runs. The error rate counts every "
        "request that did not get its intended answer; latencies are over answered requests "
        "only, with the requests left out counted beside them. Verdicts compare Ballast with "
        "each baseline: \"better\" or \"worse\" only where the ranges do not overlap, else "
        "\"no difference shown\".",
        "",
        markdown_table(rows, variants),
        "",
        *_where_baseline_wins(scenario, rows, runs),
        *breakdown(scenario, runs),
        *standby_section(scenario, runs),
        *decisions(runs),
        *record_checks(runs),
        *extra,
        *timer_table(),
        "## Plots (first run of each variant)",
        "",
    ]
    for plot in plots:
        lines += [f"![{plot}]({scenario.name}-{plot}.png)", ""]
    lines += [
        "Grey band: the incident window. Green lines: Ballast's decision records "
        "(weight shifts, returns, ramp steps, tier actions); dashed black: kill -9 / restart.",
        "",
    ]
    if scenario.notes:
        lines += ["## Notes", ""] + [line for note in scenario.notes for line in (note, "")]
    lines += configs(scenario)
    (out / f"{scenario.name}.md").write_text("\n".join(lines))
    return rows


def summary_counts(rows: Sequence[tuple[Metric, dict[str, Spread]]]) -> Counter[str]:
    """How many verdicts of each kind a report has (for the command's printout)."""
    out: Counter[str] = Counter()
    for metric, spreads in rows:
        for variant, spread in spreads.items():
            if variant != "ballast" and metric.judged:
                out[verdict(spreads["ballast"], spread, metric.smaller_is_better)] += 1
    return out
