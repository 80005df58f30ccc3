"""Cluster field 62 (`queuing_policies`): the pending-request queue policy of a tier cluster.

xds-protos' Cluster has no field 62 yet (docs/architecture.md, "Queue policies"). Our
wire-compatible mirrors in `protos/ballast/v1/queue_policy.proto` build a
`ClusterQueuingPoliciesCarrier` holding only field 62; merging its bytes into a Cluster leaves
the field among the Cluster's unknown fields, which the upb runtime keeps and re-serializes.
Envoy picks the policy by the Any type URL, so the URLs below are Envoy's names, set by hand
(our messages live in package `ballast.v1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from google.protobuf.json_format import MessageToDict

from control_plane.desired.model import Tier
from control_plane.gen.ballast.v1.queue_policy_pb2 import (
    AdaptiveLifoQueuePolicyConfig,
    ClusterQueuingPoliciesCarrier,
    FifoQueuePolicyConfig,
)
from control_plane.translate.resources import (
    ADAPTIVE_LIFO_EXTENSION,
    FIFO_EXTENSION,
    Capabilities,
)

# envoy.config.cluster.v3.Cluster.queuing_policies (62 in Envoy 1.40); the .proto is the one place.
QUEUING_POLICIES_FIELD: int = ClusterQueuingPoliciesCarrier.DESCRIPTOR.fields_by_name[
    "queuing_policies"
].number
ADAPTIVE_LIFO_TYPE = (
    "type.googleapis.com/envoy.extensions.queue_policy.adaptive_lifo.v3."
    "AdaptiveLifoQueuePolicyConfig"
)
FIFO_TYPE = "type.googleapis.com/envoy.extensions.queue_policy.fifo.v3.FifoQueuePolicyConfig"


@dataclass(frozen=True)
class QueuePolicyChoice:
    """What a tier cluster gets on one node, and why it differs from the request, if it does."""

    carrier: ClusterQueuingPoliciesCarrier
    fallback_note: str | None


def choose_queue_policy(cluster_name: str, tier: Tier, caps: Capabilities) -> QueuePolicyChoice:
    """Adaptive LIFO when the tier asks for it and the node supports it; FIFO otherwise; no
    field 62 at all for a node that lists no queue policy (Envoy then queues FIFO)."""
    wanted = tier.queue_policy.kind
    if not caps.queue_policies:
        note = None
        if wanted == "adaptive_lifo":
            note = (
                f"{cluster_name}: adaptive_lifo requested, node lists no queue policy: "
                "field 62 not sent (Envoy queues FIFO)"
            )
        return QueuePolicyChoice(ClusterQueuingPoliciesCarrier(), note)
    if wanted == "adaptive_lifo" and caps.adaptive_lifo:
        lifo = tier.queue_policy.adaptive_lifo
        return QueuePolicyChoice(adaptive_lifo(lifo.high_watermark, lifo.low_watermark), None)
    note = None
    if wanted == "adaptive_lifo":
        note = (
            f"{cluster_name}: adaptive_lifo requested, node lacks {ADAPTIVE_LIFO_EXTENSION}: "
            "FIFO sent"
        )
    return QueuePolicyChoice(fifo(), note)


def adaptive_lifo(high_watermark: int, low_watermark: int) -> ClusterQueuingPoliciesCarrier:
    config = AdaptiveLifoQueuePolicyConfig(
        high_watermark=high_watermark, low_watermark=low_watermark
    )
    return _carrier(ADAPTIVE_LIFO_EXTENSION, ADAPTIVE_LIFO_TYPE, config.SerializeToString())


def fifo() -> ClusterQueuingPoliciesCarrier:
    return _carrier(FIFO_EXTENSION, FIFO_TYPE, FifoQueuePolicyConfig().SerializeToString())


def _carrier(name: str, type_url: str, value: bytes) -> ClusterQueuingPoliciesCarrier:
    carrier = ClusterQueuingPoliciesCarrier()
    policy = carrier.queuing_policies.pending_rq_policy
    policy.name = name
    policy.typed_config.type_url = type_url
    policy.typed_config.value = value
    return carrier


def attach(cluster: Cluster, carrier: ClusterQueuingPoliciesCarrier) -> None:
    """Merge field 62 into `cluster`; it then re-serializes with the Cluster's own bytes."""
    cluster.MergeFromString(carrier.SerializeToString(deterministic=True))


def read_back(cluster_payload: bytes) -> ClusterQueuingPoliciesCarrier:
    """Field 62 of serialized Cluster bytes (other Cluster fields stay unknown and are ignored)."""
    carrier = ClusterQueuingPoliciesCarrier()
    carrier.ParseFromString(cluster_payload)
    return carrier


def queuing_policies_json(carrier: ClusterQueuingPoliciesCarrier) -> dict[str, Any] | None:
    """Field 62 in Envoy's JSON shape (typed_config with Envoy's `@type`), None when absent."""
    if not carrier.HasField("queuing_policies"):
        return None
    policy = carrier.queuing_policies.pending_rq_policy
    typed_config: dict[str, Any] = {"@type": policy.typed_config.type_url}
    if policy.typed_config.type_url == ADAPTIVE_LIFO_TYPE:
        config = AdaptiveLifoQueuePolicyConfig()
        config.ParseFromString(policy.typed_config.value)
        typed_config.update(
            MessageToDict(
                config,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        )
    return {"pending_rq_policy": {"name": policy.name, "typed_config": typed_config}}
