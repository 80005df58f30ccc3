"""A PoP's resources as JSON (protobuf JSON mapping), the way an operator reads them.

Shape: kind (`clusters`, `endpoints`, `listeners`, `routes`, `runtime`, `secrets`) -> resource
name -> resource. A secret's private key is shown as its fingerprint, never as the key.
Clusters also show `queuing_policies` (field 62), read back from their wire bytes: what is shown
is what is sent.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict

from control_plane.desired.served_certs import key_fingerprint
from control_plane.translate.queue_policy import queuing_policies_json, read_back
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    RUNTIME_TYPE,
    SECRET_TYPE,
    PopResources,
    Resource,
)
from control_plane.translate.secrets import redacted

KINDS: dict[str, str] = {
    CLUSTER_TYPE: "clusters",
    ENDPOINT_TYPE: "endpoints",
    LISTENER_TYPE: "listeners",
    ROUTE_TYPE: "routes",
    RUNTIME_TYPE: "runtime",
    SECRET_TYPE: "secrets",
}


def render_json(pop_resources: PopResources) -> dict[str, dict[str, Any]]:
    return {
        kind: {
            name: _resource_json(resource)
            for name, resource in pop_resources.of_type(type_url).items()
        }
        for type_url, kind in KINDS.items()
        if type_url != SECRET_TYPE or pop_resources.of_type(SECRET_TYPE)  # only TLS listeners'
    }


def render_differing(old: PopResources | None, new: PopResources | None
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """`old` and `new` rendered (None: nothing), leaving out every resource both have with the
    same version: versions are content hashes, so those render the same. What a diff of the two
    renderings finds is what it finds on the full ones, for the cost of what changed."""
    def rendered(side: PopResources | None, other: PopResources | None
                 ) -> dict[str, dict[str, Any]]:
        if side is None:
            return {}
        shown: dict[str, dict[str, Any]] = {}
        for type_url, kind in KINDS.items():
            theirs = {} if other is None else other.of_type(type_url)
            shown[kind] = {
                name: _resource_json(resource)
                for name, resource in side.of_type(type_url).items()
                if name not in theirs or theirs[name].version != resource.version
            }
        return shown

    return rendered(old, new), rendered(new, old)


def _resource_json(resource: Resource) -> dict[str, Any]:
    rendered: dict[str, Any] = MessageToDict(resource.message, preserving_proto_field_name=True)
    if resource.type_url == CLUSTER_TYPE:
        queuing_policies = queuing_policies_json(read_back(resource.payload))
        if queuing_policies is not None:
            rendered["queuing_policies"] = queuing_policies
    if resource.type_url == SECRET_TYPE:
        key = resource.message.tls_certificate.private_key.inline_bytes  # type: ignore[attr-defined]
        rendered = redacted(rendered, key_fingerprint(key))
    return rendered
