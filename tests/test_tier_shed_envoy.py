"""Each shed action as a client sees it through a real Envoy 1.40: 503, 202, and 503 telling a
cache in front to serve stale; the critical tier still reaches the origin, and only it does."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.decide.tiers import TierState, actions_in_force
from control_plane.desired.model import ClassificationRule, Desired, Tier
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.models import example_desired, shop_group
from tests.support.tier_origins import Origins

pytestmark = pytest.mark.envoy


def shed_fleet(origin_port: int) -> Desired:
    """Tiers normal (defer), background (stale) and bulk (reject), all sheddable; `/bulk` is
    bulk. Every origin is the one at `origin_port`."""
    group = shop_group()
    bulk = replace(group.tier("background"), name="bulk", priority=3, shed_action="reject")
    tiers: tuple[Tier, ...] = (
        *(replace(t, sheddable=True, shed_action="defer") if t.name == "normal" else
          replace(t, shed_action="stale") if t.name == "background" else t
          for t in group.tiers),
        bulk,
    )
    origins = tuple(replace(o, port=origin_port) for o in group.origins)
    group = replace(group, tiers=tiers, origins=origins)
    desired = example_desired(group)
    return replace(desired, classification=(
        ClassificationRule(name="bulk", tier="bulk", path_prefix="/bulk"),
        *desired.classification,
    ))


def fetch(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


def test_each_shed_action_reaches_the_client(tmp_path: object) -> None:
    find_envoy()
    with Origins() as origins:
        desired = shed_fleet(origins.port("primary"))
        desired = replace(desired, listeners=tuple(replace(listener, port=free_port())
                                                   for listener in desired.listeners))
        group = desired.group("shop")
        actions = actions_in_force(group, TierState(shedding=True))
        assert actions is not None and set(actions.shed) == {"normal", "background", "bulk"}
        bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(),
                                                   PopIntent(tier_actions={"shop": actions})))
        admin_port = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
        port = desired.listeners[0].port
        with EnvoyProcess(bootstrap, admin_port) as envoy:
            envoy.wait_ready()
            defer = fetch(port, "/page", {"x-purpose": "prefetch"})
            stale = fetch(port, "/_next/image?url=a.png")
            reject = fetch(port, "/bulk/export")
            critical = fetch(port, "/api/checkout")
        assert defer[0] == 202
        assert (defer[1]["retry-after"], defer[1]["x-ballast-shed"]) == ("60", "normal")
        assert stale[0] == 503
        assert (stale[1]["x-ballast-serve-stale"], stale[1]["cache-control"],
                stale[1]["x-ballast-shed"]) == ("1", "no-store", "background")
        assert reject[0] == 503 and reject[1]["x-ballast-shed"] == "bulk"
        assert "x-ballast-serve-stale" not in reject[1]
        # critical is never shed: it went upstream, and it alone did
        assert critical[0] == 200 and "x-ballast-shed" not in critical[1], critical
        assert origins.seen == {("primary", "critical"): 1}, origins.seen
