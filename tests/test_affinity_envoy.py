"""Session affinity (the failover source) through a real Envoy 1.40 fed by Ballast over ADS: a
user's cookie keeps it on the origin it started on while the weights move 95/5 -> 60/40; once the
controller holds that origin sick, its users are balanced by the weights again (and get a new
cookie), while users of the healthy origin stay. Plus the translation and the desired state (unit).

The reconcile loop ticks once at start-up and then not for an hour; weights and the controller
state are saved through the intent owner as the loop's tick would save them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.extensions.filters.http.stateful_session.v3.stateful_session_pb2 import (
    StatefulSessionPerRoute,
)
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.stateful_session.cookie.v3.cookie_pb2 import CookieBasedSessionState

from control_plane.decide.controller import ControllerState
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import Affinity
from control_plane.intent.pair_changes import PairChange
from control_plane.lifecycle.service import BallastService
from control_plane.translate import translate_pop
from control_plane.translate.affinity import STATEFUL_SESSION_FILTER
from control_plane.translate.pop import PopIntent
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
)
from harness.envoy_process import EnvoyProcess
from harness.eventually import eventually
from harness.fleet import envoy_locality_weights, ewr_edge, fast_desired
from harness.intent_changes import apply_pair_changes

COOKIE = "ballast-shop"
AFFINITY_YAML = f"    affinity: {{cookie: {COOKIE}}}\n"
USERS = 200


def _desired_text(affinity: str = AFFINITY_YAML) -> str:
    text = fast_desired(primary=8081, secondary=8082, listener=10000)
    return text.replace("    health_check:", affinity + "    health_check:")


def test_affinity_is_read_from_the_desired_state() -> None:
    group = parse_desired(_desired_text(), "d.yaml").group("shop")
    assert group.affinity == Affinity("cookie", COOKIE, 0)
    header = parse_desired(_desired_text("    affinity: {header: X-Session, }\n"), "d.yaml")
    assert header.group("shop").affinity == Affinity("header", "x-session")
    ttl = parse_desired(_desired_text("    affinity: {cookie: s, ttl: 1h}\n"), "d.yaml")
    assert ttl.group("shop").affinity == Affinity("cookie", "s", 3_600_000)
    for bad, words in (("{cookie: a, header: b}", "exactly one of cookie or header"),
                       ("{}", "exactly one of cookie or header"),
                       ("{header: b, ttl: 1s}", "ttl applies to a cookie only"),
                       ("{cookie: 'a b'}", "must be a cookie name")):
        with pytest.raises(DesiredStateError, match=words):
            parse_desired(_desired_text(f"    affinity: {bad}\n"), "d.yaml")


def test_translation_turns_sessions_on_and_marks_only_healthy_origins() -> None:
    desired = parse_desired(_desired_text(), "d.yaml")
    out = translate_pop(desired, "ewr", Capabilities(),
                        PopIntent(sick={"shop": frozenset({"primary"})}))
    hcm = hcm_pb2.HttpConnectionManager()
    out.of_type(LISTENER_TYPE)["edge"].message.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    assert [f.name for f in hcm.http_filters] == [STATEFUL_SESSION_FILTER,
                                                  "envoy.filters.http.router"]
    (vhost,) = out.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    per_host = StatefulSessionPerRoute()
    vhost.typed_per_filter_config[STATEFUL_SESSION_FILTER].Unpack(per_host)
    state = CookieBasedSessionState()
    per_host.stateful_session.session_state.typed_config.Unpack(state)
    assert (state.cookie.name, state.cookie.path) == (COOKIE, "/")
    assert not per_host.stateful_session.strict
    cluster = out.of_type(CLUSTER_TYPE)["shop.critical"].message
    assert list(cluster.common_lb_config.override_host_status.statuses) == [HealthStatus.HEALTHY]
    assignment = out.of_type(ENDPOINT_TYPE)["shop.critical"].message
    health = {loc.locality.zone: loc.lb_endpoints[0].health_status
              for loc in assignment.endpoints}
    assert health == {"primary": HealthStatus.UNKNOWN, "secondary": HealthStatus.HEALTHY}
    # without affinity nothing of this is there
    plain = translate_pop(parse_desired(_desired_text(""), "d.yaml"), "ewr", Capabilities())
    hcm = hcm_pb2.HttpConnectionManager()
    plain.of_type(LISTENER_TYPE)["edge"].message.filter_chains[0].filters[0].typed_config.Unpack(
        hcm)
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    assert not plain.of_type(CLUSTER_TYPE)["shop.critical"].message.common_lb_config.HasField(
        "override_host_status")


@pytest_asyncio.fixture
async def edge(tmp_path: Path) -> AsyncIterator[tuple[BallastService, EnvoyProcess, int]]:
    def with_affinity(text: str) -> str:
        return text.replace("    health_check:", AFFINITY_YAML + "    health_check:")

    async with ewr_edge(tmp_path, with_affinity) as edge:
        yield edge.service, edge.envoy, edge.listener


async def visit(port: int, cookies: list[str | None]) -> list[tuple[str, str | None]]:
    """One GET per user (with its cookie, if any): (origin that answered, cookie set)."""
    out: list[tuple[str, str | None]] = []
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        for cookie in cookies:
            headers = {"cookie": f"{COOKIE}={cookie}"} if cookie else {}
            async with session.get(f"http://127.0.0.1:{port}/p/x", headers=headers) as answer:
                await answer.read()
                assert answer.status == 200
                set_cookie = answer.headers.get("set-cookie")
                value = None
                if set_cookie and set_cookie.startswith(f"{COOKIE}="):
                    value = set_cookie.split(";", 1)[0].split("=", 1)[1]
                out.append((answer.headers["x-origin"], value))
    return out


async def set_pair(service: BallastService, weights: dict[str, int],
                   controller: ControllerState) -> None:
    owner = service.server.intent
    await apply_pair_changes(owner, [PairChange(("ewr", "shop"), weights, controller)])


@pytest.mark.envoy
async def test_a_cookie_stays_on_its_origin_while_weights_move_unless_it_is_sick(
    edge: tuple[BallastService, EnvoyProcess, int],
) -> None:
    service, envoy, port = edge
    await set_pair(service, {"primary": 95, "secondary": 5}, ControllerState())
    await eventually(lambda: envoy_locality_weights(envoy, "shop.normal")
                     == {"primary": 95, "secondary": 5}, 10, "Envoy at 95/5", in_thread=True)
    first = await visit(port, [None] * USERS)
    assert all(cookie for _, cookie in first), "every new user gets a session cookie"
    started = Counter(origin for origin, _ in first)
    assert started["secondary"] >= 1 and started["primary"] >= USERS * 0.8, started
    cookies = [cookie for _, cookie in first]

    await set_pair(service, {"primary": 60, "secondary": 40}, ControllerState())
    await eventually(lambda: envoy_locality_weights(envoy, "shop.normal")
                     == {"primary": 60, "secondary": 40}, 10, "Envoy at 60/40", in_thread=True)
    for _ in range(3):
        again = await visit(port, cookies)
        assert [origin for origin, _ in again] == [origin for origin, _ in first]
    fresh = Counter(origin for origin, _ in await visit(port, [None] * USERS))
    assert USERS * 0.25 <= fresh["secondary"] <= USERS * 0.55, fresh  # the weights do apply

    # the controller holds the primary sick and moves weight off it: its sessions are balanced
    # by the weights again (the EDS update that carries the new weights carries the health;
    # Envoy's admin pages show UNKNOWN as HEALTHY, so the weights tell it was applied)
    await set_pair(service, {"primary": 55, "secondary": 45},
                   ControllerState({"primary": 2, "secondary": 0}, {}))
    await eventually(lambda: envoy_locality_weights(envoy, "shop.normal")
                     == {"primary": 55, "secondary": 45}, 10, "Envoy at 55/45", in_thread=True)
    sick = await visit(port, cookies)
    for (before, _), (after, _) in zip(first, sick, strict=True):
        if before == "secondary":
            assert after == "secondary"  # a healthy origin keeps its sessions
    moved = [(after, cookie) for (before, _), (after, cookie) in zip(first, sick, strict=True)
             if before == "primary" and after == "secondary"]
    pinned_primary = started["primary"]
    assert pinned_primary * 0.2 <= len(moved) <= pinned_primary * 0.6, (len(moved), started)
    assert all(cookie for _, cookie in moved), "a moved session gets a new cookie"
    stays = await visit(port, [cookie for _, cookie in moved])
    assert {origin for origin, _ in stays} == {"secondary"}
