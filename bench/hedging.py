"""P0 hedging benchmark: `python -m bench.hedging [--requests N] [--concurrency C]`.

Through a real Envoy 1.40, critical requests to a primary that stalls every 10th first attempt
for 600 ms (a fast standby at 5 % weight), once with the critical tier's `hedge_delay: 50ms`
and once without (same run, same machine). Then a burst where every first attempt stalls, to
show the retry budget holding hedges back. Prints client latency percentiles, Envoy's retry
counters and the most hedges in progress at once; numbers in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math

from control_plane.desired.defaults import DEFAULT_TIERS
from harness.hedging import HedgeRun, run_hedging

CRITICAL = next(t for t in DEFAULT_TIERS if t.name == "critical")


def row(label: str, run: HedgeRun) -> str:
    p = run.percentile
    return (f"{label:<26} {p(50):7.1f} {p(90):7.1f} {p(99):7.1f} {max(run.latencies_ms):7.1f}"
            f"  {run.stats['upstream_rq_retry']:6d} {run.stats['upstream_rq_retry_overflow']:8d}"
            f"  {run.attempts.max_retries_in_flight:9d}  {run.stats['upstream_cx_total']:11d}"
            f"  {dict(sorted(run.statuses.items()))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hedging", description=__doc__)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--burst", type=int, default=30, help="clients of the budget burst")
    args = parser.parse_args(argv)
    print(f"{'run':<26} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}  "
          f"{'hedges':>6} {'refused':>8}  {'in flight':>9}  {'connections':>11}  statuses")
    for delay in (0, 50):
        run = run_hedging(delay, requests=args.requests, concurrency=args.concurrency,
                          stall_every=10, stall_ms=600)
        print(row(f"stall 10%, hedge {'off' if not delay else f'{delay} ms'}", run), flush=True)
    budget = CRITICAL.retry_budget_percent / 100
    bound = max(CRITICAL.retries, math.floor(budget * args.burst / (1 - budget)))
    for delay in (0, 50):
        run = run_hedging(delay, requests=4 * args.burst, concurrency=args.burst, stall_every=1,
                          stall_ms=500, answer_ms=30)
        print(row(f"burst {args.burst}, hedge {'off' if not delay else f'{delay} ms'}", run),
              flush=True)
    print(f"retry budget bound for {args.burst} clients: {bound} hedges in flight")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
