"""Lending end to end: Ballast (sink metrics, reconcile every second) and a real Envoy 1.40.

With critical and normal idle, the busy background tier borrows their unused shares (an RTDS
runtime override of its breakers) and completes far more requests per second than its static
share allows; when critical and normal traffic comes back, the borrowed slots are taken back
and Envoy's runtime no longer overrides the breakers within a tick, a stats flush and 1 s.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from control_plane.decisions.read import iter_records
from harness.envoy_process import EnvoyProcess
from harness.eventually import eventually
from tests.support.tier_fleet import closed_loop, tier_fleet

pytestmark = pytest.mark.envoy

ORIGIN_MS = 100
TICK_S, FLUSH_S = 1.0, 1.0
BACKGROUND_KEY = "circuit_breakers.shop.background.default.max_requests"
TIER_ACTIONS = "{for: 1s}"  # lending grows after 1 s of spare


def runtime_limit(envoy: EnvoyProcess) -> int | None:
    entry = envoy.admin_json("/runtime").get("entries", {}).get(BACKGROUND_KEY)
    return None if entry is None else int(float(entry["final_value"]))


async def test_idle_shares_are_lent_to_background_and_taken_back(tmp_path: Path) -> None:
    async with tier_fleet(tmp_path, TIER_ACTIONS, ORIGIN_MS, FLUSH_S) as (envoy, port):
        base = f"http://127.0.0.1:{port}"
        stop, background = asyncio.Event(), []
        tasks = [asyncio.create_task(closed_loop(f"{base}/_next/image?u=a", 10, stop, background))]
        try:
            await eventually(lambda: (runtime_limit(envoy) or 0) > 1, 15, "background lent slots",
                             in_thread=True)
            await asyncio.sleep(1.0)  # in force a moment; then count a steady 2 s
            before = len(background)
            await asyncio.sleep(2.0)
            lent_rps = (len(background) - before) / 2.0
            static_rps = 1 * 1000 / ORIGIN_MS  # its static share: 1 request at a time
            assert lent_rps > 3 * static_rps, (lent_rps, static_rps)

            critical_started = time.monotonic()
            critical, normal = [], []
            tasks.append(asyncio.create_task(
                closed_loop(f"{base}/api/checkout", 16, stop, critical)))
            tasks.append(asyncio.create_task(closed_loop(f"{base}/page", 6, stop, normal)))
            await eventually(lambda: runtime_limit(envoy) is None, 10, "borrowed slots reclaimed",
                             in_thread=True)
            took = time.monotonic() - critical_started
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    # the lenders' demand reaches Envoy's stats at the next flush; the next tick takes the
    # slots back and Envoy applies the runtime push
    assert took <= FLUSH_S + TICK_S + 1.0, took
    lends = [r for r in iter_records(tmp_path / "state") if r["kind"] == "tier_lend"]
    assert [r["detail"]["change"] for r in lends][:1] == ["lend"]
    assert lends[-1]["detail"]["change"] == "reclaim" and lends[-1]["detail"]["lent"] == {}
    # the reclaim read critical's demand per Envoy (16 clients on its 14 slots): how many were
    # active and how many still pending for a connection at that flush depends on when the
    # flush fell (the clients may still be starting), but it is the returned demand that
    # shrank the spare pool below what was lent, and nothing is lent beyond that pool
    lend, reclaim = lends[0], lends[-1]
    [(node, active)] = reclaim["inputs"]["readings"]["critical"]["active_by_node"]
    assert node == "ewr-1" and active > 0, reclaim["inputs"]["readings"]
    assert reclaim["detail"]["demand"]["critical"] >= active, reclaim["detail"]
    assert reclaim["detail"]["demand"]["critical"] > lend["detail"]["demand"]["critical"], (
        lend["detail"], reclaim["detail"])
    pool = sum(reclaim["detail"]["spare"].values())
    assert pool < sum(reclaim["detail"]["lent_before"].values()), reclaim["detail"]
    assert pool < lend["detail"]["spare"]["critical"], (lend["detail"], reclaim["detail"])
