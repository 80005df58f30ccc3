"""The incident bench:
`python -m bench.scenarios NAME... | all [--runs N] [--out DIR] [--smoke] [--seed N]`.

For each scenario: starts everything a variant needs (loopback origins following the
scenario's time script, one real Envoy per PoP, Ballast as a `ballast serve` subprocess — or a
baseline's static Envoys), runs the load, stops everything it started; every variant once per
run, the runs interleaved (run 1 of every variant, then run 2, ...), each run with its own seed
(`--seed`, `--seed` + 1, ...) shared by its variants. Then writes DIR/NAME.md and PNG plots
from all the runs. `--smoke` runs a few seconds per variant (the test suite's check that the
machinery works), not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

from bench.scenarios.analysis import RunResult, first_shift_after, percentile, weight_range
from bench.scenarios.catalog import SCENARIOS, smoke
from bench.scenarios.report import Metric, Spread, summary_counts, write_report
from bench.scenarios.runner import Scenario, run_variant


def _machine() -> str:
    return f"{platform.machine()} Linux, {os.cpu_count()} cores shared with other work"


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def _extra(scenario: Scenario, runs: dict[str, list[RunResult]], loads: list[str]
           ) -> list[str]:
    lines = ["## Weights per PoP (first run of each variant)", "", "```"]
    for label, rs in runs.items():
        for pop in scenario.pops:
            low, high = weight_range(rs[0], pop, "primary")
            lines.append(f"{label:<15} {pop}: primary's share {low}..{high} (0.5 s samples)")
    lines += ["```", "", "The machine while the runs ran (load average over 1, 5, 15 min at "
              "each run's start) and how late the bench's own event loop (load generator and "
              "origins) ran a 0.1 s timer — a late loop adds to every latency:", "", "```"]
    for label, rs in runs.items():
        for r in rs:
            lags = [lag * 1000 for _, lag in r.loop_lag]
            lines.append(f"{label:<15} seed {r.seed}: load {loads.pop(0) if loads else '?'}; "
                         f"loop lag p50 {percentile(lags, 50):.0f} ms, p99 "
                         f"{percentile(lags, 99):.0f} ms, max {max(lags, default=0):.0f} ms")
    lines += ["```", ""]
    if runs["ballast"][0].after_restart:
        lines += ["What the restarted Ballast recorded first in its first run (seconds into the "
                  "run):", "", "```", *runs["ballast"][0].after_restart, "```", ""]
    return lines


async def run_scenario(
    scenario: Scenario, out: Path, *, seeds: list[int], command: str, workdir: Path
) -> tuple[list[tuple[Metric, dict[str, Spread]]], dict[str, list[RunResult]]]:
    runs: dict[str, list[RunResult]] = {v: [] for v in scenario.variants}
    loads: dict[str, list[str]] = {v: [] for v in scenario.variants}
    for i, seed in enumerate(seeds):
        for variant in scenario.variants:
            print(f"{scenario.name}: run {i + 1}/{len(seeds)} {variant} (seed {seed}, "
                  f"{scenario.duration_s:.0f} s, load {_load()})", flush=True)
            load = _load()
            try:
                run = await run_variant(scenario, variant, workdir / f"{variant}-{i}", seed)
            except (RuntimeError, TimeoutError, OSError) as err:  # the report counts the runs
                print(f"{scenario.name}: run {i + 1} {variant} failed: {err!s:.300}", flush=True)
                continue
            loads[variant].append(load)
            runs[variant].append(run)
        ballast = runs["ballast"][-1] if runs["ballast"] else None
        if ballast is not None and ballast.seed == seed and len(ballast.events) >= 2:
            killed = ballast.events[0][0]  # restart: the same span for every variant of the run
            span = (killed, first_shift_after(ballast, ballast.events[1][0]))
            for rs in runs.values():
                if rs and rs[-1].seed == seed:
                    rs[-1].focus = span
    runs = {v: rs for v, rs in runs.items() if rs}
    if "ballast" not in runs:
        raise RuntimeError(f"{scenario.name}: every Ballast run failed")
    ordered = [load for v in scenario.variants for load in loads[v]]
    rows = write_report(
        scenario, runs, out, command=command, machine=_machine(), load=_load() + " at the end",
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        extra=_extra(scenario, runs, ordered),
    )
    return rows, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios", description=__doc__)
    parser.add_argument("names", nargs="+", choices=[*sorted(SCENARIOS), "all"])
    parser.add_argument("--out", type=Path, default=Path("docs/scenarios"))
    parser.add_argument("--smoke", action="store_true", help="seconds, not a measurement")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    names = list(SCENARIOS) if "all" in args.names else args.names
    command = "python -m bench.scenarios " + " ".join(sys.argv[1:] if argv is None else argv)
    seeds = [args.seed + i for i in range(args.runs)]
    for name in names:
        scenario = smoke(SCENARIOS[name]) if args.smoke else SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"ballast-scenario-{name}-") as tmp:
            rows, _ = asyncio.run(run_scenario(scenario, args.out, seeds=seeds,
                                               command=command.strip(), workdir=Path(tmp)))
        for metric, spreads in rows:
            print(f"{metric.name:<75} " + "  ".join(
                f"{v} {s.median:9.1f}" for v, s in spreads.items()), flush=True)
        print(f"report: {args.out / (name + '.md')} {dict(summary_counts(rows))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
