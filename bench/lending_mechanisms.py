"""Lending in Envoy: raise a busy tier's breakers by CDS (the cluster is rebuilt) or by an RTDS
runtime override (no rebuild), against a real Envoy 1.40 fed by a real `BallastServer`.

One run per mechanism: an origin answering in 50 ms, 30 closed-loop clients on the background
tier (static share 5 % of 120 = 6 requests at a time); after 2 s its limit goes to 41:
- `cds`: the desired state gives background 34 % (ceil(34 % x 120) = 41), so the Cluster changes;
- `rtds`: the tier actions carry `limits = {background: 41}`, so only the runtime layer changes.
Measured: new TCP connections the origin saw after the change (connection churn), the time
from the change until the origin has more than 6 background requests in flight (applied),
request failures, and background req/s before and after.

    .venv/bin/python -m bench.lending_mechanisms
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import aiohttp

from control_plane.desired.model import Desired, TierActions
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.xds_port.server import BallastServer
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.intent_changes import set_desired, set_tier_actions
from harness.models import example_desired, shop_group

LIMIT = 41
CLIENTS = 30
BEFORE_S, AFTER_S = 2.0, 4.0


def fleet(origin_port: int, listener_port: int) -> Desired:
    group = shop_group()
    group = replace(group, origins=tuple(replace(o, port=origin_port) for o in group.origins))
    desired = example_desired(group)
    (listener,) = desired.listeners
    return replace(desired, listeners=(replace(listener, port=listener_port),))


def with_background_share(desired: Desired, share: int) -> Desired:
    (group,) = desired.origin_groups
    tiers = tuple(replace(t, share_percent=share) if t.name == "background" else t
                  for t in group.tiers)
    return replace(desired, origin_groups=(replace(group, tiers=tiers),))


async def load(url: str, stop: asyncio.Event, done: list[tuple[float, int]]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as session:
        async def client() -> None:
            while not stop.is_set():
                try:
                    async with session.get(url) as response:
                        await response.read()
                        done.append((time.monotonic(), response.status))
                except aiohttp.ClientError:
                    done.append((time.monotonic(), 0))
        await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def run(mechanism: str) -> dict[str, Any]:
    origin = await DemoOrigin("primary", free_port()).start()
    origin.set_fault(Fault(latency_ms=50))
    listener = free_port()
    desired = fleet(origin.port, listener)
    ballast = BallastServer(desired, xds_address="127.0.0.1:0")
    await ballast.start()
    admin = free_port()
    envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=ballast.port,
                                       admin_port=admin), admin).start()
    stop = asyncio.Event()
    done: list[tuple[float, int]] = []
    try:
        await asyncio.to_thread(envoy.wait_ready, 20)
        url = f"http://127.0.0.1:{listener}/_next/image?url=a.png"
        task = asyncio.create_task(load(url, stop, done))
        await asyncio.sleep(BEFORE_S)
        peak_before = origin.in_flight_peak_reset()
        connections_before = len(origin.connections)
        changed = time.monotonic()
        if mechanism == "cds":
            await set_desired(ballast.intent, with_background_share(desired, 34))
        else:
            await set_tier_actions(ballast.intent, "ewr", "shop", TierActions(
                demote_tier=None, demote_to=None, demote_share=0, shed_tier=None,
                limits=(("background", LIMIT),)))
        applied = None
        while time.monotonic() - changed < AFTER_S:
            if applied is None and origin.in_flight > 6:
                applied = time.monotonic() - changed
            await asyncio.sleep(0.005)
        stop.set()
        await task
    finally:
        envoy.stop()
        await ballast.stop(0.2)
        await origin.stop()
    before = [s for t, s in done if t < changed]
    after = [s for t, s in done if t >= changed + 1.0]
    return {
        "mechanism": mechanism,
        "new_origin_connections_after_change": len(origin.connections) - connections_before,
        "origin_connections_before": connections_before,
        "applied_ms": None if applied is None else round(applied * 1000, 1),
        "failed_after_change": sum(1 for t, s in done if t >= changed and s != 200),
        "rps_before": round(len(before) / BEFORE_S, 1),
        "rps_after": round(len(after) / (AFTER_S - 1.0), 1),
        "in_flight_peak_before": peak_before,
        "in_flight_peak_after": origin.in_flight_peak,
    }


async def main() -> list[dict[str, Any]]:
    return [await run(mechanism) for mechanism in ("cds", "rtds", "cds", "rtds")]


if __name__ == "__main__":
    for row in asyncio.run(main()):
        print(json.dumps(row))
