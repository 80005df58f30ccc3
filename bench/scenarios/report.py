"""The report of a scenario: PNG plots (matplotlib, Agg) and a Markdown page linking them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image

from bench.scenarios.analysis import (
    RunResult,
    between,
    error_rate,
    first_shift_after,
    latencies,
    peak_load,
    peak_rps,
    percentile,
    ratio,
    series,
    shed_rate,
    success_rate,
    weight_travel,
)
from bench.scenarios.load import MIX
from bench.scenarios.runner import Scenario

COLOURS = {"ballast": "tab:blue", "baseline": "tab:red"}
TIER_OF = {k.name: k.tier for k in MIX}
DPI = 72


@dataclass(frozen=True)
class Row:
    """One headline number: Ballast, baseline, and which is better when smaller."""

    metric: str
    ballast: float
    baseline: float
    smaller_is_better: bool = True

    @property
    def ratio(self) -> float:
        return ratio(self.baseline, self.ballast)

    @property
    def verdict(self) -> str:
        if math.isnan(self.ratio):
            return "-"
        if abs(self.ballast - self.baseline) <= 0.05 * max(abs(self.baseline), 1e-9):
            return "same"
        better = self.ballast < self.baseline
        return "Ballast better" if better == self.smaller_is_better else "baseline better"


def _num(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}".rstrip("0").rstrip(".")


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| metric | Ballast | baseline | baseline ÷ Ballast | verdict |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {r.metric} | {_num(r.ballast)} | {_num(r.baseline)} | {_num(r.ratio)} | "
              f"{r.verdict} |" for r in rows]
    return "\n".join(lines)


def window(scenario: Scenario) -> tuple[float, float]:
    a, b = scenario.incident
    return a * scenario.duration_s, b * scenario.duration_s


def headline(scenario: Scenario, runs: dict[str, RunResult]) -> list[Row]:
    start, end = window(scenario)
    during = {k: between(r.samples, start, end) for k, r in runs.items()}
    rows = [Row("error rate during the incident (%)", 100 * error_rate(during["ballast"]),
                100 * error_rate(during["baseline"]))]
    for kind in ("checkout", "html"):
        sel = {k: latencies(s for s in v if s.kind == kind) for k, v in during.items()}
        for q in (50, 95, 99):
            rows.append(Row(f"{kind} p{q} during the incident (ms)",
                            percentile(sel["ballast"], q), percentile(sel["baseline"], q)))
    images = {k: [s for s in v if s.kind == "image"] for k, v in during.items()}
    rows.append(Row("image revalidation success (%)", 100 * success_rate(images["ballast"]),
                    100 * success_rate(images["baseline"]), smaller_is_better=False))
    rows.append(Row("image revalidation shed (%)", 100 * shed_rate(images["ballast"]),
                    100 * shed_rate(images["baseline"])))
    rows.append(Row("secondary's peak requests/s (1 s bins)",
                    peak_rps(runs["ballast"].samples, "secondary"),
                    peak_rps(runs["baseline"].samples, "secondary")))
    rows.append(Row("secondary's peak load (working + waiting)",
                    peak_load(runs["ballast"], "secondary", 0, scenario.duration_s),
                    peak_load(runs["baseline"], "secondary", 0, scenario.duration_s)))
    rows.append(Row("weight moved (points up and down, all PoPs)",
                    sum(weight_travel(runs["ballast"], p, "primary") for p in scenario.pops),
                    sum(weight_travel(runs["baseline"], p, "primary") for p in scenario.pops)))
    events = runs["ballast"].events
    if len(events) >= 2:  # restart: from the kill to the first weight shift after the restart
        killed = events[0][0]
        back = first_shift_after(runs["ballast"], events[1][0])
        span = back - killed
        rows.append(Row("seconds from the kill to Ballast's next weight shift", span, math.nan))
        for label, (a, b) in (("from the kill to the next shift", (killed, back)),
                              ("in as long a span just before the kill", (killed - span, killed))):
            sel = {k: between(r.samples, a, b) for k, r in runs.items()}
            rows.append(Row(f"error rate {label} (%)", 100 * error_rate(sel["ballast"]),
                            100 * error_rate(sel["baseline"])))
    secondary_errors = {
        k: sum(s.origin == "secondary" and s.status >= 500 for s in v) for k, v in during.items()
    }
    rows.append(Row("5xx answered by the secondary", secondary_errors["ballast"],
                    secondary_errors["baseline"]))
    return rows


def _save(fig: plt.Figure, path: Path) -> None:
    """PNG with a 64-colour palette: the plots are line art, a third of the bytes."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def _marks(ax: plt.Axes, run: RunResult, scenario: Scenario) -> None:
    start, end = window(scenario)
    ax.axvspan(start, end, color="0.93", zorder=0)
    for t, _, _ in run.records:
        ax.axvline(t, color="tab:green", alpha=0.25, linewidth=0.8)
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
    fig.suptitle(f"{scenario.name}: primary's weight per PoP (secondary gets the rest)")
    fig.tight_layout()
    _save(fig, path)


def plot_latency(scenario: Scenario, runs: dict[str, RunResult], path: Path, width: float
                 ) -> None:
    kinds = [k.name for k in MIX]
    fig, axes = plt.subplots(1, len(kinds), figsize=(10, 3.2), sharey=True)
    for ax, kind in zip(axes, kinds, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            samples = [s for s in run.samples if s.kind == kind and not s.shed]
            for q, style in ((50, ":"), (95, "-"), (99, "--")):
                xs, ys = series(samples, width,
                                lambda g, q=q: percentile([s.latency_ms for s in g], q))
                ax.plot(xs, ys, style, color=COLOURS[label], linewidth=1.2,
                        label=f"{label} p{q}")
        ax.set_title(f"{kind} ({TIER_OF[kind]})", fontsize=10)
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
        ax.plot(xs, ys, color=COLOURS[label], label=f"{label}: errors")
        xs, ys = series(run.samples, width, lambda g: 100 * shed_rate(g))
        if any(ys):
            ax.plot(xs, ys, ":", color=COLOURS[label], label=f"{label}: shed")
    ax.set_ylabel("% of requests")
    ax.set_xlabel("seconds")
    ax.legend(fontsize=8)
    ax.set_title(f"{scenario.name}: client-visible errors (5xx, no answer) and sheds")
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
        cap = scenario.origins[name].max_concurrency
        if cap:
            ax.axhline(cap, color="black", linewidth=0.8, linestyle=":")
        ax.set_title(f"{name}: requests inside (working + waiting)", fontsize=10)
        ax.set_xlabel("seconds")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


# Why Ballast can lose a row: the mechanism behind each metric, stated where it happens
WHY = {
    "image revalidation": (
        "the tier controller sheds the background tier (answered 503 with `x-ballast-shed` at the "
        "edge) while the critical tier's pool wait or the origin's utilization is over its "
        "trigger (seed 000: shed P2 to protect P0); the baseline has no tiers, so revalidation "
        "competes with checkout for the same pool instead"),
    "5xx answered by the secondary": (
        "Ballast sends the secondary its warm pool (5 %) and then ramped shares while its cache "
        "is still cold, so it answers some requests slowly or overloaded before the baseline "
        "sends it anything; the baseline's secondary only starts when it flips"),
    "secondary's peak": (
        "both variants end with the secondary carrying nearly everything (Ballast keeps the "
        "primary's 5 % floor), so both reach its cap region; the peak is the highest single "
        "sample (0.1 s, or 1 s for requests/s) of a bursty wait line, not a sustained load: the "
        "origins plot shows when it happened"),
    "checkout": (
        "during the shift Ballast still sends the primary its remaining share, and those requests "
        "wait for the primary's rising time to first byte (plus up to 2 retries of a failed "
        "attempt); once the baseline has flipped, everything goes to the fast secondary"),
    "html": (
        "as for checkout: the primary's remaining share during the shift is slow, and the "
        "normal tier retries a failed attempt once"),
    "error rate": (
        "Ballast leaves the primary step by step (at most 15 points a tick, after two breached "
        "windows), so part of the traffic keeps reaching the failing primary until the shift "
        "completes; a binary flip, when its health check fails early, leaves at once"),
}


# seed 000's trade-off: the same origin, shared by tiers instead of one queue
WHY_PRIORITY = {
    "image revalidation": (
        "the background tier owns 5 % of the origin's slots (1 of 20 here) plus what lending "
        "gives it; while the origin is slow its pool cannot keep up and requests that waited "
        "past its queue timeout are answered 503 at the edge — by design, so that checkout "
        "keeps its slots; the baseline's one queue serves them by making everyone wait"),
    "html": (
        "the normal tier owns 25 % of the origin's slots (plus what lending gives it); while "
        "the origin is slow that share is smaller than HTML's demand, so HTML queues behind its "
        "own wall, where one FIFO queue lets HTML take slots from everything else (seed 000's "
        "trade: keep checkout fast, let the rest degrade)"),
    "error rate": (
        "requests a tier's pool could not serve within its queue timeout or queue depth end as "
        "5xx at the edge (mostly background image revalidation, see its row); the baseline's "
        "single queue spreads the same wait over everyone instead"),
    "checkout": (
        "not explained by a mechanism we verified: checkout owns 70 % of the slots; look at the "
        "latency plot for when it happened"),
}


def _where_baseline_wins(rows: Sequence[Row], scenario: Scenario) -> list[str]:
    why_of = {**WHY, **WHY_PRIORITY} if scenario.name == "priority" else WHY
    lost = [r for r in rows if r.verdict == "baseline better"]
    if not lost:
        return ["Ballast is better or the same on every row of this run.", ""]
    lines = ["## Where Ballast does not beat the baseline, and why", ""]
    for row in lost:
        why = next((text for key, text in why_of.items() if row.metric.startswith(key)),
                   "no mechanism known to us; treat it as this run's noise until repeated")
        lines.append(f"- **{row.metric}** ({_num(row.ballast)} vs {_num(row.baseline)}): {why}.")
    return [*lines, ""]


PLOTS = ("weights", "latency", "errors", "origins")


def write_report(
    scenario: Scenario, runs: dict[str, RunResult], out: Path, *, seed: int, command: str,
    machine: str, date: str, extra: Sequence[str] = (),
) -> list[Row]:
    out.mkdir(parents=True, exist_ok=True)
    width = max(1.0, scenario.duration_s / 60)
    plot_weights(scenario, runs, out / f"{scenario.name}-weights.png")
    plot_latency(scenario, runs, out / f"{scenario.name}-latency.png", width)
    plot_errors(scenario, runs, out / f"{scenario.name}-errors.png", width)
    plot_origins(scenario, runs, out / f"{scenario.name}-origins.png")
    rows = headline(scenario, runs)
    start, end = window(scenario)
    lines = [
        f"# Scenario `{scenario.name}` (seed {scenario.seed_ref}): Ballast vs its baseline",
        "",
        f"Command: `{command}`  ",
        f"Run: {date} on {machine}; random seed {seed}; {scenario.duration_s:.0f} s per variant, "
        f"{scenario.rps_per_pop:.0f} requests/s per PoP ({', '.join(scenario.pops)}), "
        "mix 20 % checkout API (critical), 50 % HTML (normal), 30 % image revalidation "
        "(background), Poisson arrivals, the same schedule for both variants.",
        "",
        scenario.summary,
        "",
        "**Ballast**: `ballast serve` with one real Envoy 1.40 per PoP, failover ticking every "
        "second over 3 s windows, the cold-standby ramp and tier controller on (compressed "
        "times, see `bench/scenarios/stack.py`). **Baseline**: " + (scenario.baseline or
        "one real Envoy 1.40 per PoP from a static config: primary at priority 0, secondary at "
        "priority 1, one FIFO pool for everything, an active health check every second that "
        "fails the primary over after 3 failed checks (100/0 → 0/100) and back after 3 good "
        "ones, one retry on 5xx."),
        "",
        f"## Headline (incident window {start:.0f} to {end:.0f} s)",
        "",
        "Ratio = baseline ÷ Ballast (above 1: Ballast's number is smaller).",
        "",
        markdown_table(rows),
        "",
        *_where_baseline_wins(rows, scenario),
        *extra,
        "## Plots",
        "",
    ]
    for plot in PLOTS:
        lines += [f"![{plot}]({scenario.name}-{plot}.png)", ""]
    lines += [
        "Grey band: the incident window. Green lines: Ballast's decision records "
        "(weight shifts, returns, ramp steps, tier actions); dashed black: kill -9 / restart.",
        "",
    ]
    if scenario.notes:
        lines += ["## Notes", ""] + [line for note in scenario.notes for line in (note, "")]
    (out / f"{scenario.name}.md").write_text("\n".join(lines))
    return rows
