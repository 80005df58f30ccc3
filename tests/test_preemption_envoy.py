"""Preemption end to end: Ballast (sink metrics, a tier tick every second) and a real Envoy 1.40.

The origin group has 20 origin connections: guarantees critical 14, normal 5, background 1,
floors 1 each (5 %). Lending is off, so only preemption moves slots. With normal's pool busy,
a checkout surge of 18 concurrent clients makes critical short: within one tick after its demand
reaches Envoy's stats, critical takes normal's 4 slots above its floor through the RTDS runtime
layer (critical 18, normal 1) and Envoy really runs more than 14 checkout requests at once;
normal's connections beyond its floor close once idle for a tier tick, so its requests queue
for its floor again;
when the surge ends, the slots go back once the window no longer shows it and the surplus held
for `recover_after`, and the layer is empty again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from control_plane.decisions.read import iter_records, record_time
from harness.envoy_process import EnvoyProcess
from harness.eventually import eventually
from tests.support.tier_fleet import closed_loop, tier_fleet

pytestmark = pytest.mark.envoy

ORIGIN_MS = 100
TICK_S, FLUSH_S, WINDOW_S, HOLD_S = 1.0, 1.0, 3.0, 2.0
KEY = "circuit_breakers.shop.{tier}.default.max_requests"
# give back after 2 s of surplus; no lending
TIER_ACTIONS = "{interval: 1s, for: 1s, recover_after: 2s, lending: false}"


def limits(envoy: EnvoyProcess) -> dict[str, int]:
    """The runtime overrides of critical's and normal's max_requests in force (absent: the
    guarantee). Background's floor is its guarantee: preemption never moves it (the surge may
    shed it, which keeps it at that floor)."""
    entries = envoy.admin_json("/runtime").get("entries", {})
    return {tier: int(float(entry["final_value"])) for tier in ("critical", "normal")
            if (entry := entries.get(KEY.format(tier=tier))) is not None}


def active(envoy: EnvoyProcess, tier: str, stat: str = "upstream_rq_active") -> int:
    name = f"cluster.shop.{tier}.{stat}"
    for line in envoy.admin(f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


async def test_checkout_takes_normal_slots_within_a_tick_and_gives_them_back(
    tmp_path: Path,
) -> None:
    async with tier_fleet(tmp_path, TIER_ACTIONS, ORIGIN_MS, FLUSH_S) as (envoy, port):
        base = f"http://127.0.0.1:{port}"
        stop, surge_over = asyncio.Event(), asyncio.Event()
        done: list[float] = []
        tasks = [asyncio.create_task(closed_loop(f"{base}/page", 8, stop, done)),
                 asyncio.create_task(closed_loop(f"{base}/_next/image?u=a", 3, stop, done))]
        try:
            # normal and background busy, critical idle: nothing taken (lending is off)
            await eventually(lambda: active(envoy, "normal") == 5, 15, "normal's pool full",
                             in_thread=True)
            assert limits(envoy) == {}
            started, started_wall = time.monotonic(), time.time()
            checkout = asyncio.create_task(
                closed_loop(f"{base}/api/checkout", 18, surge_over, done))
            took = await eventually(lambda: limits(envoy) == {"critical": 18, "normal": 1},
                                    10, "critical took normal's slots", in_thread=True)
            took_s = time.monotonic() - started
            assert took
            # the taken slots are used: more than critical's 14 run at once at the origin
            peak = await eventually(lambda: (n := active(envoy, "critical")) > 14 and n, 10,
                                    "more than 14 checkout requests at once", in_thread=True)
            await eventually(lambda: active(envoy, "normal") <= 1, 10,
                             "normal down to its floor", in_thread=True)
            # the connections normal opened under its old limit close once idle for a tier
            # tick; then its requests wait in its queue again instead of being refused
            await eventually(lambda: active(envoy, "normal", "upstream_cx_active") <= 1, 10,
                             "normal's extra connections closed", in_thread=True)
            await eventually(lambda: active(envoy, "normal", "upstream_rq_pending_active") >= 1,
                             10, "normal's requests queue at its floor", in_thread=True)
            surge_over.set()
            await checkout
            ended = time.monotonic()
            await eventually(lambda: limits(envoy) == {}, 15, "the slots given back",
                             in_thread=True)
            back_s = time.monotonic() - ended
        finally:
            stop.set()
            surge_over.set()
            await asyncio.gather(*tasks)
    records = [r for r in iter_records(tmp_path / "state") if r["kind"] == "tier_preempt"]
    changes = [r["detail"]["change"] for r in records]
    # one take, or two when the first flush caught the surge while its clients were starting
    assert changes in (["take", "give_back"], ["take", "take", "give_back"]), [
        r["rule"] for r in records]
    first, take, give = records[0], records[-2], records[-1]
    # critical's demand reaches Envoy's stats at the next flush and the next tick takes: the
    # first take within a flush and a tick (and a second of slack); all of it, and Envoy
    # applying the runtime push, within two
    first_s = record_time(first).timestamp() - started_wall
    assert first_s <= FLUSH_S + TICK_S + 1.0, (first_s, first["inputs"]["readings"]["critical"])
    assert took_s <= 2 * (FLUSH_S + TICK_S) + 1.0, (took_s, [r["rule"] for r in records])
    assert 14 < peak <= 18, peak
    # given back once the window stopped showing the surge and the surplus held for
    # `recover_after`
    assert back_s <= FLUSH_S + WINDOW_S + HOLD_S + TICK_S + 1.5, back_s
    assert take["detail"]["took"] == {"critical": 4} and take["detail"]["lost"] == {"normal": 4}
    assert take["detail"]["state"]["took"] == {"critical": 4}
    assert give["detail"]["took"] == {} and give["detail"]["lost"] == {}
    assert set(give["detail"]["actions"]["limits"]) <= {"background"}
    # the record says what was pushed: the limits in force after the take (background, at its
    # floor of 1 slot, is there too when the surge had it shed already)
    pushed = take["detail"]["actions"]["limits"]
    assert {t: n for t, n in pushed.items() if t != "background"} == {"critical": 18, "normal": 1}
    assert pushed.get("background", 1) == 1
