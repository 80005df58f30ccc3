"""Static bootstraps: what `envoy --mode validate` (real Envoy 1.40) says about a PoP's config."""

from __future__ import annotations

import pytest

from control_plane.cli.envoy_validate import find_envoy, validate_bootstrap
from control_plane.desired import load_desired
from control_plane.desired.model import TierActions
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.models import example_desired


def test_eds_becomes_static_with_inlined_endpoints_and_routes() -> None:
    bootstrap = static_bootstrap(translate_pop(example_desired(), "sjc", Capabilities()))
    assert bootstrap["node"]["locality"] == {"zone": "sjc"}
    assert bootstrap["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 0,
    }
    clusters = bootstrap["static_resources"]["clusters"]
    assert [c["name"] for c in clusters] == [
        "shop.critical", "shop.normal", "shop.background", "shop.mirror-primary"]  # sjc's standby
    for cluster in clusters:
        assert cluster["type"] == "STATIC"
        assert "eds_cluster_config" not in cluster
        assert cluster["load_assignment"]["cluster_name"] == cluster["name"]
    for cluster in clusters[:3]:
        assert cluster["queuing_policies"]["pending_rq_policy"]["name"] == "envoy.queue_policy.fifo"
    (listener,) = bootstrap["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert "rds" not in hcm
    assert hcm["route_config"]["name"] == "edge"
    assert hcm["route_config"]["virtual_hosts"][0]["routes"][-1]["name"] == "default"


@pytest.mark.envoy
@pytest.mark.parametrize("pop", ["ewr", "sjc"])
def test_real_envoy_accepts_every_pop_with_fifo(pop: str) -> None:
    find_envoy()
    ok, output = validate_bootstrap(
        static_bootstrap(translate_pop(example_desired(), pop, Capabilities()))
    )
    assert ok, output
    assert "OK" in output


@pytest.mark.envoy
def test_real_envoy_1_40_rejects_adaptive_lifo_so_field_62_reaches_it() -> None:
    find_envoy()
    ok, output = validate_bootstrap(
        static_bootstrap(translate_pop(example_desired(), "ewr", Capabilities(True)))
    )
    assert not ok
    assert "envoy.extensions.queue_policy.adaptive_lifo.v3.AdaptiveLifoQueuePolicyConfig" in output


@pytest.mark.envoy
def test_real_envoy_accepts_a_weight_of_zero() -> None:
    find_envoy()
    weights = {"shop": {"primary": 0, "secondary": 100}}
    ok, output = validate_bootstrap(
        static_bootstrap(translate_pop(example_desired(), "ewr", Capabilities(),
                                       PopIntent(weights=weights)))
    )
    assert ok, output


@pytest.mark.envoy
@pytest.mark.parametrize(
    "actions",
    [TierActions(), TierActions(shed_tier=None, demote_share=100)],
    ids=["demote-half-and-shed", "demote-all"],
)
def test_real_envoy_accepts_tier_actions_of_the_example(actions: TierActions) -> None:
    find_envoy()
    desired = load_desired("examples/desired.yaml")
    assert desired.group("shop").tier_actions.actions() == TierActions()
    ok, output = validate_bootstrap(
        static_bootstrap(translate_pop(desired, "ewr", Capabilities(),
                                       PopIntent(tier_actions={"shop": actions})))
    )
    assert ok, output
