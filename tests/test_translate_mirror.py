"""The cache-warming mirror in the translation (`translate/mirror.py`): a mirror cluster per standby
that targets only that origin, always there; GET/HEAD copies of the cacheable routes with the
mirror policy only while a mirror is set."""

from __future__ import annotations

from dataclasses import replace

from control_plane.desired.model import Mirror, StandbyRampPolicy, TierActions
from control_plane.translate import PopIntent, translate_pop
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    ROUTE_TYPE,
    Capabilities,
    PopResources,
)
from harness.demo_origin import is_shadow_host
from harness.models import example_desired, shop_group

MIRROR = Mirror(("secondary",), 5.0)


def routes(resources: PopResources) -> list:
    (vhost,) = resources.of_type(ROUTE_TYPE)["edge"].message.virtual_hosts
    return list(vhost.routes)


def test_one_mirror_cluster_per_standby_targeting_only_that_origin() -> None:
    ewr = translate_pop(example_desired(), "ewr", Capabilities())
    sjc = translate_pop(example_desired(), "sjc", Capabilities())
    assert [n for n in ewr.of_type(CLUSTER_TYPE) if "mirror" in n] == ["shop.mirror-secondary"]
    assert [n for n in sjc.of_type(CLUSTER_TYPE) if "mirror" in n] == ["shop.mirror-primary"]
    cla = ewr.of_type(ENDPOINT_TYPE)["shop.mirror-secondary"].message
    (locality,) = cla.endpoints
    (endpoint,) = locality.lb_endpoints
    assert endpoint.endpoint.address.socket_address.port_value == 8082  # secondary only
    assert not locality.locality.zone  # no zone stats: mirrored load stays out of the signals
    cluster = ewr.of_type(CLUSTER_TYPE)["shop.mirror-secondary"].message
    (threshold,) = cluster.circuit_breakers.thresholds
    assert (threshold.max_requests.value, threshold.max_retries.value) == (6, 0)  # background


def test_no_mirror_cluster_when_the_mirror_is_off() -> None:
    group = replace(shop_group(), standby_ramp=StandbyRampPolicy(mirror_percent=0))
    resources = translate_pop(example_desired(group), "ewr", Capabilities())
    assert not [n for n in resources.of_type(CLUSTER_TYPE) if "mirror" in n]


def test_an_active_mirror_precedes_each_route_with_a_get_head_copy() -> None:
    plain = translate_pop(example_desired(), "ewr", Capabilities())
    mirrored = translate_pop(example_desired(), "ewr", Capabilities(),
                             PopIntent(mirrors={"shop": MIRROR}))
    before, after = routes(plain), routes(mirrored)
    assert [r.name for r in after] == [n for r in before for n in (f"{r.name}-mirror", r.name)]
    for copy, original in zip(after[::2], after[1::2], strict=True):
        assert copy.route.cluster == original.route.cluster  # the client's answer: unchanged
        assert copy.match.headers[-1].name == ":method"
        assert copy.match.headers[-1].string_match.safe_regex.regex == "GET|HEAD"
        (policy,) = copy.route.request_mirror_policies
        assert policy.cluster == "shop.mirror-secondary"
        assert policy.runtime_fraction.default_value.numerator == 50_000  # per million
        assert not original.route.request_mirror_policies
    assert mirrored.of_type(CLUSTER_TYPE) == plain.of_type(CLUSTER_TYPE)  # routes only


def test_only_the_cacheable_routes_and_never_one_answered_at_the_edge() -> None:
    mirror = replace(MIRROR, routes=("auth", "default", "prefetch", "x-prefetch"))
    resources = translate_pop(example_desired(), "ewr", Capabilities(),
                              PopIntent(tier_actions={"shop": TierActions()},
                                        mirrors={"shop": mirror}))
    names = [r.name for r in routes(resources)]
    assert "auth-mirror" in names and "default-mirror" in names
    assert "checkout-mirror" not in names
    # background is shed but keeps its floor, so its requests still reach an origin: copied;
    # the demoted share of normal answered at the edge is never copied, the rest of it is
    assert "prefetch-mirror" in names
    assert names.index("x-prefetch@shed/shop/normal") < names.index("x-prefetch-mirror")
    assert not any(name.startswith("x-prefetch@shed/shop/normal-") for name in names)


def test_shadow_hosts_as_envoy_writes_them() -> None:
    assert is_shadow_host("127.0.0.1-shadow:10000")
    assert is_shadow_host("shop.example.com-shadow")
    assert not is_shadow_host("127.0.0.1:10000")
    assert not is_shadow_host("shadow.example.com")
