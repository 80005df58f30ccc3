"""Cluster field 62: adaptive LIFO with the seed's watermarks for nodes that have it, else FIFO."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.core.v3.base_pb2 import Node
from google.protobuf.json_format import ParseDict

from control_plane.desired.model import QueuePolicy
from control_plane.gen.ballast.v1.queue_policy_pb2 import (
    AdaptiveLifoQueuePolicyConfig,
    ClusterQueuingPoliciesCarrier,
)
from control_plane.translate import capabilities_from_node, translate_pop
from control_plane.translate.mirror import is_mirror_cluster
from control_plane.translate.queue_policy import (
    ADAPTIVE_LIFO_TYPE,
    FIFO_TYPE,
    QUEUING_POLICIES_FIELD,
    read_back,
)
from control_plane.translate.resources import CLUSTER_TYPE, Capabilities, PopResources
from harness.models import example_desired, shop_group

ENVOY_1_40_NODE = Path(__file__).parent / "fixtures" / "envoy-1.40-node.json"


def envoy_1_40_node() -> Node:
    return ParseDict(json.loads(ENVOY_1_40_NODE.read_text()), Node(), ignore_unknown_fields=True)


def policies(resources: PopResources) -> dict[str, ClusterQueuingPoliciesCarrier]:
    """Field 62 of each tier cluster (mirror clusters carry no queue policy)."""
    return {
        name: read_back(resource.payload)
        for name, resource in resources.of_type(CLUSTER_TYPE).items()
        if not is_mirror_cluster(name)
    }


def test_node_advertising_adaptive_lifo_gets_it_with_watermarks() -> None:
    node = envoy_1_40_node()
    node.extensions.add(name="envoy.queue_policy.adaptive_lifo", category="envoy.queue_policy")
    resources = translate_pop(example_desired(), "ewr", capabilities_from_node(node))
    for carrier in policies(resources).values():
        policy = carrier.queuing_policies.pending_rq_policy
        assert policy.name == "envoy.queue_policy.adaptive_lifo"
        assert policy.typed_config.type_url == (
            "type.googleapis.com/envoy.extensions.queue_policy.adaptive_lifo.v3."
            "AdaptiveLifoQueuePolicyConfig"
        )
        config = AdaptiveLifoQueuePolicyConfig()
        config.ParseFromString(policy.typed_config.value)
        assert (config.high_watermark, config.low_watermark) == (80, 60)
    assert resources.notes == ()


def test_envoy_1_40_real_extension_list_gets_fifo_and_notes() -> None:
    caps = capabilities_from_node(envoy_1_40_node())
    resources = translate_pop(example_desired(), "ewr", caps)
    for carrier in policies(resources).values():
        policy = carrier.queuing_policies.pending_rq_policy
        assert policy.name == "envoy.queue_policy.fifo"
        assert policy.typed_config.type_url == FIFO_TYPE
        assert policy.typed_config.value == b""
    assert resources.notes == tuple(
        f"shop.{tier}: adaptive_lifo requested, node lacks envoy.queue_policy.adaptive_lifo: "
        "FIFO sent"
        for tier in ("critical", "normal", "background")
    )


def test_tier_asking_for_fifo_gets_fifo_without_a_note() -> None:
    group = shop_group()
    fifo = QueuePolicy(kind="fifo")
    tiers = tuple(dataclasses.replace(t, queue_policy=fifo) for t in group.tiers)
    desired = example_desired(dataclasses.replace(group, tiers=tiers))
    resources = translate_pop(desired, "ewr", Capabilities(adaptive_lifo=True))
    types = {
        c.queuing_policies.pending_rq_policy.typed_config.type_url
        for c in policies(resources).values()
    }
    assert types == {FIFO_TYPE}
    assert resources.notes == ()


def test_field_62_is_on_the_wire_and_survives_a_cluster_round_trip() -> None:
    resources = translate_pop(example_desired(), "ewr", Capabilities(adaptive_lifo=True))
    resource = resources.of_type(CLUSTER_TYPE)["shop.critical"]
    reparsed = Cluster()
    reparsed.ParseFromString(resource.payload)
    assert reparsed.name == "shop.critical"
    again = reparsed.SerializeToString(deterministic=True)
    assert again == resource.payload
    assert resource.message.SerializeToString(deterministic=True) == resource.payload
    carrier = read_back(again)
    assert carrier.queuing_policies.pending_rq_policy.typed_config.type_url == ADAPTIVE_LIFO_TYPE
    assert ClusterQueuingPoliciesCarrier.DESCRIPTOR.fields_by_name["queuing_policies"].number == 62


def test_the_carrier_field_is_envoy_140s_queuing_policies() -> None:
    assert QUEUING_POLICIES_FIELD == 62  # envoy.config.cluster.v3.Cluster.queuing_policies
