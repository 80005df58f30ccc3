"""Run the benchmarks (`make bench`): `python -m bench.run [--quick] [--nodes N] [--only X]`.

Prints a readable report and writes `bench/results/latest.json`. Numbers are only comparable
within one run (the machine is shared and noisy): every comparison is a ratio of two
measurements taken in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench import (
    dashboard,
    fanout,
    fleet,
    protocol_core,
    replicas,
    soak,
    standby_ramp,
    translation,
)
from bench.common import ROOT
from bench.fleet_server import VARIANTS
from harness.standby_ramp import report as report_standby_ramp


@dataclass(frozen=True)
class FanoutPlan:
    label: str
    desired: str
    sizes: list[int]
    per_connection: int
    modes: tuple[str, ...] = ("sotw", "delta")


def plans(quick: bool, nodes: int | None, per_connection: int) -> list[FanoutPlan]:
    if nodes is not None:
        sizes, large, one_conn = [nodes], [nodes], nodes
    elif quick:
        sizes, large, one_conn = [100, 400], [200], 0
    else:
        sizes, large, one_conn = [200, 1000, 3000], [1000], 1000
    result = [
        FanoutPlan("example desired state (3 clusters per PoP)", "example", sizes,
                   per_connection),
        FanoutPlan("synthetic desired state (150 clusters per PoP)", "large", large,
                   per_connection),
    ]
    if one_conn:
        # the measured floor used one TCP connection per node; fds: one per node in each process
        per = max(1, -(-one_conn // 15_000))
        result.append(FanoutPlan("one connection per node, as the measured floor", "example",
                                 [one_conn], per))
    return result


def run_fanout(
    todo: list[FanoutPlan], pushes: int, protocols: tuple[str, ...] = ("current",)
) -> list[fanout.FanoutResult]:
    results: list[fanout.FanoutResult] = []
    for plan in todo:
        print(f"-- {plan.label}", flush=True)
        results += fanout.run(plan.sizes, desired=plan.desired,
                              per_connection=plan.per_connection, pushes=pushes,
                              modes=plan.modes, protocols=protocols)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--nodes", type=int, help="run every fan-out benchmark with N nodes")
    parser.add_argument("--per-connection", type=int, default=10,
                        help="simulated nodes (streams) per TCP connection (default 10)")
    parser.add_argument("--pushes", type=int, help="weight updates per fan-out run (default 5)")
    parser.add_argument("--only",
                        choices=("fanout", "translation", "protocol", "dashboard", "fleet",
                                 "standby", "replicas", "soak"),
                        help="one benchmark")
    parser.add_argument("--fleet", default="10000x100x20", metavar="NODESxPOPSxGROUPS",
                        help="the fleet benchmark's size (default 10000x100x20; --quick: "
                        "400x20x20)")
    parser.add_argument("--runs", type=int, default=1,
                        help="the fleet and replicas benchmarks' rounds (medians and ranges; "
                        "default 1)")
    parser.add_argument("--soak-minutes", type=float, default=10.0,
                        help="the soak's length (default 10; `python -m bench.soak --hours 2` "
                        "for the committed run)")
    parser.add_argument("--variants", default="",
                        help="the fleet benchmark also runs Ballast without one of its parts, "
                        f"each in every round: comma-separated, or 'all' ({', '.join(VARIANTS)})")
    parser.add_argument("--compare-protocol", action="store_true",
                        help="fan-out runs twice per (size, mode): with the protocol core of "
                        "harness/protocol_baseline.py, then with the current one")
    parser.add_argument("--compare-encoder", action="store_true",
                        help="fan-out runs twice per (size, mode): with a response message "
                        "built per stream (the old encoder), then with the current one")
    args = parser.parse_args(argv)
    pushes = args.pushes or (3 if args.quick else 5)
    started = time.time()
    results: dict[str, Any] = {
        "started": started,
        "argv": sys.argv[1:],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
    }
    out: list[str] = []
    if args.only in (None, "translation"):
        print("== translation and serialization", flush=True)
        results["translation"] = translation.run(quick=args.quick)
        out += ["== Translation and serialization", translation.report(results["translation"])]
        print(out[-1] + "\n", flush=True)
    if args.only in (None, "protocol"):
        print("== protocol core (sans-I/O, baseline vs current, interleaved)", flush=True)
        results["protocol"] = protocol_core.run(streams=200 if args.quick else 500,
                                                rounds=5 if args.quick else 9)
        out += ["== Protocol core per stream (one PoP, weight change of one origin group)",
                protocol_core.report(results["protocol"])]
        print(out[-1] + "\n", flush=True)
    if args.only in (None, "dashboard"):
        print("== dashboard server time (100 PoPs x 50 groups, full decision log)", flush=True)
        results["dashboard"] = dashboard.run(quick=args.quick)
        out += ["== Dashboard server time", dashboard.report(results["dashboard"])]
        print(out[-1] + "\n", flush=True)
    if args.only in (None, "standby"):
        print("== cold-standby ramp (real Envoy, seed 002's incident, ramp on vs off)", flush=True)
        ramp_runs = asyncio.run(standby_ramp.both(standby_ramp.Scenario()))
        results["standby_ramp"] = standby_ramp.as_json(ramp_runs)
        out += ["== Cold-standby ramp: the standby during the shift, ramp on vs off",
                report_standby_ramp(ramp_runs)]
        print(out[-1] + "\n", flush=True)
    if args.only in (None, "fanout"):
        print("== push fan-out", flush=True)
        protocols: tuple[str, ...] = ("current",)
        if args.compare_protocol:
            protocols = ("baseline", *protocols)
        if args.compare_encoder:
            protocols = ("message", *protocols)
        fan = run_fanout(plans(args.quick, args.nodes, args.per_connection), pushes, protocols)
        results["fanout"] = [r.as_dict() for r in fan]
        results["fanout_floor"] = {
            "push_us_per_node": fanout.FLOOR_PUSH_US_PER_NODE,
            "message_per_stream_push_us_per_node": fanout.FLOOR_MESSAGE_PER_STREAM_US_PER_NODE,
            "cpu_us_per_node": fanout.FLOOR_CPU_US_PER_NODE,
            "rss_per_node": fanout.FLOOR_RSS_PER_NODE,
        }
        out += ["== Push fan-out (weight update on ewr -> last ACK of ewr's nodes)",
                fanout.report(fan),
                f"floor (docs/architecture.md, 10k nodes, 1 conn each): push "
                f"{fanout.FLOOR_PUSH_US_PER_NODE:g}"
                f" µs/node wall ({fanout.FLOOR_MESSAGE_PER_STREAM_US_PER_NODE:g} with a message "
                f"per stream), {fanout.FLOOR_CPU_US_PER_NODE:g} µs CPU/node, "
                f"{fanout.FLOOR_RSS_PER_NODE / 1e3:g} KB RSS/node"]
    if args.only in (None, "fleet"):
        size = "400x20x20" if args.quick and args.fleet == "10000x100x20" else args.fleet
        nodes, pops, groups = (int(part) for part in size.split("x"))
        print(f"== fleet: {nodes:,} nodes over {pops} PoPs, {groups} groups, Ballast vs the "
              "raw grpc.aio floor", flush=True)
        variants = list(VARIANTS) if args.variants == "all" else [
            v for v in args.variants.split(",") if v]
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
        results["fleet"] = fleet.run(nodes, pops, groups, args.per_connection,
                                     pushes=args.pushes or 20, runs=args.runs,
                                     variants=variants)
        out += [f"== Fleet: {nodes:,} nodes over {pops} PoPs, {groups} origin groups "
                f"({args.per_connection} streams per connection), Ballast vs the floor "
                "measured in the same run", fleet.report(results["fleet"])]
        print(out[-1] + "\n", flush=True)
    if args.only in (None, "replicas"):
        size = "400x20x20" if args.quick and args.fleet == "10000x100x20" else args.fleet
        nodes, pops, groups = (int(part) for part in size.split("x"))
        print(f"== replicas: {nodes:,} nodes over 1 and 2 replicas on etcd", flush=True)
        results["replicas"] = replicas.run(nodes, pops, groups, [1, 2], args.runs)
        out += [f"== Replicas on etcd: {nodes:,} nodes spread over them by connection",
                replicas.report(results["replicas"])]
        print(out[-1] + "\n", flush=True)
    soak_ok = True
    if args.only in (None, "soak"):
        minutes = 2.0 if args.quick else args.soak_minutes
        print(f"== soak: {minutes:g} minutes (report in bench/results/soak)", flush=True)
        soak_ok = asyncio.run(soak.soak(60 * minutes, ROOT / "bench" / "results" / "soak",
                                        f"python -m bench.soak --minutes {minutes:g}"))
        results["soak"] = json.loads(
            (ROOT / "bench" / "results" / "soak" / "samples.json").read_text())
        out += ["== Soak", (ROOT / "bench" / "results" / "soak" / "report.md").read_text()
                .split("\n![samples]")[0]]
    results["elapsed_s"] = time.time() - started
    results["loadavg_end"] = os.getloadavg()
    path = ROOT / "bench" / "results" / "latest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print("\n\n".join(out))
    print(f"\n{results['elapsed_s']:.0f} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; results in {path.relative_to(ROOT)}")
    failed = (any(r.get("errors") for r in results.get("fanout", []))
              or ("fleet" in results and bool(fleet.errors(results["fleet"])))
              or ("replicas" in results and bool(replicas.errors(results["replicas"])))
              or not soak_ok)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
