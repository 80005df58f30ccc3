"""Endpoints: one locality per origin (zone = origin), weighted by the PoP's current weights."""

from __future__ import annotations

import re

import pytest

from control_plane.translate import PopIntent, WeightsError, translate_pop
from control_plane.translate.mirror import is_mirror_cluster
from control_plane.translate.resources import ENDPOINT_TYPE, Capabilities
from harness.models import example_desired


def localities(pop: str, weights: dict) -> dict[str, list[tuple[str, int | None, int]]]:
    resources = translate_pop(example_desired(), pop, Capabilities(), PopIntent(weights=weights))
    return {
        name: [
            (
                locality.locality.zone,
                locality.load_balancing_weight.value
                if locality.HasField("load_balancing_weight")
                else None,
                locality.priority,
            )
            for locality in resource.message.endpoints
        ]
        for name, resource in resources.of_type(ENDPOINT_TYPE).items()
        if not is_mirror_cluster(name)  # mirror clusters: tests/test_translate_mirror.py
    }


def test_initial_weights_follow_each_pops_preference() -> None:
    ewr = localities("ewr", {})
    sjc = localities("sjc", {})
    assert set(ewr) == {"shop.critical", "shop.normal", "shop.background"}
    assert ewr["shop.critical"] == [("primary", 95, 0), ("secondary", 5, 0)]
    assert sjc["shop.critical"] == [("primary", 5, 0), ("secondary", 95, 0)]


def test_given_weights_land_on_every_tier_cluster() -> None:
    got = localities("ewr", {"shop": {"primary": 60, "secondary": 40}})
    for cluster in got.values():
        assert cluster == [("primary", 60, 0), ("secondary", 40, 0)]


def test_weight_zero_keeps_the_locality_without_a_weight() -> None:
    got = localities("ewr", {"shop": {"primary": 0, "secondary": 100}})
    assert got["shop.normal"] == [("primary", None, 0), ("secondary", 100, 0)]


def test_endpoint_addresses_and_cluster_names() -> None:
    resources = translate_pop(example_desired(), "ewr", Capabilities())
    cla = resources.of_type(ENDPOINT_TYPE)["shop.background"].message
    assert cla.cluster_name == "shop.background"
    addresses = [
        (lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value)
        for locality in cla.endpoints
        for lb in locality.lb_endpoints
    ]
    assert addresses == [("127.0.0.1", 8081), ("127.0.0.1", 8082)]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"shop": {"primary": 80, "secondary": 30}}, "shop: weights sum to 110, not 100"),
        ({"shop": {"primary": 100}}, "shop: no weight for secondary"),
        ({"shop": {"primary": 90, "tertiary": 10}}, "has no origin(s) tertiary"),
        ({"shop": {"primary": 110, "secondary": -10}}, "negative weight for secondary"),
        ({"cart": {"a": 100}}, "unknown origin group(s) cart"),
    ],
)
def test_weights_that_do_not_fit_are_refused(weights: dict, message: str) -> None:
    with pytest.raises(WeightsError, match=re.escape(message)):
        translate_pop(example_desired(), "ewr", Capabilities(), PopIntent(weights=weights))
