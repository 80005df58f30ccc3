"""A tier's queue overflow is answered with the tier's shed action (202, stale, 503), not Envoy's
bare 503: the translation (unit) and a real Envoy 1.40 with one slot and no queue per tier, whose
origin holds the first request of each tier while a second one arrives."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from control_plane.desired.model import Desired, Origin
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.listeners import listener
from control_plane.translate.overflow import overflow_of
from control_plane.translate.pop import PopIntent
from control_plane.translate.resources import LISTENER_TYPE, Capabilities
from harness.envoy_process import EnvoyProcess, find_envoy, free_port
from harness.eventually import eventually_blocking
from harness.models import example_desired, shop_group
from tests.support.held_origin import held_origins

ACTIONS = {"critical": "reject", "normal": "stale", "background": "defer"}
PATHS = {"critical": "/api/checkout", "normal": "/page", "background": "/_next/image?u=a"}
HEADERS = {"normal": {"x-purpose": "prefetch"}}
# every request to one host: each host has its own connection pool, and a pool without a
# connection opens one whatever the cluster's max_connections (Envoy's rule against a pool
# that could never drain), so a request to the other host would overflow max_requests instead
ONE_HOST = PopIntent(weights={"shop": {"primary": 100, "secondary": 0}})


def overflow_fleet(port: int, listen: int) -> Desired:
    """One slot per tier (1 origin connection: ceil(share x 1)), a queue of one, each tier its
    own shed action."""
    group = shop_group(Origin("primary", "127.0.0.1", port), Origin("secondary", "127.0.0.1",
                                                                      port))
    # a read timeout longer than any test holds a request: no attempt times out meanwhile
    tiers = tuple(replace(t, max_queue_depth=1, shed_action=ACTIONS[t.name], retries=0,
                          read_timeout_ms=30_000, hedge_delay_ms=0)
                  for t in group.tiers)
    group = replace(group, tiers=tiers, max_origin_concurrency=1)
    desired = example_desired(group)
    (edge,) = desired.listeners
    return replace(desired, listeners=(replace(edge, port=listen),))


def test_every_tier_gets_a_mapper_matching_overflow_on_its_own_cluster() -> None:
    desired = overflow_fleet(8081, 10000)
    resources = translate_pop(desired, "ewr", Capabilities())
    built = resources.of_type(LISTENER_TYPE)["edge"].message
    again, _ = listener(desired.listeners[0], desired.pops[0], (), None, frozenset(),
                        overflow_of([desired.group("shop")]))
    assert built == again
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )
    hcm = hcm_pb2.HttpConnectionManager()
    built.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    mappers = hcm.local_reply_config.mappers
    assert [m.status_code.value for m in mappers] == [503, 503, 202]  # critical, normal, bg
    from envoy.extensions.access_loggers.filters.cel.v3.cel_pb2 import ExpressionFilter
    cel = ExpressionFilter()
    mappers[2].filter.and_filter.filters[1].extension_filter.typed_config.Unpack(cel)
    assert cel.expression == 'xds.cluster_name == "shop.background"'
    assert list(mappers[2].filter.and_filter.filters[0].response_flag_filter.flags) == ["UO"]
    headers = {h.header.key: h.header.value for h in mappers[1].headers_to_add}
    assert headers == {"retry-after": "2", "x-ballast-shed": "normal",
                       "x-ballast-serve-stale": "1", "cache-control": "no-store"}


def _stat(envoy: EnvoyProcess, name: str) -> int:
    text = envoy.admin(f"/stats?filter=^{name}$")
    return int(text.split(":")[1]) if ":" in text else 0


def fetch(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


@pytest.mark.envoy
def test_overflow_is_answered_with_each_tiers_shed_action() -> None:
    find_envoy()
    with held_origins("origin") as origins:
        origin = origins["origin"]
        listen = free_port()
        desired = overflow_fleet(origin.port, listen)
        bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(), ONE_HOST))
        admin_port = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
        with EnvoyProcess(bootstrap, admin_port) as envoy:
            envoy.wait_ready()
            answers: dict[str, tuple[int, dict]] = {}
            for served, tier in enumerate(("critical", "normal", "background")):
                origin.hold()
                fetched: list[tuple[int, dict]] = []
                threads = [threading.Thread(target=lambda t=tier, into=fetched: into.append(
                    fetch(listen, PATHS[t], HEADERS.get(t)))) for _ in range(2)]
                threads[0].start()
                origin.wait_held(1)  # the tier's one slot is busy at the origin
                threads[1].start()  # the tier's queue of one fills
                eventually_blocking(lambda t=tier: _stat(envoy, f"cluster.shop.{t}."
                                                                "upstream_rq_pending_active") == 1,
                                    10, f"a {tier} request pending")
                answers[tier] = fetch(listen, PATHS[tier], HEADERS.get(tier))
                origin.release()
                for thread in threads:
                    thread.join(timeout=10)
                assert [answer[0] for answer in fetched] == [200, 200]
                assert origin.served == served * 2 + 2  # the overflowing one never reached it
            stats = envoy.admin("/stats?filter=upstream_rq_pending_overflow")
    critical, normal, background = answers["critical"], answers["normal"], answers["background"]
    assert background[0] == 202
    assert (background[1]["x-ballast-shed"], background[1]["retry-after"]) == ("background", "3")
    assert normal[0] == 503
    assert (normal[1]["x-ballast-serve-stale"], normal[1]["cache-control"],
            normal[1]["x-ballast-shed"]) == ("1", "no-store", "normal")
    assert critical[0] == 503 and critical[1]["x-ballast-shed"] == "critical"
    assert "x-ballast-serve-stale" not in critical[1]
    for tier in ("critical", "normal", "background"):
        assert f"cluster.shop.{tier}.upstream_rq_pending_overflow: 1" in stats, stats


@pytest.mark.envoy
def test_a_queued_request_is_bounded_by_the_route_timeout_not_the_queue_timeout() -> None:
    """Envoy has no timeout for a request waiting in a cluster's pending queue: it waits until
    the route timeout (queue_timeout + read_timeout x (retries + 1)) or until the attempt ahead
    of it ends. Here queue_timeout 100 ms and read_timeout 1 s: the request ahead times out
    after 1 s (its per-try timeout), the queued one then reaches the held origin and is
    answered 504 at its route's 1.1 s, never after 100 ms."""
    import time

    find_envoy()
    with held_origins("origin") as origins:
        origin = origins["origin"]
        listen = free_port()
        desired = overflow_fleet(origin.port, listen)
        group = desired.group("shop")
        tiers = tuple(replace(t, queue_timeout_ms=100, read_timeout_ms=1000)
                      for t in group.tiers)
        desired = replace(desired, origin_groups=(replace(group, tiers=tiers),))
        bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(), ONE_HOST))
        admin_port = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
        with EnvoyProcess(bootstrap, admin_port) as envoy:
            envoy.wait_ready()
            origin.hold()
            first: list[tuple[int, dict]] = []
            thread = threading.Thread(target=lambda: first.append(fetch(listen, "/api/checkout")))
            thread.start()
            origin.wait_held(1)
            started = time.monotonic()
            queued = fetch(listen, "/api/checkout")
            waited = time.monotonic() - started
            origin.release()
            thread.join(timeout=10)
    assert queued[0] == 504, queued
    assert 1.0 <= waited < 2.5, waited  # the attempt ahead / the route, not the 100 ms
