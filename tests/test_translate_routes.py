"""Listener and routes: classification order, default catch-all last, per-tier timeouts/retries."""

from __future__ import annotations

import dataclasses

from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)

from control_plane.translate import translate_pop
from control_plane.translate.resources import LISTENER_TYPE, ROUTE_TYPE, Capabilities
from harness.models import example_desired


def route_config(pop: str = "ewr") -> RouteConfiguration:
    resources = translate_pop(example_desired(), pop, Capabilities())
    return resources.of_type(ROUTE_TYPE)["edge"].message


def listener(pop: str) -> Listener:
    resources = translate_pop(example_desired(), pop, Capabilities())
    return resources.of_type(LISTENER_TYPE)["edge"].message


def test_rules_in_order_then_default_tier_catch_all() -> None:
    (vhost,) = route_config().virtual_hosts
    assert vhost.name == "shop"
    assert list(vhost.domains) == ["*"]
    got = [(r.name, r.match.prefix, r.route.cluster) for r in vhost.routes]
    assert got == [
        ("checkout", "/api/checkout", "shop.critical"),
        ("auth", "/auth", "shop.critical"),
        ("prefetch", "/", "shop.background"),
        ("x-prefetch", "/", "shop.normal"),
        ("bots", "/", "shop.background"),
        ("next-image", "/_next/image", "shop.background"),
        ("default", "/", "shop.critical"),
    ]
    assert len(vhost.routes[-1].match.headers) == 0


def test_header_matchers() -> None:
    routes = {r.name: r for r in route_config().virtual_hosts[0].routes}
    (purpose,) = routes["prefetch"].match.headers
    assert (purpose.name, purpose.string_match.exact) == ("purpose", "prefetch")
    (agent,) = routes["bots"].match.headers
    assert (agent.name, agent.string_match.contains) == ("user-agent", "bot")
    assert len(routes["checkout"].match.headers) == 0


def test_timeouts_retries_and_backoff_per_tier() -> None:
    by_cluster = {}
    for route in route_config().virtual_hosts[0].routes:
        action = route.route
        policy = action.retry_policy
        by_cluster[action.cluster] = (
            action.timeout.ToMilliseconds(),
            policy.per_try_timeout.ToMilliseconds(),
            policy.num_retries.value,
            policy.retry_on,
            list(policy.retriable_status_codes),
        )
        assert policy.retry_back_off.base_interval.ToMilliseconds() == 25
        assert policy.retry_back_off.max_interval.ToMilliseconds() == 250
        assert policy.retry_host_predicate[0].name == "envoy.retry_host_predicates.previous_hosts"
    # timeout = queue_timeout + read_timeout x (retries + 1); background (retries 0) gets one
    # retry of an attempt no origin served, and only of that
    unserved = "connect-failure,refused-stream,reset-before-request,retriable-status-codes"
    assert by_cluster == {
        "shop.critical": (800 + 2000 * 3, 2000, 2, "5xx,connect-failure,reset", []),
        "shop.normal": (1500 + 4000 * 2, 4000, 1, "5xx,connect-failure,reset", []),
        "shop.background": (3000 + 8000 * 1, 8000, 1, unserved, [503]),
    }


def test_a_tier_without_retries_in_a_group_of_one_origin_has_none() -> None:
    """No other origin to send an unserved attempt to: a retry would ask the one that declined."""
    desired = example_desired()
    (group,) = desired.origin_groups
    one = dataclasses.replace(group, origins=group.origins[:1],
                              preference={pop: (group.origins[0].name,) for pop in ("ewr", "sjc")})
    desired = dataclasses.replace(desired, origin_groups=(one,))
    resources = translate_pop(desired, "ewr", Capabilities())
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    by_cluster = {r.route.cluster: r.route.retry_policy for r in vhost.routes}
    background = by_cluster["shop.background"]
    assert (background.num_retries.value, background.retry_on) == (0, "5xx,connect-failure,reset")
    assert list(background.retriable_status_codes) == []
    assert by_cluster["shop.normal"].num_retries.value == 1


def test_every_route_tags_the_tier_toward_the_origin() -> None:
    for route in route_config().virtual_hosts[0].routes:
        (header,) = route.request_headers_to_add
        assert header.header.key == "x-ballast-tier"
        assert route.route.cluster == f"shop.{header.header.value}"
        assert header.append_action == header.OVERWRITE_IF_EXISTS_OR_ADD


def test_listener_address_port_offset_and_rds_over_ads() -> None:
    ewr, sjc = listener("ewr"), listener("sjc")
    assert ewr.name == "edge"
    assert ewr.address.socket_address.address == "127.0.0.1"
    assert ewr.address.socket_address.port_value == 10000
    assert sjc.address.socket_address.port_value == 10001
    (chain,) = ewr.filter_chains
    (hcm_filter,) = chain.filters
    hcm = HttpConnectionManager()
    assert hcm_filter.typed_config.Unpack(hcm)
    assert hcm.stat_prefix == "edge"
    assert hcm.rds.route_config_name == "edge"
    assert hcm.rds.config_source.HasField("ads")
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]


def test_trusted_sources_get_their_own_chain_and_routes_that_believe_the_tier_header() -> None:
    desired = dataclasses.replace(example_desired(),
                                  trusted_priority_sources=("10.1.0.0/16", "127.0.0.2/32"))
    resources = translate_pop(desired, "ewr", Capabilities())
    routes = resources.of_type(ROUTE_TYPE)
    assert sorted(routes) == ["edge", "edge.trusted"]
    trusted_chain, plain_chain = resources.of_type(LISTENER_TYPE)["edge"].message.filter_chains
    ranges = [(r.address_prefix, r.prefix_len.value)
              for r in trusted_chain.filter_chain_match.source_prefix_ranges]
    assert ranges == [("10.1.0.0", 16), ("127.0.0.2", 32)]
    assert not plain_chain.HasField("filter_chain_match")
    names = []
    for chain in (trusted_chain, plain_chain):
        hcm = HttpConnectionManager()
        assert chain.filters[0].typed_config.Unpack(hcm)
        names.append(hcm.rds.route_config_name)
    assert names == ["edge.trusted", "edge"]

    (vhost,) = routes["edge.trusted"].message.virtual_hosts
    first = [(r.name, [(h.name, h.string_match.exact) for h in r.match.headers], r.route.cluster)
             for r in vhost.routes[:3]]
    assert first == [
        ("trusted-critical", [("x-ballast-tier", "critical")], "shop.critical"),
        ("trusted-normal", [("x-ballast-tier", "normal")], "shop.normal"),
        ("trusted-background", [("x-ballast-tier", "background")], "shop.background"),
    ]
    (plain,) = routes["edge"].message.virtual_hosts
    assert [r.name for r in vhost.routes[3:]] == [r.name for r in plain.routes]
    assert not any(r.name.startswith("trusted-") for r in plain.routes)


def test_without_trusted_sources_one_chain_and_no_trusted_routes() -> None:
    resources = translate_pop(example_desired(), "ewr", Capabilities())
    assert list(resources.of_type(ROUTE_TYPE)) == ["edge"]
    (chain,) = resources.of_type(LISTENER_TYPE)["edge"].message.filter_chains
    assert not chain.HasField("filter_chain_match")


def test_hedging_tier_gets_envoys_hedge_policy_and_the_delay_as_per_try_timeout() -> None:
    desired = example_desired()
    (group,) = desired.origin_groups
    tiers = tuple(dataclasses.replace(t, hedge_delay_ms=50) if t.name == "critical" else t
                  for t in group.tiers)
    desired = dataclasses.replace(desired, origin_groups=(dataclasses.replace(group, tiers=tiers),))
    resources = translate_pop(desired, "ewr", Capabilities())
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    assert vhost.include_request_attempt_count
    by_cluster = {r.route.cluster: r.route for r in vhost.routes}
    critical, normal = by_cluster["shop.critical"], by_cluster["shop.normal"]
    assert critical.hedge_policy.hedge_on_per_try_timeout
    policy = critical.retry_policy
    assert policy.per_try_timeout.ToMilliseconds() == 50
    assert policy.per_try_idle_timeout.ToMilliseconds() == 2000  # the read timeout
    assert policy.num_retries.value == 2
    assert policy.host_selection_retry_max_attempts == 100
    assert not normal.HasField("hedge_policy")
    assert normal.retry_policy.per_try_timeout.ToMilliseconds() == 4000
    assert not normal.retry_policy.HasField("per_try_idle_timeout")
    assert normal.retry_policy.host_selection_retry_max_attempts == 100  # every tier


def _hedging_desired():  # type: ignore[no-untyped-def]
    desired = example_desired()
    (group,) = desired.origin_groups
    tiers = tuple(dataclasses.replace(t, hedge_delay_ms=50) if t.name == "critical" else t
                  for t in group.tiers)
    return dataclasses.replace(desired, origin_groups=(dataclasses.replace(group, tiers=tiers),))


def test_a_guarded_hedge_share_splits_each_hedging_route() -> None:
    """Hedges respect the ramp (issue 33): `share` per million of a hedging route's requests
    keep the hedge (a `-hedged` copy before the route), the rest wait for their attempt."""
    from control_plane.translate import PopIntent

    desired = _hedging_desired()
    plain = translate_pop(desired, "ewr", Capabilities())
    resources = translate_pop(desired, "ewr", Capabilities(), PopIntent(hedges={"shop": 52_631}))
    (before,) = plain.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    names = [r.name for r in vhost.routes]
    hedging = [r.name for r in before.routes if r.route.HasField("hedge_policy")]
    assert hedging and len(names) == len(before.routes) + len(hedging)
    for name in hedging:
        copy = vhost.routes[names.index(f"{name}-hedged")]
        base = vhost.routes[names.index(name)]
        assert names.index(f"{name}-hedged") + 1 == names.index(name)
        assert copy.match.runtime_fraction.default_value.numerator == 52_631
        assert copy.match.runtime_fraction.default_value.denominator == 2  # MILLION
        assert copy.route.hedge_policy.hedge_on_per_try_timeout
        assert copy.route.retry_policy.per_try_timeout.ToMilliseconds() == 50
        assert not base.route.HasField("hedge_policy")
        assert base.route.retry_policy.per_try_timeout.ToMilliseconds() == 2000
        assert not base.route.retry_policy.HasField("per_try_idle_timeout")
        assert base.route.retry_policy.retry_host_predicate  # retries still leave the origin
        assert not base.match.HasField("runtime_fraction")
    for route in vhost.routes:
        if route.name not in hedging and not route.name.endswith("-hedged"):
            assert route in before.routes
    none = translate_pop(desired, "ewr", Capabilities(), PopIntent(hedges={"shop": 0}))
    (off,) = none.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    assert not any(r.route.HasField("hedge_policy") for r in off.routes)
    assert len(off.routes) == len(before.routes)
