"""Shedding as a client sees it through a real Envoy 1.40. A shed tier keeps its floor: its
requests reach the origin while the floor has a free slot (one more may wait for it), and what
finds the floor busy is answered at once with the tier's shed action — 503, 202, or 503 telling
a cache in front to serve stale; a floor of 0 sheds everything. While normal is demoted into the
shed background tier, the demoted share of normal is answered at the edge with normal's own
action and the rest reaches the origin as normal. The critical tier is never shed."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.decide.tiers import TierState, actions_in_force
from control_plane.desired.model import ClassificationRule, Desired, Tier, TierActions
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from harness.models import example_desired, shop_group
from tests.support.tier_origins import Origins

pytestmark = pytest.mark.envoy


# background's held requests stay held (at the origin, in its queue) while a test probes the
# other tiers, however slow a loaded machine makes that: timeouts beyond the test's own
HOLD = {"queue_timeout_ms": 15_000, "read_timeout_ms": 15_000}


def shed_fleet(origin_port: int) -> Desired:
    """20 origin connections; tiers normal (defer, floor 0), background (stale, floor 1 slot,
    15 s timeouts) and bulk (reject, floor 0), all sheddable; `/bulk` is bulk. Every origin is
    the one at `origin_port`; a free listener port."""
    group = replace(shop_group(), max_origin_concurrency=20)
    bulk = replace(group.tier("background"), name="bulk", priority=3, shed_action="reject",
                   min_share_percent=0)
    tiers: tuple[Tier, ...] = (
        *(replace(t, sheddable=True, shed_action="defer", min_share_percent=0)
          if t.name == "normal" else
          replace(t, shed_action="stale", **HOLD) if t.name == "background" else t
          for t in group.tiers),
        bulk,
    )
    origins = tuple(replace(o, port=origin_port) for o in group.origins)
    group = replace(group, tiers=tiers, origins=origins)
    desired = example_desired(group)
    return replace(desired, classification=(
        ClassificationRule(name="bulk", tier="bulk", path_prefix="/bulk"),
        *desired.classification,
    ), listeners=tuple(replace(listener, port=free_port()) for listener in desired.listeners))


def fetch(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


@contextmanager
def edge(desired: Desired, actions: TierActions) -> Iterator[EnvoyProcess]:
    """One Envoy serving `desired` with `actions` in force (runtime layer included), every
    request on the primary: a floor's waiting request waits in its origin's pool, and one
    drawn to the other origin (the warm pool's share) would find that pool without a
    connection, open one over the breaker (Envoy lets an empty pool have one) and be refused
    at the floor's `max_requests` as it attaches (`upstream_rq_active_overflow`), not wait."""
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(), PopIntent(
        tier_actions={"shop": actions}, weights={"shop": {"primary": 100, "secondary": 0}})))
    admin_port = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
    with EnvoyProcess(bootstrap, admin_port) as envoy:
        envoy.wait_ready()
        yield envoy


def gauge(envoy: EnvoyProcess, name: str) -> int:
    for line in envoy.admin(f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def test_a_shed_tier_keeps_its_floor_and_answers_the_rest_with_its_action() -> None:
    find_envoy()
    with Origins() as origins:
        desired = shed_fleet(origins.port("primary"))
        group = desired.group("shop")
        actions = actions_in_force(group, TierState(shedding=True))
        assert actions is not None and set(actions.shed) == {"normal", "background", "bulk"}
        assert dict(actions.limits) == {"normal": 0, "background": 1, "bulk": 0}
        port = desired.listeners[0].port
        with edge(desired, actions) as envoy:
            # background's floor: one request at the origin, one waiting for it
            held: list[tuple[int, dict]] = []
            threads = [threading.Thread(target=lambda: held.append(
                fetch(port, "/_next/image/held/a.png"))) for _ in range(2)]
            threads[0].start()
            eventually_blocking(lambda: origins.seen[("primary", "background")] == 1, 10,
                                "the first image at the origin")
            threads[1].start()
            eventually_blocking(lambda: gauge(
                envoy, "cluster.shop.background.upstream_rq_pending_active") == 1, 10,
                "the second image waiting for the floor's slot")
            stale = fetch(port, "/_next/image/b.png")  # the floor is busy: at once
            defer = fetch(port, "/page", {"x-purpose": "prefetch"})
            reject = fetch(port, "/bulk/export")
            critical = fetch(port, "/api/checkout")
            origins.release()
            for thread in threads:
                thread.join(20)
        assert [status for status, _ in held] == [200, 200], held
        assert stale[0] == 503
        assert (stale[1]["x-ballast-serve-stale"], stale[1]["cache-control"],
                stale[1]["x-ballast-shed"]) == ("1", "no-store", "background")
        assert defer[0] == 202 and defer[1]["x-ballast-shed"] == "normal"  # floor 0: all shed
        assert reject[0] == 503 and reject[1]["x-ballast-shed"] == "bulk"  # floor 0: all shed
        assert "x-ballast-serve-stale" not in reject[1]
        # critical is never shed; bulk never reached the origin
        assert critical[0] == 200 and "x-ballast-shed" not in critical[1], critical
        assert origins.seen[("primary", "critical")] == 1
        assert origins.seen[("primary", "background")] == 2
        assert origins.seen[("primary", "bulk")] == origins.seen[("primary", "normal")] == 0


def test_the_demoted_share_is_answered_at_the_edge_with_its_own_action() -> None:
    find_envoy()
    with Origins() as origins:
        desired = shed_fleet(origins.port("primary"))
        group = desired.group("shop")
        actions = actions_in_force(group, TierState(active=True))  # demote normal, shed bg
        assert actions is not None and actions.demote_share == 50
        port = desired.listeners[0].port
        with edge(desired, actions) as envoy:
            answers = [fetch(port, f"/page/{n}", {"x-purpose": "prefetch"})
                       for n in range(40)]
            assert envoy.proc is not None and envoy.proc.poll() is None
        deferred = [h for status, h in answers if status == 202]
        assert all(h["x-ballast-shed"] == "normal" for h in deferred)
        assert len(deferred) + origins.seen[("primary", "normal")] == 40
        # each request drew its own 50 %: 8..32 of 40 (p < 1e-4 to fall outside)
        assert 8 <= len(deferred) <= 32, len(deferred)
        assert origins.seen[("primary", "background")] == 0  # none demoted into the shed pool
