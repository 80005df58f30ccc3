"""The incident bench:
`python -m bench.scenarios NAME... | all [--runs N] [--out DIR] [--smoke] [--seed N]`, and
`python -m bench.scenarios report DIR [NAME...]`.

For each scenario: starts everything a variant needs (loopback origins following the
scenario's time script, one real Envoy per PoP, Ballast as a `ballast serve` subprocess — or a
baseline's static Envoys), runs the load, stops everything it started; every variant once per
run, the runs interleaved (run 1 of every variant, then run 2, ...), each run with its own seed
(`--seed`, `--seed` + 1, ...) shared by its variants. Every run's requests go to a compressed
file in DIR/NAME/ (`store`), replacing that scenario's earlier runs; DIR/NAME.md and its PNG
plots are then computed from those files alone. `report DIR` recomputes the reports (every
scenario with data in DIR, or the NAMEs given) from the files, byte for byte. `--smoke` runs a
few seconds per variant (the test suite's check that the machinery works), not a measurement.

One scenario again, e.g. after a product change: `python -m bench.scenarios priority --runs 3
--seed 701` (any fresh seed) rewrites docs/scenarios/priority.md and its data.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.scenarios.analysis import RunResult, focus_on_restart
from bench.scenarios.catalog import SCENARIOS, smoke
from bench.scenarios.report import Rows, readme_rows, summary_counts, write_report
from bench.scenarios.runner import Scenario, run_variant
from bench.scenarios.stack import ROOT
from bench.scenarios.store import META, read_meta, read_runs, write_meta, write_run

CODE = ("bench", "control_plane", "harness", "pyproject.toml")  # what a run's outcome depends on


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does: every process the run started is stopped."""
    raise KeyboardInterrupt


def _machine() -> str:
    return f"{platform.machine()} Linux, {os.cpu_count()} cores shared with other work"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _commit() -> str:
    """The commit the bench ran at, marked when the code (not the reports) had changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                *CODE], cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty.strip() else "")


async def run_scenario(
    scenario: Scenario, out: Path, *, seeds: list[int], command: str, workdir: Path,
    smoke_run: bool = False,
) -> tuple[list[tuple[str, Rows]], dict[str, list[RunResult]]]:
    """Every run of every variant, each kept in its file under out/NAME/; then the report,
    computed from those files (`report_from`)."""
    data = out / scenario.name
    if data.exists():  # current results only: the scenario's earlier runs go
        shutil.rmtree(data)
    meta: dict[str, Any] = {
        "scenario": scenario.name, "smoke": smoke_run, "command": command, "out": str(out),
        "commit": _commit(), "machine": _machine(), "started": _now(), "ended": "",
        "seeds": seeds, "variants": list(scenario.variants), "runs": [],
    }
    for i, seed in enumerate(seeds):
        for variant in scenario.variants:
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            print(f"{scenario.name}: run {i + 1}/{len(seeds)} {variant} (seed {seed}, "
                  f"{scenario.duration_s:g} s, load {load})", flush=True)
            entry: dict[str, Any] = {"run": i, "variant": variant, "seed": seed}
            try:
                run = await run_variant(scenario, variant, workdir / f"{variant}-{i}", seed, i)
            except (RuntimeError, TimeoutError, OSError) as err:  # the report counts the runs
                print(f"{scenario.name}: run {i + 1} {variant} failed: {err!s:.300}", flush=True)
                entry["failed"] = f"{err!s:.300}"
            else:
                entry["file"] = write_run(data, run).name
            meta["runs"].append(entry)
    meta["ended"] = _now()
    write_meta(data, meta)
    return report_from(out, scenario.name)


def report_from(out: Path, name: str) -> tuple[list[tuple[str, Rows]], dict[str, list[RunResult]]]:
    """out/NAME.md and its plots, from out/NAME/'s files alone."""
    meta = read_meta(out / name)
    scenario = smoke(SCENARIOS[name]) if meta["smoke"] else SCENARIOS[name]
    runs = read_runs(out / name, meta)
    if "ballast" not in runs:
        raise RuntimeError(f"{name}: every Ballast run failed")
    focus_on_restart(runs)
    return write_report(scenario, runs, out, meta), runs


def _print(name: str, out: Path, tables: list[tuple[str, Rows]]) -> None:
    scenario = SCENARIOS[name]
    for _, rows in tables:
        for metric, spreads in rows:
            print(f"{metric.name:<75} " + "  ".join(
                f"{v} {s.median:9.1f}" for v, s in spreads.items()), flush=True)
    print(f"report: {out / (name + '.md')} {dict(summary_counts(tables))}", flush=True)
    print("README rows:", *readme_rows(scenario, tables), sep="\n", flush=True)


def report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios report",
                                     description="Recompute reports from their runs' files.")
    parser.add_argument("out", type=Path, help="the reports' directory (docs/scenarios)")
    parser.add_argument("names", nargs="*", help="scenarios (default: every one with data)")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        parser.error(f"no such scenario: {', '.join(sorted(unknown))}")
    names = args.names or [n for n in SCENARIOS if (args.out / n / META).exists()]
    if not names:
        parser.error(f"no scenario data in {args.out}")
    for name in names:
        tables, _ = report_from(args.out, name)
        _print(name, args.out, tables)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _interrupted)
    if argv[:1] == ["report"]:
        return report(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", choices=[*sorted(SCENARIOS), "all"])
    parser.add_argument("--out", type=Path, default=Path("docs/scenarios"))
    parser.add_argument("--smoke", action="store_true", help="seconds, not a measurement")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    names = list(SCENARIOS) if "all" in args.names else args.names
    command = "python -m bench.scenarios " + " ".join(argv)
    seeds = [args.seed + i for i in range(args.runs)]
    for name in names:
        scenario = smoke(SCENARIOS[name]) if args.smoke else SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"ballast-scenario-{name}-") as tmp:
            tables, _ = asyncio.run(run_scenario(
                scenario, args.out, seeds=seeds, command=command.strip(), workdir=Path(tmp),
                smoke_run=args.smoke))
        _print(name, args.out, tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
