"""The dashboard's HTTP side against a real Ballast (grpc.aio) and simulated ADS clients: the
page and its assets, the JSON views, bounded queries, and the live stream (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from control_plane.admin.decision_feed import DecisionFeed
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import Query
from control_plane.translate.resources import CLUSTER_TYPE
from harness.ads_desired import desired
from harness.eventually import eventually
from tests.support.admin_stack import AdminStack, connect_node, start_stack

NOW = datetime.now(UTC)
HOME = {"primary": 95, "secondary": 5}
MAX_STREAMS = 3


class Clock:
    """The log's clock: given moments first, then the wall clock."""

    def __init__(self, moments: list[datetime]) -> None:
        self.moments = list(moments)

    def __call__(self) -> datetime:
        return self.moments.pop(0) if self.moments else datetime.now(UTC)


def _history(log: DecisionLog) -> None:
    """config_applied 3 h ago, a shift 2 h ago, a breach and a shift 5 min ago."""
    log.record("config_applied", config_version="abc", rule="desired state applied",
               detail={"diff": ["pop ewr:", "  cluster shop.critical: changed"], "diff_lines": 2})
    log.record("weight_shift", pop="ewr", group="shop", weights_before=HOME,
               weights_after={"primary": 85, "secondary": 15}, rule="old shift",
               inputs={"scores": {"primary": {"composite": 0.3}, "secondary": {"composite": 1.0}}},
               detail={"next": "keeps leaving"})
    log.record("threshold_breach", pop="ewr", group="shop", weights_before=HOME,
               weights_after=HOME, rule="primary 5xx 7.9% > 2%",
               inputs={"scores": {"primary": {"composite": 0.2}, "secondary": {"composite": 1.0}}})
    log.record("weight_shift", pop="ewr", group="shop", weights_before=HOME,
               weights_after={"primary": 84, "secondary": 16}, rule="step cap 10",
               inputs={"scores": {"primary": {"composite": 0.1}, "secondary": {"composite": 1.0}}},
               detail={"next": "leaves again in 20 s"})


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[AdminStack, DecisionLog, DecisionFeed]]:
    log = DecisionLog(tmp_path, clock=Clock([
        NOW - timedelta(hours=3), NOW - timedelta(hours=2),
        NOW - timedelta(minutes=5, seconds=1), NOW - timedelta(minutes=5),
    ]))
    _history(log)
    feed = DecisionFeed(ring=50, queue_size=20, max_subscribers=MAX_STREAMS)
    log.add_listener(feed.publish)
    stack = await start_stack(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082), tmp_path, feed=feed
    )
    try:
        yield stack, log, feed
    finally:
        await stack.stop()
        log.close()


@pytest.fixture
async def http(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed],
) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(parts[0].url) as session:
        yield session


async def get(http: aiohttp.ClientSession, path: str, status: int = 200) -> Any:
    async with http.get(path) as response:
        assert response.status == status, await response.text()
        return await response.json()


async def test_the_page_and_its_assets_come_from_the_package_and_allow_nothing_else(
    http: aiohttp.ClientSession,
) -> None:
    async with http.get("/dashboard", allow_redirects=False) as response:
        assert response.status == 302 and response.headers["Location"] == "/dashboard/"
    async with http.get("/dashboard/") as response:
        page = await response.text()
        assert response.status == 200 and response.content_type == "text/html"
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert "/dashboard/static/dashboard.js" in page and "http" not in page.replace("http-equiv", "")
    for name, kind in (("dashboard.js", "application/javascript"), ("dashboard.css", "text/css")):
        async with http.get(f"/dashboard/static/{name}") as response:
            assert response.status == 200 and response.content_type == kind
            assert "https://" not in await response.text()
    assert (await get(http, "/dashboard/static/../api.py", 404))
    assert "no dashboard asset" in (await get(http, "/dashboard/static/evil.js", 404))["error"]


async def test_overview_shows_pops_nodes_version_and_last_config_change(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    stack, log, _ = parts

    def reject(type_url: str, names: list[str]) -> str | None:
        return "cluster shop.critical: simulated rejection" if type_url == CLUSTER_TYPE else None

    client, channel = await connect_node(stack, "ewr-1", "ewr")
    bad, bad_channel = await connect_node(stack, "sjc-bad", "sjc", reject=reject)
    try:
        body = await get(http, "/dashboard/api/overview")
        sjc_page = await get(http, "/dashboard/api/pops/sjc")
    finally:
        for closing in (client, channel, bad, bad_channel):
            await closing.close()
    pops = {p["name"]: p for p in body["pops"]}
    assert set(pops) == {"ewr", "sjc"}
    assert [n["node_id"] for n in pops["ewr"]["nodes"]] == ["ewr-1"]
    assert pops["ewr"]["nodes"][0]["types"] == dict.fromkeys(("CDS", "EDS", "LDS", "RDS"),
                                                             "SYNCED")
    assert pops["ewr"]["by_status"]["SYNCED"] == 1
    assert pops["sjc"]["by_status"] == {"SYNCED": 0, "STALE": 0, "NACKED": 1}
    (nacked,) = pops["sjc"]["nacked"]
    assert nacked["node_id"] == "sjc-bad" and nacked["types"]["CDS"] == "NACKED"
    assert nacked["last_nack"]["type"] == "CDS"
    assert "simulated rejection" in nacked["last_nack"]["message"]
    assert sjc_page["nodes"][0]["last_nack"]["message"] == nacked["last_nack"]["message"]
    assert body["desired"]["version"] == stack.ballast.intent.desired.digest[:16]
    applied = body["config"]["config_applied"]
    assert applied["seq"] == 1 and applied["detail"]["diff"][0] == "pop ewr:"
    assert body["config"]["config_rejected"] is None
    log.record("config_rejected", config_version="bad", rule="desired state rejected",
               detail={"problems": ["desired.yaml:3:1: pops: empty"]})
    body = await get(http, "/dashboard/api/overview")
    assert body["config"]["config_rejected"]["detail"]["problems"] == [
        "desired.yaml:3:1: pops: empty"]


async def test_pop_view_lists_groups_with_weights_and_home(http: aiohttp.ClientSession) -> None:
    body = await get(http, "/dashboard/api/pops/sjc")
    assert body["nodes"] == []
    assert body["groups"][0]["name"] == "shop" and body["groups"][0]["home"] == HOME
    assert (await get(http, "/dashboard/api/pops/nowhere", 404))["error"].startswith(
        "unknown PoP 'nowhere'")


async def test_timeline_holds_the_range_only_with_scores_and_thresholds(
    http: aiohttp.ClientSession,
) -> None:
    body = await get(http, "/dashboard/api/timeline?pop=ewr&group=shop&range=15m")
    assert [p["rule"] for p in body["points"]] == ["primary 5xx 7.9% > 2%", "step cap 10"]
    assert body["points"][1]["scores"] == {"primary": 0.1, "secondary": 1.0}
    assert body["points"][1]["next"] == "leaves again in 20 s"
    assert body["initial"] == HOME and body["origins"] == ["primary", "secondary"]
    assert body["thresholds"]["min_warm_pool"] == 5
    assert body["thresholds"]["score_at_threshold"] == pytest.approx(0.8)
    assert not body["truncated"] and not body["log_begins"]
    assert body["controllers"] == {"Tier actions": None}
    day = await get(http, "/dashboard/api/timeline?pop=ewr&group=shop&range=24h")
    assert day["points"][0]["rule"] == "old shift"
    assert day["log_begins"]  # the log is 3 h old: the chart starts with it
    for query, status in (("pop=ewr&group=shop&range=2d", 400), ("pop=ewr", 400),
                          ("pop=ewr&group=shop&x=1", 400), ("pop=ewr&group=nope", 404),
                          ("pop=nope&group=shop", 404)):
        assert "error" in await get(http, f"/dashboard/api/timeline?{query}", status)


async def test_decision_by_seq_and_newest_records(http: aiohttp.ClientSession) -> None:
    record = (await get(http, "/dashboard/api/decisions/4"))["record"]
    assert record["rule"] == "step cap 10" and record["kind"] == "weight_shift"
    assert "no decision 999" in (await get(http, "/dashboard/api/decisions/999", 404))["error"]
    await get(http, "/dashboard/api/decisions/x1", 400)
    body = await get(http, "/dashboard/api/decisions?pop=ewr&kind=weight_shift&limit=1")
    assert [r["seq"] for r in body["records"]] == [4]
    for query in ("limit=0", "limit=501", "limit=x", "kind=bogus", "since=1h"):
        assert "error" in await get(http, f"/dashboard/api/decisions?{query}", 400)


async def _events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    """The next `count` SSE events as {event, id, data}."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    while len(events) < count:
        line = (await asyncio.wait_for(response.content.readline(), 5)).decode().rstrip("\n")
        if not line:
            if "event" in current:
                events.append(current)
            current = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            current[field] = json.loads(value) if field == "data" else value
    return events


async def test_stream_sends_new_matching_decisions_and_replays_after_a_reconnect(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    _, log, feed = parts
    async with http.get("/dashboard/api/stream?pop=sjc&kind=hold,return") as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        assert (await response.content.readline()) == b"retry: 1000\n"
        await eventually(lambda: feed.subscribers >= 1, 5, "the stream subscribed", interval=0.01)
        log.record("hold", pop="ewr", group="shop", rule="other PoP")
        log.record("weight_shift", pop="sjc", group="shop", rule="other kind")
        sent = log.record("hold", pop="sjc", group="shop", rule="fail static")
        (event,) = await _events(response, 1)
        assert event["event"] == "decision" and event["id"] == str(sent["seq"])
        assert event["data"]["rule"] == "fail static"
    missed = [log.record("return", pop="sjc", group="shop", rule=f"back {i}") for i in range(2)]
    headers = {"Last-Event-ID": str(sent["seq"])}
    async with http.get("/dashboard/api/stream?pop=sjc", headers=headers) as response:
        await response.content.readline()
        replayed = await _events(response, 2)
    assert [e["data"]["seq"] for e in replayed] == [r["seq"] for r in missed]
    assert "error" in await get(http, "/dashboard/api/stream?kind=nope", 400)


async def test_a_stream_that_falls_behind_is_told_so_and_closed(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    _, log, feed = parts
    async with http.get("/dashboard/api/stream") as response:
        await eventually(lambda: feed.subscribers >= 1, 5, "the stream subscribed", interval=0.01)
        for i in range(30):  # queue_size is 20 and nothing is read meanwhile
            log.record("hold", pop="ewr", group="shop", rule=f"flood {i}")
        body = (await asyncio.wait_for(response.content.read(), 5)).decode()
    assert "event: lagging" in body
    assert feed.subscribers == 0


async def test_stopping_the_admin_api_ends_open_streams_at_once(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    stack, _, feed = parts
    async with http.get("/dashboard/api/stream") as response:
        await eventually(lambda: feed.subscribers >= 1, 5, "the stream subscribed", interval=0.01)
        started = time.monotonic()
        await stack.api.stop()
        assert time.monotonic() - started < 3
        await asyncio.wait_for(response.content.read(), 3)
    assert feed.subscribers == 0


async def test_live_streams_are_bounded(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    _, _, feed = parts
    streams = [await http.get("/dashboard/api/stream") for _ in range(MAX_STREAMS)]
    try:
        assert all(stream.status == 200 for stream in streams)
        await eventually(lambda: feed.subscribers >= MAX_STREAMS, 5, "every stream subscribed",
                         interval=0.01)
        assert "already open" in (await get(http, "/dashboard/api/stream", 503))["error"]
    finally:
        for stream in streams:
            stream.close()


async def test_timeline_follows_every_record_that_sets_weights_and_marks_the_others(
    parts: tuple[AdminStack, DecisionLog, DecisionFeed], http: aiohttp.ClientSession
) -> None:
    _, log, _ = parts
    log.record("ramp_capped", pop="ewr", group="shop",
               weights_before={"primary": 84, "secondary": 16},
               weights_after={"primary": 90, "secondary": 10}, rule="ramp made it 84->90")
    log.record("tier_action", pop="ewr", group="shop", rule="critical pending > 10 for 30 s")
    body = await get(http, "/dashboard/api/timeline?pop=ewr&group=shop&range=15m")
    assert [p["kind"] for p in body["points"]][-1] == "ramp_capped"
    assert body["points"][-1]["weights"] == {"primary": 90, "secondary": 10}
    assert [m["kind"] for m in body["markers"]] == ["tier_action"]


async def test_records_written_on_another_thread_reach_the_stream_on_the_loop() -> None:
    feed = DecisionFeed()
    feed.bind(asyncio.get_running_loop())
    subscription = feed.subscribe(Query(pop="ewr"))
    delivered_on: list[int] = []
    offer = subscription.offer

    def noting_offer(record: dict[str, Any]) -> None:
        delivered_on.append(threading.get_ident())
        offer(record)

    subscription.offer = noting_offer  # type: ignore[method-assign]
    record = {"seq": 1, "time": "2026-11-30T12:00:00.000Z", "kind": "hold", "pop": "ewr"}
    await asyncio.to_thread(feed.publish, record)  # as a reconcile worker thread would
    assert await asyncio.wait_for(subscription.queue.get(), 2) == record
    assert delivered_on == [threading.get_ident()], "delivered off the event loop's thread"
    feed.close_all()
    assert await subscription.queue.get() is None and feed.subscribers == 0
