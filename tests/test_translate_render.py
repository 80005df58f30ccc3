"""JSON rendering (field 62 included) and determinism of the translation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.desired.model import TierActions
from control_plane.translate import PopIntent, render_json, translate_pop
from control_plane.translate.diff import diff_renderings
from control_plane.translate.render import render_differing
from control_plane.translate.resources import PUSH_ORDER, Capabilities, PopResources
from harness.models import example_desired, shop_group


def test_render_groups_resources_by_kind_and_shows_field_62() -> None:
    rendered = render_json(translate_pop(example_desired(), "ewr", Capabilities(True)))
    assert {k: list(v) for k, v in rendered.items()} == {
        "clusters": ["shop.critical", "shop.normal", "shop.background", "shop.mirror-secondary"],
        "endpoints": ["shop.critical", "shop.normal", "shop.background", "shop.mirror-secondary"],
        "listeners": ["edge"],
        "routes": ["edge"],
        "runtime": ["ballast_tiers"],
    }
    critical = rendered["clusters"]["shop.critical"]
    assert critical["queuing_policies"] == {
        "pending_rq_policy": {
            "name": "envoy.queue_policy.adaptive_lifo",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.queue_policy.adaptive_lifo.v3."
                "AdaptiveLifoQueuePolicyConfig",
                "high_watermark": 80,
                "low_watermark": 60,
            },
        }
    }
    assert critical["connect_timeout"] == "0.300s"
    assert critical["circuit_breakers"]["thresholds"][0]["max_pending_requests"] == 2000
    json.dumps(rendered)


def test_render_fifo_for_nodes_without_adaptive_lifo() -> None:
    rendered = render_json(translate_pop(example_desired(), "ewr", Capabilities()))
    assert rendered["clusters"]["shop.normal"]["queuing_policies"] == {
        "pending_rq_policy": {
            "name": "envoy.queue_policy.fifo",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.queue_policy.fifo.v3."
                "FifoQueuePolicyConfig"
            },
        }
    }


@settings(max_examples=25, deadline=None)
@given(
    primary=st.integers(min_value=0, max_value=100),
    pop=st.sampled_from(["ewr", "sjc"]),
    lifo=st.booleans(),
)
def test_same_input_same_bytes_and_versions(primary: int, pop: str, lifo: bool) -> None:
    weights = {"shop": {"primary": primary, "secondary": 100 - primary}}
    first = translate_pop(example_desired(), pop, Capabilities(lifo), PopIntent(weights=weights))
    second = translate_pop(example_desired(), pop, Capabilities(lifo),
                           PopIntent(weights=dict(weights)))
    for type_url in PUSH_ORDER:
        a, b = first.of_type(type_url), second.of_type(type_url)
        assert [(n, r.payload, r.version) for n, r in a.items()] == [
            (n, r.payload, r.version) for n, r in b.items()
        ]
        assert first.type_version(type_url) == second.type_version(type_url)


def test_a_weight_change_changes_only_endpoint_versions() -> None:
    before = translate_pop(example_desired(), "ewr", Capabilities())
    after = translate_pop(example_desired(), "ewr", Capabilities(),
                          PopIntent(weights={"shop": {"primary": 70, "secondary": 30}}))
    for type_url in PUSH_ORDER:
        same = before.type_version(type_url) == after.type_version(type_url)
        assert same == (type_url != PUSH_ORDER[1])


def test_capabilities_change_only_cluster_versions() -> None:
    fifo = translate_pop(example_desired(), "ewr", Capabilities(False))
    lifo = translate_pop(example_desired(), "ewr", Capabilities(True))
    changed = [t for t in PUSH_ORDER if fifo.type_version(t) != lifo.type_version(t)]
    assert changed == [PUSH_ORDER[0]]


@pytest.mark.parametrize("edit", ["weights", "tier actions", "desired state", "PoP gone"])
def test_a_diff_of_what_differs_is_the_diff_of_the_full_renderings(edit: str) -> None:
    """`render_differing` leaves out what both sides hold at the same version: the diff of
    the two is the diff of the full renderings, whatever changed."""
    desired = example_desired()
    old = translate_pop(desired, "ewr", Capabilities())
    new: PopResources | None = {
        "weights": lambda: translate_pop(desired, "ewr", Capabilities(), PopIntent(
            weights={"shop": {"primary": 70, "secondary": 30}})),
        "tier actions": lambda: translate_pop(desired, "ewr", Capabilities(), PopIntent(
            tier_actions={"shop": TierActions()})),
        "desired state": lambda: translate_pop(example_desired(replace(
            shop_group(), max_origin_concurrency=60)), "ewr", Capabilities()),
        "PoP gone": lambda: None,
    }[edit]()
    full = diff_renderings(render_json(old), {} if new is None else render_json(new))
    assert full
    assert diff_renderings(*render_differing(old, new)) == full
