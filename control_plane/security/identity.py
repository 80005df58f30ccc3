"""Who a certificate says its holder is: SPIFFE-style URI SANs naming a node's PoP and id.

A node certificate carries exactly one URI SAN `spiffe://ballast/pop/<pop>/node/<node id>`
(each segment percent-encoded, so any node id fits); an admin client certificate carries
`spiffe://ballast/admin/<name>`. Pure functions: making the URI, reading it back, and checking
a stream's claimed (PoP, node id) against it.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

TRUST_DOMAIN = "ballast"
_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
# What a refusal quotes of a client-supplied value: records and logs stay small.
QUOTE_LIMIT = 64


@dataclass(frozen=True)
class NodeIdentity:
    pop: str
    node_id: str

    @property
    def uri(self) -> str:
        return node_uri(self.pop, self.node_id)


@dataclass(frozen=True)
class AdminIdentity:
    name: str

    @property
    def uri(self) -> str:
        return admin_uri(self.name)


Identity = NodeIdentity | AdminIdentity


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def node_uri(pop: str, node_id: str) -> str:
    if not pop or not node_id:
        raise ValueError("a node identity needs a PoP and a node id")
    return f"{_PREFIX}pop/{_segment(pop)}/node/{_segment(node_id)}"


def admin_uri(name: str) -> str:
    if not name:
        raise ValueError("an admin identity needs a name")
    return f"{_PREFIX}admin/{_segment(name)}"


def parse_identity(uri: str) -> Identity | None:
    """The identity a URI SAN names, or None when it is not one of ours."""
    if not uri.startswith(_PREFIX):
        return None
    parts = uri[len(_PREFIX):].split("/")
    if any(not part for part in parts):
        return None
    values = [urllib.parse.unquote(part) for part in parts]
    if len(parts) == 4 and parts[0] == "pop" and parts[2] == "node":
        return NodeIdentity(pop=values[1], node_id=values[3])
    if len(parts) == 2 and parts[0] == "admin":
        return AdminIdentity(name=values[1])
    return None


def identities(uris: list[str]) -> list[Identity]:
    return [identity for uri in uris if (identity := parse_identity(uri)) is not None]


def short(value: str, limit: int = QUOTE_LIMIT) -> str:
    """`value` for a message: cut at `limit` characters, with the original length noted."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}…({len(value)} chars)"


def node_mismatch(uris: list[str], pop: str, node_id: str) -> str | None:
    """Why a stream claiming (`pop`, `node_id`) may not use a certificate with these URI SANs;
    None when exactly one node identity is present and it matches both."""
    nodes = [i for i in identities(uris) if isinstance(i, NodeIdentity)]
    if not nodes:
        return (
            "the client certificate names no node identity (a URI SAN "
            f"{_PREFIX}pop/<pop>/node/<id>)"
        )
    if len(nodes) > 1:
        return f"the client certificate names {len(nodes)} node identities; one is allowed"
    cert = nodes[0]
    if cert.pop != pop:
        return (
            f"the certificate is for PoP {short(cert.pop)!r}, the node claims PoP "
            f"{short(pop)!r}"
        )
    if cert.node_id != node_id:
        return (
            f"the certificate is for node {short(cert.node_id)!r}, the stream claims node id "
            f"{short(node_id)!r}"
        )
    return None
