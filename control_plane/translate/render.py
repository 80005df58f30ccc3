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
