"""The incident bench: `python -m bench.scenarios NAME [--out DIR] [--smoke] [--seed N]`.

Starts everything a scenario needs (loopback origins following the scenario's time script, one
real Envoy per PoP, Ballast as a `ballast serve` subprocess — or the baseline's static Envoys),
runs the load, stops everything it started, then does the same for the baseline with the same
seed, and writes DIR/NAME.md plus PNG plots. `--smoke` runs a few seconds per variant (the
test suite's check that the machinery works), not a measurement.
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

from bench.scenarios.analysis import RunResult, percentile, weight_changes, weight_range
from bench.scenarios.catalog import SCENARIOS, smoke
from bench.scenarios.report import Row, write_report
from bench.scenarios.runner import Scenario, run_variant

VARIANTS = ("ballast", "baseline")


def _machine() -> str:
    return f"{platform.machine()} Linux, {os.cpu_count()} cores shared with other work"


def _extra(scenario: Scenario, runs: dict[str, RunResult]) -> list[str]:
    lines = ["## Weights per PoP", "", "```"]
    for label, run in runs.items():
        for pop in scenario.pops:
            low, high = weight_range(run, pop, "primary")
            lines.append(f"{label:<9} {pop}: primary's weight {low}..{high}, changed "
                         f"{weight_changes(run, pop, 'primary')} times (0.5 s samples)")
    lines += ["```", "", "How late the bench's own event loop (load generator and origins) ran "
              "a 0.1 s timer — the machine is shared; a late loop adds to every latency above:",
              "", "```"]
    for label, run in runs.items():
        lags = [lag * 1000 for _, lag in run.loop_lag]
        lines.append(f"{label:<9} p50 {percentile(lags, 50):.0f} ms, p99 "
                     f"{percentile(lags, 99):.0f} ms, max {max(lags, default=0):.0f} ms")
    lines += ["```", ""]
    if runs["ballast"].after_restart:
        lines += ["What the restarted Ballast recorded first (seconds into the run):", "", "```",
                  *runs["ballast"].after_restart, "```", ""]
    return lines


async def run_scenario(
    scenario: Scenario, out: Path, *, seed: int, command: str, workdir: Path
) -> tuple[list[Row], dict[str, RunResult]]:
    runs: dict[str, RunResult] = {}
    for variant in VARIANTS:
        print(f"{scenario.name}: running {variant} ({scenario.duration_s:.0f} s)", flush=True)
        runs[variant] = await run_variant(scenario, variant, workdir / variant, seed)
    rows = write_report(
        scenario, runs, out, seed=seed, command=command, machine=_machine(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        extra=_extra(scenario, runs),
    )
    return rows, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios", description=__doc__)
    parser.add_argument("name", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path("docs/scenarios"))
    parser.add_argument("--smoke", action="store_true", help="seconds, not a measurement")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.name]
    if args.smoke:
        scenario = smoke(scenario)
    command = "python -m bench.scenarios " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix=f"ballast-scenario-{args.name}-") as tmp:
        rows, _ = asyncio.run(run_scenario(scenario, args.out, seed=args.seed,
                                           command=command.strip(), workdir=Path(tmp)))
    for row in rows:
        print(f"{row.metric:<45} {row.ballast:10.1f} {row.baseline:10.1f}  {row.verdict}")
    print(f"report: {args.out / (scenario.name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
