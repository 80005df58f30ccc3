"""The admin HTTP API against a real Ballast (grpc.aio on a free port) and simulated ADS clients:
real HTTP, real gRPC, loopback only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from control_plane.decisions.log import DecisionLog
from control_plane.desired.model import TierActions
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate import render_json
from control_plane.translate.resources import CLUSTER_TYPE, Capabilities
from harness.ads_desired import desired
from harness.eventually import eventually
from harness.intent_changes import set_tier_actions, set_weights
from tests.support.admin_stack import (
    AdminStack,
    Samples,
    connect_node,
    sample,
    samples,
    start_stack,
)
from tests.support.forced_capabilities import force_capabilities

NOW = datetime.now(UTC)


def _decision_log(state_dir: Path) -> None:
    old = NOW - timedelta(hours=3)
    moments = iter([old, old + timedelta(minutes=1), old + timedelta(minutes=2),
                    NOW - timedelta(minutes=5)])
    with DecisionLog(state_dir, clock=lambda: next(moments)) as log:
        log.record("threshold_breach", pop="ewr", group="shop", rule="primary 5xx 7.9% > 2%")
        log.record("weight_shift", pop="ewr", group="shop",
                   weights_before={"primary": 95, "secondary": 5},
                   weights_after={"primary": 85, "secondary": 15}, rule="step cap 10")
        log.record("hold", pop="sjc", group="shop", rule="fail static: metrics stale")
        log.record("config_applied", config_version="abc", detail={"changed": ["ewr"]})


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[AdminStack]:
    _decision_log(tmp_path)
    the_stack = await start_stack(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082), tmp_path
    )
    try:
        yield the_stack
    finally:
        await the_stack.stop()


@pytest.fixture
async def http(stack: AdminStack) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(stack.url) as session:
        yield session


async def get(http: aiohttp.ClientSession, path: str, status: int = 200) -> Any:
    async with http.get(path) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        return await response.json()


async def test_nodes_status_health_and_readiness(
    stack: AdminStack, http: aiohttp.ClientSession
) -> None:
    ewr, ewr_channel = await connect_node(stack, "ewr-1", "ewr")
    sjc, sjc_channel = await connect_node(stack, "sjc-1", "sjc", delta=True)
    try:
        nodes = (await get(http, "/nodes"))["nodes"]
        assert [(n["node_id"], n["pop"], n["mode"]) for n in nodes] == [
            ("ewr-1", "ewr", "sotw"), ("sjc-1", "sjc", "delta")
        ]
        assert all(n["status"] == "SYNCED" for n in nodes)
        assert set(nodes[0]["types"]) == {"CDS", "EDS", "LDS", "RDS"}
        cds = nodes[0]["types"]["CDS"]
        assert cds["last_sent"] == cds["last_acked"] == ewr.state.acked[CLUSTER_TYPE]

        one = await get(http, "/nodes/sjc-1")
        assert one["node_id"] == "sjc-1" and [s["pop"] for s in one["streams"]] == ["sjc"]
        assert "no connected node 'nope'" in (await get(http, "/nodes/nope", 404))["error"]

        status = await get(http, "/status")
        assert status["nodes"] == {
            "total": 2,
            "by_pop": {"ewr": 1, "sjc": 1},
            "by_status": {"SYNCED": 2, "STALE": 0, "NACKED": 0},
        }
        assert status["desired"]["digest"] == "test-digest" and status["ready"] is True
        assert status["xds_address"] == f"127.0.0.1:{stack.ballast.port}"

        assert await get(http, "/healthz") == {"ok": True}
        assert await get(http, "/readyz") == {"ready": True}
        stack.ready = False
        not_ready = await get(http, "/readyz", 503)
        assert not_ready["ready"] is False and "not restored" in not_ready["reason"]
        assert await get(http, "/healthz") == {"ok": True}  # alive, just not ready
        stack.ready = True
        assert await get(http, "/readyz") == {"ready": True}
    finally:
        for client, channel in ((ewr, ewr_channel), (sjc, sjc_channel)):
            await client.close()
            await channel.close()


async def test_weights_and_resources_match_the_cache(
    stack: AdminStack, http: aiohttp.ClientSession
) -> None:
    cache = stack.ballast.cache
    intent = stack.ballast.intent
    await set_weights(intent, "ewr", "shop", {"primary": 60, "secondary": 40})
    weights = (await get(http, "/weights"))["weights"]
    assert weights == intent.all_weights()
    assert weights["ewr"]["shop"] == {"primary": 60, "secondary": 40}
    assert weights["sjc"]["shop"] == {"primary": 95, "secondary": 5}

    answer = await get(http, "/resources?pop=ewr")
    assert answer["capabilities"] == "fifo"
    assert answer["capabilities_reason"] == "no connected nodes in PoP ewr: the fifo default"
    assert answer["resources"] == render_json(cache.resources("ewr", Capabilities()))
    endpoints = answer["resources"]["endpoints"]["shop.critical"]["endpoints"]
    assert {e["locality"]["zone"]: e["load_balancing_weight"] for e in endpoints} == {
        "primary": 60, "secondary": 40
    }

    lifo = await get(http, "/resources?pop=sjc&caps=lifo")
    assert lifo["capabilities"] == "lifo" and lifo["notes"] == []
    assert lifo["resources"] == render_json(
        cache.resources("sjc", Capabilities(adaptive_lifo=True))
    )
    force_capabilities(cache, "sjc", Capabilities(adaptive_lifo=True))
    overridden = await get(http, "/resources?pop=sjc")
    assert (overridden["capabilities"], overridden["capabilities_reason"]) == (
        "lifo", "override for PoP sjc"
    )

    client, channel = await connect_node(stack, "ewr-1", "ewr")
    try:
        connected = await get(http, "/resources?pop=ewr")
        assert connected["capabilities_reason"] == "most connected nodes of PoP ewr"
    finally:
        await client.close()
        await channel.close()

    assert "unknown PoP 'lax'" in (await get(http, "/resources?pop=lax", 404))["error"]
    assert "pop: required" in (await get(http, "/resources", 400))["error"]
    assert "unknown capability key 'quic'" in (
        await get(http, "/resources?pop=ewr&caps=quic", 400)
    )["error"]
    assert "unknown query parameter(s) popp" in (
        await get(http, "/resources?popp=ewr", 400)
    )["error"]
    assert "Not Found" in (await get(http, "/nope", 404))["error"]
    assert await get(http, "/weights") == {"weights": intent.all_weights()}  # state intact


async def test_decisions_filters_and_bad_queries(
    stack: AdminStack, http: aiohttp.ClientSession
) -> None:
    every = (await get(http, "/decisions"))["records"]
    assert [r["kind"] for r in every] == [
        "threshold_breach", "weight_shift", "hold", "config_applied"
    ]

    async def seqs(query: str) -> list[int]:
        return [r["seq"] for r in (await get(http, f"/decisions?{query}"))["records"]]

    assert await seqs("pop=ewr") == [1, 2]
    assert await seqs("pop=ewr&group=shop&kind=weight_shift,hold") == [2]
    assert await seqs("limit=2") == [3, 4]
    assert await seqs("after=2") == [3, 4]
    assert await seqs("since=1h") == [4]
    assert await seqs("since=2000-01-01T00:00:00Z&kind=hold") == [3]

    bad = {
        "since=yesterday": "since: cannot read 'yesterday' as a time",
        "kind=weight_shift,teleport": "unknown kind teleport",
        "limit=0": "limit='0': wants a whole number >= 1",
        "limit=ten": "limit='ten'",
        "after=-1": "after='-1'",
        "seq=3": "unknown query parameter(s) seq",
    }
    for query, message in bad.items():
        assert message in (await get(http, f"/decisions?{query}", 400))["error"], query
    assert await seqs("") == [1, 2, 3, 4]


async def test_metrics_move_with_pushes_acks_and_nacks(
    stack: AdminStack, http: aiohttp.ClientSession
) -> None:
    def reject(type_url: str, names: list[str]) -> str | None:
        return "simulated rejection" if type_url == CLUSTER_TYPE else None

    good, good_channel = await connect_node(stack, "ewr-1", "ewr")
    bad, bad_channel = await connect_node(stack, "sjc-bad", "sjc", reject=reject)
    try:
        await good.wait_for(lambda c: len(c.state.acked) == 4)
        async with http.get("/metrics") as response:
            assert response.status == 200
            assert response.content_type == "text/plain"
            parsed = samples(await response.text())
        assert sample(parsed, "ballast_connected_nodes", pop="ewr") == 1
        assert sample(parsed, "ballast_connected_nodes", pop="sjc") == 1
        for kind in ("CDS", "EDS", "LDS", "RDS"):
            assert sample(parsed, "ballast_xds_pushes_total", type=kind) == 2  # one per node
            assert (sample(parsed, "ballast_xds_push_bytes_total", type=kind) or 0) > 100
        assert sample(parsed, "ballast_xds_nacks_total", type="CDS") == 1
        assert sample(parsed, "ballast_xds_acks_total", type="CDS") == 1  # the good node
        assert (sample(parsed, "ballast_xds_acks_total", type="LDS") or 0) >= 2
        # push-to-ACK: CDS only from the node that ACKed it; LDS from both
        assert sample(parsed, "ballast_xds_convergence_seconds_count", type="CDS") == 1
        assert sample(parsed, "ballast_xds_convergence_seconds_count", type="LDS") == 2
        assert sample(
            parsed, "ballast_xds_convergence_seconds_bucket", type="LDS", le="+Inf"
        ) == 2
        assert (sample(parsed, "ballast_xds_convergence_seconds_sum", type="LDS") or 1) < 1
        assert sample(
            parsed, "ballast_origin_weight", pop="ewr", group="shop", origin="primary"
        ) == 95

        await set_weights(stack.ballast.intent, "ewr", "shop", {"primary": 70, "secondary": 30})
        await good.wait_for(lambda c: len(c.responses(
            "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment")) >= 2)
        parsed = await scrape(http)
        assert sample(parsed, "ballast_xds_pushes_total", type="EDS") == 3
        assert sample(
            parsed, "ballast_origin_weight", pop="ewr", group="shop", origin="secondary"
        ) == 30
        await bad.close()
        await bad_channel.close()

        async def sjc_gone() -> bool:
            return sample(await scrape(http), "ballast_connected_nodes", pop="sjc") == 0

        await eventually(sjc_gone, 5, "sjc's node leaves ballast_connected_nodes", interval=0.02)
        parsed = await scrape(http)
        assert sample(parsed, "ballast_connected_nodes", pop="sjc") == 0
        assert sample(parsed, "ballast_connected_nodes", pop="ewr") == 1
    finally:
        for client, channel in ((good, good_channel), (bad, bad_channel)):
            await client.close()
            await channel.close()


async def scrape(http: aiohttp.ClientSession) -> Samples:
    async with http.get("/metrics") as response:
        assert response.status == 200
        return samples(await response.text())


SEED_000 = {
    **TierActions().to_dict(),
    "description": "normal: 50% demoted to background (answered at the edge: background is "
                   "shed); background: shed to its floor (503 beyond)",
}


async def test_tier_actions_in_the_api_status_and_gauge(
    stack: AdminStack, http: aiohttp.ClientSession
) -> None:
    intent = stack.ballast.intent

    def gauge(parsed: Samples, pop: str, action: str, tier: str) -> float | None:
        return sample(parsed, "ballast_tier_action_active", pop=pop, group="shop", action=action,
                      tier=tier)

    assert await get(http, "/tier-actions") == {"tier_actions": {"ewr": {}, "sjc": {}}}
    assert (await get(http, "/status"))["tier_actions"] == {"ewr": {}, "sjc": {}}
    parsed = await scrape(http)  # configured but off: 0, so dashboards see the series
    assert gauge(parsed, "ewr", "demote", "normal") == 0
    assert gauge(parsed, "ewr", "shed", "background") == 0

    await set_tier_actions(intent, "ewr", "shop", TierActions())
    every = await get(http, "/tier-actions")
    assert every == {"tier_actions": {"ewr": {"shop": SEED_000}, "sjc": {}}}
    assert (await get(http, "/status"))["tier_actions"] == every["tier_actions"]
    assert await get(http, "/tier-actions?pop=ewr&group=shop") == {
        "tier_actions": {"ewr": {"shop": SEED_000}}
    }
    assert await get(http, "/tier-actions?pop=sjc") == {"tier_actions": {"sjc": {}}}
    assert await get(http, "/tier-actions?group=shop") == every
    parsed = await scrape(http)
    assert gauge(parsed, "ewr", "demote", "normal") == 1
    assert gauge(parsed, "ewr", "shed", "background") == 1
    assert gauge(parsed, "sjc", "demote", "normal") == 0
    assert gauge(parsed, "sjc", "shed", "background") == 0

    shed_only = TierActions(demote_tier=None, demote_to=None, demote_share=0, retry_after_s=30)
    await set_tier_actions(intent, "ewr", "shop", shed_only)
    shop = (await get(http, "/tier-actions?pop=ewr"))["tier_actions"]["ewr"]["shop"]
    assert shop["description"] == "background: shed to its floor (503 beyond)"
    parsed = await scrape(http)
    assert gauge(parsed, "ewr", "demote", "normal") == 0
    assert gauge(parsed, "ewr", "shed", "background") == 1

    bad = {
        "/tier-actions?pop=lax": (404, "unknown PoP 'lax'; known: ewr, sjc"),
        "/tier-actions?group=video": (404, "unknown origin group 'video'; known: shop"),
        "/tier-actions?pop=ewr&tier=critical": (400, "unknown query parameter(s) tier"),
    }
    for path, (status, message) in bad.items():
        assert message in (await get(http, path, status))["error"], path

    await set_tier_actions(intent, "ewr", "shop", None)
    assert await get(http, "/tier-actions") == {"tier_actions": {"ewr": {}, "sjc": {}}}
    parsed = await scrape(http)
    assert gauge(parsed, "ewr", "shed", "background") == 0


def test_tier_action_gauge_is_replaced_on_each_set() -> None:
    metrics = BallastMetrics()
    metrics.set_tier_actions({"ewr": {"shop": TierActions()}, "lhr": {"shop": TierActions()}})
    parsed = samples(metrics.exposition().decode())
    assert sample(parsed, "ballast_tier_action_active", pop="lhr", group="shop",
                  action="shed", tier="background") == 1
    metrics.set_tier_actions({"ewr": {"shop": TierActions(shed_tier=None)}},
                             {"ewr": {"shop": TierActions()}})
    parsed = samples(metrics.exposition().decode())
    series = {dict(labels)["pop"] + " " + dict(labels)["action"]: value
              for (name, labels), value in parsed.items()
              if name == "ballast_tier_action_active"}
    assert series == {"ewr demote": 1, "ewr shed": 0}  # lhr gone: no longer in the cache
