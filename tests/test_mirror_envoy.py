"""The cache-warming mirror through a real Envoy 1.40: while it is set, about `mirror_percent` of
the cacheable GET/HEAD requests reach the standby as `-shadow` copies; none before or after, none
of other methods; clients only ever see the primary's answers; starting and stopping it pushes
routes only (RDS).

The primary takes all the traffic here (`min_warm_pool: 0`), so every request the standby sees
is a mirrored copy. The reconcile loop ticks once at start-up and then not for an hour; the ramp
state that starts (and then stops) the mirror is saved through the intent owner as the loop's
tick would save it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from control_plane.admin.capability_keys import capabilities_for_key
from control_plane.decide.ramp import RampState
from control_plane.desired.model import Mirror
from control_plane.intent.pair_changes import PairChange
from control_plane.lifecycle.service import BallastService
from control_plane.translate.resources import CLUSTER_TYPE, ROUTE_TYPE, Capabilities
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess
from harness.eventually import eventually
from harness.fleet import ewr_edge
from harness.intent_changes import apply_pair_changes

pytestmark = pytest.mark.envoy

REQUESTS = 1200
PERCENT = 5.0
MIRROR = "shop.mirror-secondary"  # the mirror cluster of the standby (translate/mirror.py)


@pytest_asyncio.fixture
async def edge(tmp_path: Path) -> AsyncIterator[tuple[BallastService, EnvoyProcess,
                                                      dict[str, DemoOrigin], int]]:
    def all_on_the_primary(text: str) -> str:
        return text.replace("  stale_after: 10s\n", "  stale_after: 10s\n  min_warm_pool: 0\n")

    async with ewr_edge(tmp_path, all_on_the_primary) as edge:
        yield edge.service, edge.envoy, edge.origins, edge.listener


async def send(port: int, count: int, method: str = "GET") -> Counter[str]:
    """`count` requests over a few paths; the `x-origin` of every answer."""
    answered: Counter[str] = Counter()
    paths = ("/img/a.png", "/", "/api/checkout/cart")
    async with aiohttp.ClientSession() as session:
        async def one(i: int) -> None:
            url = f"http://127.0.0.1:{port}{paths[i % len(paths)]}"
            async with session.request(method, url) as response:
                await response.read()
                answered[f"{response.status} {response.headers.get('x-origin')}"] += 1

        for start in range(0, count, 20):
            await asyncio.gather(*(one(i) for i in range(start, min(count, start + 20))))
    return answered


def mirror_settled(envoy: EnvoyProcess, standby: DemoOrigin) -> bool:
    """No mirrored request in flight at Envoy, and the standby saw every one Envoy sent."""
    stats = {}
    for line in envoy.admin(f"/stats?filter=^cluster\\.{MIRROR}\\.upstream_rq_").splitlines():
        name, _, value = line.partition(": ")
        stats[name.rsplit(".", 1)[-1]] = int(value) if value.strip().isdigit() else 0
    return stats.get("upstream_rq_active", 0) == 0 and standby.shadowed == stats.get(
        "upstream_rq_total", 0)


def route_names(envoy: EnvoyProcess) -> list[str]:
    dump = envoy.admin_json("/config_dump?resource=dynamic_route_configs")
    return [route["name"] for config in dump["configs"]
            for vhost in config["route_config"]["virtual_hosts"] for route in vhost["routes"]]


async def test_mirror_copies_about_its_percent_of_cacheable_requests_only_while_set(
    edge: tuple[BallastService, EnvoyProcess, dict[str, DemoOrigin], int],
) -> None:
    service, envoy, origins, port = edge
    cache = service.server.cache
    primary, secondary = origins["primary"], origins["secondary"]
    caps = node_capabilities(service)

    def version(type_url: str) -> str:
        return cache.resources("ewr", caps).type_version(type_url)

    cds, rds = version(CLUSTER_TYPE), version(ROUTE_TYPE)

    before = await send(port, 300)
    assert before == Counter({"200 primary": 300})
    assert secondary.total == 0, "no mirror, nothing reaches the standby"

    await set_ramp(service, RampState({"secondary": 1}, {}))
    assert service.server.intent.intent.mirror("ewr", "shop") == Mirror(("secondary",), PERCENT)
    await eventually(lambda: "default-mirror" in route_names(envoy), 10,
                     "Envoy has the mirror route")
    during = await send(port, REQUESTS)
    assert during == Counter({"200 primary": REQUESTS}), "clients see only primary answers"
    await eventually(lambda: secondary.shadowed >= 1, 10, "the first shadow copy")
    # mirrored copies are fire-and-forget: until the last ones have landed
    await eventually(lambda: mirror_settled(envoy, secondary), 10, "the mirrored copies land")
    mirrored = secondary.shadowed
    expected = REQUESTS * PERCENT / 100  # 60; binomial sd ~7.5
    assert expected * 0.5 <= mirrored <= expected * 1.6, (mirrored, expected)
    assert secondary.total == secondary.shadowed, "every standby request is a mirrored copy"
    assert primary.total == 300 + REQUESTS

    posts = await send(port, 200, "POST")
    assert posts == Counter({"200 primary": 200})
    await eventually(lambda: mirror_settled(envoy, secondary), 10, "no copy in flight")
    assert secondary.shadowed == mirrored, "POST is not cacheable: never mirrored"

    assert version(CLUSTER_TYPE) == cds and version(ROUTE_TYPE) != rds, "started: RDS only"

    await set_ramp(service, RampState())
    assert service.server.intent.intent.mirror("ewr", "shop") is None
    await eventually(lambda: "default-mirror" not in route_names(envoy), 10, "mirror route gone")
    after = await send(port, 300)
    await eventually(lambda: mirror_settled(envoy, secondary), 10, "no copy in flight")
    assert after == Counter({"200 primary": 300})
    assert secondary.shadowed == mirrored, "no mirror after it stopped"
    assert (version(CLUSTER_TYPE), version(ROUTE_TYPE)) == (cds, rds), "stopped: RDS only, back"


async def set_ramp(service: BallastService, ramp: RampState) -> None:
    """Save a ramp state for (ewr, shop), as the reconcile loop's tick does."""
    owner = service.server.intent
    key = ("ewr", "shop")
    await apply_pair_changes(
        owner, [PairChange(key, owner.weights(*key), owner.controller(key), ramp=ramp)])


def node_capabilities(service: BallastService) -> Capabilities:
    (node,) = service.server.nodes.statuses()
    return capabilities_for_key(node.capability_key)
