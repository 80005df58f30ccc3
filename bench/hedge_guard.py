"""What bounds the share of a hedged tier a cold standby takes: `python -m bench.hedge_guard`.

Through a real Envoy 1.40 (a PoP's static bootstrap: group `shop` at 95/5, the critical tier
hedging after 50 ms), the primary answers every request 200 ms late and 40 % of them 5xx (issue
33's fault), the standby at once. Per Envoy mechanism, over `--runs` interleaved runs of
`--requests` critical requests by 4 clients: the standby's share of the requests by its weight
and through hedges, through retries after the primary's 5xx, and what the clients saw. The
origins log every attempt with Envoy's request id (`harness/hedge_share.py` tells a hedge from
a retry). Mechanisms:

- `unguarded`: today's routes: every request may hedge (a hedge goes to another origin);
- `guard`: Ballast's ramp guard at the warm pool (`decide/ramp.py` `hedge_share`: 5.26 % of the
  requests may hedge, the rest wait for their attempt; retries still leave a failing origin);
- `budget 5 %`: the retry budget cut to 5 % of active requests, `min_retry_concurrency` 0 (it
  binds hedges and retries alike).

Numbers in docs/benchmarks.md ("Hedges respect the ramp").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp

from control_plane.decide.ramp import hedge_share
from control_plane.desired.model import Origin
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.hedge_share import StandbyShare, standby_share
from harness.models import example_desired, shop_group

FAULT = Fault(error_rate=0.4, latency_ms=200)
WEIGHTS = {"primary": 95, "secondary": 5}


def _budget(bootstrap: dict[str, Any]) -> None:
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == "shop.critical":
            budget = cluster["circuit_breakers"]["thresholds"][0]["retry_budget"]
            budget["budget_percent"] = {"value": 5.0}
            budget["min_retry_concurrency"] = 0


MECHANISMS: dict[str, tuple[bool, Callable[[dict[str, Any]], None] | None]] = {
    "unguarded": (False, None),
    "guard": (True, None),
    "budget 5 %": (False, _budget),
}


async def run_one(mechanism: str, requests: int) -> tuple[StandbyShare, int]:
    guarded, edit = MECHANISMS[mechanism]
    primary = await DemoOrigin("primary", free_port()).start()
    standby = await DemoOrigin("secondary", free_port()).start()
    try:
        group = shop_group(Origin("primary", "127.0.0.1", primary.port),
                           Origin("secondary", "127.0.0.1", standby.port))
        group = replace(group, tiers=tuple(replace(t, hedge_delay_ms=50)
                                           if t.name == "critical" else t for t in group.tiers))
        desired = example_desired(group)
        listen = free_port()
        desired = replace(desired, listeners=(replace(desired.listeners[0], port=listen),))
        share = hedge_share(group, group.preference["ewr"], WEIGHTS, None) if guarded else None
        intent = PopIntent(weights={"shop": WEIGHTS},
                           hedges={} if share is None else {"shop": share})
        bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(), intent))
        admin = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
        if edit is not None:
            edit(bootstrap)
        primary.set_fault(FAULT)
        with EnvoyProcess(bootstrap, admin) as envoy:
            await asyncio.to_thread(envoy.wait_ready)
            started = time.monotonic()
            statuses = await _traffic(listen, requests)
            ended = time.monotonic()
        got = standby_share(primary.attempt_log, standby.attempt_log, "critical", started,
                            ended + 1)
        return got, sum(1 for status in statuses if status != 200)
    finally:
        await primary.stop()
        await standby.stop()


async def _traffic(port: int, requests: int) -> list[int]:
    gate = asyncio.Semaphore(4)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:

        async def one(i: int) -> int:
            async with gate, session.get(f"http://127.0.0.1:{port}/api/checkout/{i}") as answer:
                await answer.read()
                return answer.status

        return list(await asyncio.gather(*(one(i) for i in range(requests))))


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} [{min(values):.1f}-{max(values):.1f}]"


async def main_async(runs: int, requests: int) -> None:
    results: dict[str, list[tuple[StandbyShare, int]]] = {m: [] for m in MECHANISMS}
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(runs):
        for mechanism in MECHANISMS:  # interleaved: the machine's load hits every one alike
            results[mechanism].append(await run_one(mechanism, requests))
    print(f"{'mechanism':<12} {'weight+hedges %':>22} {'retries after 5xx %':>22} "
          f"{'client errors %':>20}   (median [range] over {runs} runs of {requests})")
    for mechanism, got in results.items():
        print(f"{mechanism:<12} {_spread([100 * s.by_weight_and_hedges for s, _ in got]):>22} "
              f"{_spread([100 * s.retries / s.requests for s, _ in got]):>22} "
              f"{_spread([100 * e / requests for _, e in got]):>20}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hedge_guard", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.runs, args.requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
