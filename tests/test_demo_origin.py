"""The demo origin's faults are deterministic and switchable over HTTP."""

from __future__ import annotations

import asyncio

import aiohttp

from harness.demo_origin import ColdCache, DemoOrigin, Fault
from harness.envoy_process import free_port


async def test_error_rate_is_exact_and_tier_is_echoed() -> None:
    origin = await DemoOrigin("primary", free_port()).start()
    try:
        origin.set_fault(Fault(error_rate=0.25, status=502))
        statuses = []
        async with aiohttp.ClientSession() as session:
            for _ in range(8):
                url = f"http://127.0.0.1:{origin.port}/x"
                async with session.get(url, headers={"x-ballast-tier": "normal"}) as r:
                    statuses.append(r.status)
                    assert r.headers["x-origin"] == "primary"
                    assert r.headers["x-seen-tier"] == "normal"
        assert statuses.count(502) == 2
        assert origin.requests["normal"] == 8
        assert origin.errors == 2
    finally:
        await origin.stop()


async def test_fault_endpoint_validates_and_applies() -> None:
    origin = await DemoOrigin("secondary", free_port()).start()
    base = f"http://127.0.0.1:{origin.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/_ballast/fault", json={"error_rate": 2}) as r:
                assert r.status == 400
                assert "error_rate" in (await r.json())["error"]
            assert origin.fault == Fault()
            async with session.post(f"{base}/_ballast/fault", json={"bogus": 1}) as r:
                assert r.status == 400
            body = {"fail_health": True, "status": 503}
            async with session.post(f"{base}/_ballast/fault", json=body) as r:
                assert r.status == 200
            async with session.get(f"{base}/healthz") as r:
                assert r.status == 503
            async with session.get(f"{base}/page") as r:
                assert r.status == 200
    finally:
        await origin.stop()


async def test_fault_limited_to_one_pop() -> None:
    origin = await DemoOrigin("primary", free_port()).start()
    try:
        origin.set_fault(Fault(error_rate=1.0, pops=("ewr",)))
        url = f"http://127.0.0.1:{origin.port}/x"
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={"x-ballast-pop": "ewr"}) as r:
                assert r.status == 503
            async with session.get(url, headers={"x-ballast-pop": "sjc"}) as r:
                assert r.status == 200
    finally:
        await origin.stop()


async def test_cold_cache_first_fetch_slow_repeat_fast_and_a_capacity_cap() -> None:
    origin = await DemoOrigin("standby", free_port(),
                              cache=ColdCache(miss_latency_ms=200, capacity=3)).start()
    url = f"http://127.0.0.1:{origin.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async def get(path: str) -> tuple[int, str]:
                async with session.get(url + path) as r:
                    await r.read()
                    return r.status, r.headers.get("x-cache", "")

            assert await get("/obj/1") == (200, "miss")
            assert await get("/obj/1") == (200, "hit")
            assert origin.answers[0].ms >= 200 > origin.answers[1].ms
            # five cold objects at once: three fetch, two are refused at once
            answers = await asyncio.gather(*(get(f"/obj/{i}") for i in range(2, 7)))
            assert sorted(answers) == [(200, "miss")] * 3 + [(503, "")] * 2
            assert origin.refused == 2 and origin.errors == 2
            assert len(origin.cached) == 4  # /obj/1 and the three fetched; refused: not cached
    finally:
        await origin.stop()
