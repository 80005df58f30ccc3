"""What a node's Envoy can accept: from its `node.extensions`, or from a known Envoy release."""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import Node

from control_plane.translate.resources import Capabilities

# Envoy releases whose extension set we measured (tests/fixtures/envoy-1.40-node.json).
ENVOY_RELEASES: dict[str, Capabilities] = {
    "1.40": Capabilities(adaptive_lifo=False),
}


def capabilities_from_node(node: Node) -> Capabilities:
    """The node's advertised extensions (sent on its first request) decide what it gets."""
    return Capabilities.from_extension_names(frozenset(ext.name for ext in node.extensions))
