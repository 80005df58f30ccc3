"""Tier actions in the routes and the runtime layer: demotion as weighted_clusters (or, into a
shed tier, the demoted share answered at the edge), a shed tier at its floor."""

from __future__ import annotations

from dataclasses import replace

import pytest
from envoy.config.route.v3.route_components_pb2 import Route

from control_plane.desired.model import TierActions
from control_plane.translate import PopIntent, translate_pop
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    ROUTE_TYPE,
    RUNTIME_TYPE,
    Capabilities,
)
from control_plane.translate.routes import shed_of_route
from control_plane.xds_port.server import intent_and_cache
from harness.intent_changes import set_tier_actions
from harness.models import example_desired, shop_group


def routes(pop: str = "ewr", actions: dict[str, TierActions] | None = None) -> dict[str, Route]:
    resources = translate_pop(example_desired(), pop, Capabilities(),
                              PopIntent(tier_actions=actions or {}))
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    return {route.name: route for route in vhost.routes}


def headers(options: object) -> dict[str, str]:
    return {option.header.key: option.header.value for option in options}  # type: ignore[attr-defined]


def test_without_actions_nothing_changes() -> None:
    assert routes() == routes(actions={})
    for route in routes().values():
        assert route.WhichOneof("action") == "route"
        assert route.route.WhichOneof("cluster_specifier") == "cluster"


DEMOTE_ONLY = TierActions(shed_tier=None)  # demote 50 % of normal into background, not shed


def layer(actions: dict[str, TierActions] | None = None) -> dict[str, float]:
    resources = translate_pop(example_desired(), "ewr", Capabilities(),
                              PopIntent(tier_actions=actions or {}))
    return dict(resources.of_type(RUNTIME_TYPE)["ballast_tiers"].message.layer)


def test_demotion_splits_the_normal_routes_and_keeps_their_timeouts() -> None:
    before, after = routes()["x-prefetch"], routes(actions={"shop": DEMOTE_ONLY})["x-prefetch"]
    split = after.route.weighted_clusters.clusters
    assert [(c.name, c.weight.value) for c in split] == [
        ("shop.normal", 50), ("shop.background", 50)
    ]
    assert headers(split[0].request_headers_to_add) == {"x-ballast-tier": "normal"}
    assert headers(split[1].request_headers_to_add) == {
        "x-ballast-tier": "background", "x-ballast-demoted-from": "normal"
    }
    assert not after.request_headers_to_add  # a route-level tier header would override both
    assert after.route.timeout == before.route.timeout
    assert after.route.retry_policy == before.route.retry_policy


def test_a_demoted_share_is_answered_at_the_edge_while_its_target_is_shed() -> None:
    """The tiers source's defaults (demote 50 % of normal, shed background): background's pool is
    at its floor, so the demoted half of normal is answered at once, the other half stays normal."""
    after = routes(actions={"shop": TierActions()})
    names = list(after)
    assert names.index("x-prefetch@shed/shop/normal") == names.index("x-prefetch") - 1
    shed = after["x-prefetch@shed/shop/normal"]
    assert shed_of_route(shed.name) == ("shop", "normal")  # the access log names its tier
    assert shed.match.headers == routes()["x-prefetch"].match.headers
    fraction = shed.match.runtime_fraction
    assert (fraction.default_value.numerator, fraction.runtime_key) == (
        50, "ballast.demoted_shed.shop.normal")
    assert shed.direct_response.status == 503
    assert headers(shed.response_headers_to_add) == {"retry-after": "60",
                                                     "x-ballast-shed": "normal"}
    assert after["x-prefetch"] == routes()["x-prefetch"]  # the rest: its own pool, as before
    for name in ("prefetch", "bots", "next-image", "checkout", "auth", "default"):
        assert after[name] == routes()[name], name  # shedding leaves the routes alone


def test_a_shed_tier_keeps_its_floor_in_the_runtime_layer() -> None:
    """Background shed: its limit and its queue are its floor (5 % of 120 = 6, here its whole
    share), so what finds them busy is answered at once with its shed_action."""
    assert layer() == {}
    assert layer({"shop": TierActions()}) == {
        "circuit_breakers.shop.background.default.max_connections": 6,
        "circuit_breakers.shop.background.default.max_requests": 6,
        "circuit_breakers.shop.background.default.max_pending_requests": 6,
    }
    # a floor of 0 (min_share 0) sheds the tier entirely
    group = replace(shop_group(), tiers=tuple(
        replace(t, min_share_percent=0) if t.name == "background" else t
        for t in shop_group().tiers))
    resources = translate_pop(example_desired(group), "ewr", Capabilities(),
                              PopIntent(tier_actions={"shop": TierActions()}))
    values = dict(resources.of_type(RUNTIME_TYPE)["ballast_tiers"].message.layer)
    assert {k.rsplit(".", 1)[1]: v for k, v in values.items()} == {
        "max_connections": 0, "max_requests": 0, "max_pending_requests": 0}


def test_each_action_can_be_off() -> None:
    only_shed = routes(actions={"shop": TierActions(demote_tier=None, demote_to=None,
                                                    demote_share=0)})
    assert only_shed == routes()
    only_demote = routes(actions={"shop": TierActions(shed_tier=None, demote_share=100)})
    assert only_demote["prefetch"] == routes()["prefetch"]
    split = only_demote["x-prefetch"].route.weighted_clusters.clusters
    assert [(c.name, c.weight.value) for c in split] == [("shop.background", 100)]


def test_clusters_and_endpoints_stay_and_other_pops_are_untouched() -> None:
    desired = example_desired()
    plain = translate_pop(desired, "ewr", Capabilities())
    acting = translate_pop(desired, "ewr", Capabilities(),
                           PopIntent(tier_actions={"shop": TierActions()}))
    for kind in (CLUSTER_TYPE, ENDPOINT_TYPE):
        assert plain.type_version(kind) == acting.type_version(kind)
    assert plain.type_version(ROUTE_TYPE) != acting.type_version(ROUTE_TYPE)
    assert plain.type_version(RUNTIME_TYPE) != acting.type_version(RUNTIME_TYPE)


def test_unknown_tier_in_actions_is_refused() -> None:
    with pytest.raises(ValueError, match="name tier 'bulk'"):
        routes(actions={"shop": TierActions(shed_tier="bulk")})


async def test_intent_owner_sets_actions_for_one_pop_and_pushes_it() -> None:
    intent, cache = intent_and_cache(example_desired())
    for pop in ("ewr", "sjc"):
        cache.resources(pop, Capabilities())
    announced: list[frozenset[str]] = []
    cache.add_listener(announced.append)
    sjc_before = cache.resources("sjc", Capabilities())
    translations = cache.translations
    assert await set_tier_actions(intent, "ewr", "shop", TierActions()) is True
    assert announced == [frozenset({"ewr"})]
    assert cache.translations == translations + 1  # only ewr re-translated
    assert intent.tier_actions("ewr", "shop") == TierActions()
    assert intent.tier_actions("sjc", "shop") is None
    assert cache.resources("sjc", Capabilities()) is sjc_before
    ewr = cache.resources("ewr", Capabilities()).of_type(ROUTE_TYPE)["edge"].message
    shed = {r.name: r for r in ewr.virtual_hosts[0].routes}["x-prefetch@shed/shop/normal"]
    assert shed.direct_response.status == 503
    assert await set_tier_actions(intent, "ewr", "shop", TierActions()) is False  # same: no push
    assert await set_tier_actions(intent, "ewr", "shop", None) is True
    assert announced == [frozenset({"ewr"})] * 2
    with pytest.raises(ValueError):
        await set_tier_actions(intent, "ewr", "shop", TierActions(demote_to="bulk"))
    assert intent.tier_actions("ewr", "shop") is None


@pytest.mark.parametrize(
    ("action", "status", "extra"),
    [
        ("reject", 503, {}),
        ("defer", 202, {}),
        ("stale", 503, {"x-ballast-serve-stale": "1", "cache-control": "no-store"}),
    ],
)
def test_each_shed_action_of_a_demoted_share(
    action: str, status: int, extra: dict[str, str]
) -> None:
    group = replace(shop_group(), tiers=tuple(
        replace(t, shed_action=action) if t.name == "normal" else t
        for t in shop_group().tiers))
    resources = translate_pop(example_desired(group), "ewr", Capabilities(),
                              PopIntent(tier_actions={"shop": TierActions()}))
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    route = {r.name: r for r in vhost.routes}["x-prefetch@shed/shop/normal"]
    assert route.direct_response.status == status
    assert headers(route.response_headers_to_add) == {
        "retry-after": "60", "x-ballast-shed": "normal", **extra
    }
    assert {r.name: r for r in vhost.routes}["prefetch"].WhichOneof("action") == "route"


def test_lent_limits_travel_as_runtime_overrides_and_never_touch_the_clusters() -> None:
    actions = TierActions(demote_tier=None, demote_to=None, demote_share=0, shed_tier=None,
                          limits=(("background", 57),))
    plain = translate_pop(example_desired(), "ewr", Capabilities())
    lent = translate_pop(example_desired(), "ewr", Capabilities(),
                         PopIntent(tier_actions={"shop": actions}), previous=plain)
    assert dict(plain.of_type(RUNTIME_TYPE)["ballast_tiers"].message.layer) == {}
    assert dict(lent.of_type(RUNTIME_TYPE)["ballast_tiers"].message.layer) == {
        "circuit_breakers.shop.background.default.max_connections": 57,
        "circuit_breakers.shop.background.default.max_requests": 57,
    }
    for name, cluster in plain.of_type(CLUSTER_TYPE).items():  # no cluster rebuilt
        assert lent.of_type(CLUSTER_TYPE)[name] is cluster
    full = translate_pop(example_desired(), "ewr", Capabilities(),
                         PopIntent(tier_actions={"shop": actions}))
    assert full.of_type(RUNTIME_TYPE)["ballast_tiers"].payload == lent.of_type(
        RUNTIME_TYPE)["ballast_tiers"].payload
