"""Abandoned attempts under ordinary hedging: `python -m bench.abandoned [--runs 3]`.

Through a real Envoy 1.40 (the critical tier hedging after 50 ms, 95/5, no ramp guard), a
primary whose first attempts stall 200 ms for a share of requests (the tail beyond the hedge
delay) and a fast standby. Envoy resets the primary's attempt whenever the hedge answers first,
so the primary's host counts it in `rq_total` only: the abandoned share is
(rq_total - rq_success - rq_error) / rq_total. For each share: the abandoned share measured
(median and range over the runs) and what `decide/evidence.py` makes of a 30 s window of it
at 20 requests/s (600 attempts) and at 200 requests/s: `abandon_threshold` (10 %) is crossed
only with evidence. Numbers in docs/benchmarks.md ("Abandoned attempts").
"""

from __future__ import annotations

import argparse
import os
import statistics

from control_plane.decide.evidence import judge
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy
from harness.hedging import run_hedging

SHARES = (0.01, 0.03, 0.05, 0.10, 0.25, 1.0)  # first attempts of the primary stalled


def verdict(share: float, attempts: int, policy: FailoverPolicy) -> str:
    """The evidence verdict of a window with `attempts` of which `share` were abandoned (the
    rest answered fast and well)."""
    lost = round(share * attempts)
    window = OriginSignals(attempts, 0, 0, 3.0, 8.0, 0.0, 0, None, 0,
                           latency_samples=attempts - lost, abandoned=lost)
    judged = judge(window, policy)
    return judged.verdict + (f" ({judged.breaches[0]})" if judged.breaches else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.abandoned", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600)
    args = parser.parse_args(argv)
    policy = FailoverPolicy()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'stalled':>8} {'abandoned % median [range]':>28}  verdict at 600 / 6000 attempts")
    for share in SHARES:
        measured = []
        for _ in range(args.runs):
            run = run_hedging(50, requests=args.requests, concurrency=4,
                              stall_every=max(1, round(1 / share)), stall_ms=200)
            host = run.hosts["primary"]
            total = host.get("rq_total", 0)
            lost = total - host.get("rq_success", 0) - host.get("rq_error", 0)
            measured.append(100 * lost / total if total else 0.0)
        median = statistics.median(measured)
        print(f"{share:>8.0%} {median:>10.1f} [{min(measured):.1f}-{max(measured):.1f}]"
              f"{'':>10}  {verdict(median / 100, 600, policy)} / "
              f"{verdict(median / 100, 6000, policy)}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
