"""Wire bytes of ADS responses, the part every stream shares serialized once.

A `DiscoveryResponse` / `DeltaDiscoveryResponse` is the same for every stream of a PoP except
`version_info` / `system_version_info` (SotW: shared too, but part of the per-stream state) and
the per-stream `nonce`. So the rest — type URL, the resources as `Any` from `Resource.payload`,
delta's removed names — is serialized once per (mode, type, resources, removals) and kept in a
bounded LRU; per stream only the two string fields are appended. Protobuf parses concatenated
fields as one message, so the bytes parse to exactly what `encode_sotw` / `encode_delta` build
(tests/test_ads_encoding.py checks this).

Lookup is by identity first: the protocol core hands every stream of a PoP the same
`ResourceSet.resources` / `Diff.changed` tuple (`index.py`), so a hit costs one dict lookup.
The entry holds the tuple itself, so its id cannot be reused while the entry lives. A tuple
seen for the first time (a new snapshot, or one built per stream) falls back to a key of its
names and versions (versions are content hashes of the payloads: equal keys, equal bytes).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse

from control_plane.ads.protocol import DeltaResponse, SotwResponse
from control_plane.translate.resources import Resource

__all__ = ["ResponseEncoder", "encode_delta", "encode_sotw", "pass_bytes", "varint"]


def encode_sotw(response: SotwResponse) -> DiscoveryResponse:
    """The response as a message (the reference the pre-encoded bytes must equal)."""
    message = DiscoveryResponse(
        version_info=response.version, type_url=response.type_url, nonce=response.nonce
    )
    for item in response.resources:
        message.resources.add(type_url=item.type_url, value=item.payload)
    return message


def encode_delta(response: DeltaResponse) -> DeltaDiscoveryResponse:
    message = DeltaDiscoveryResponse(
        system_version_info=response.version,
        type_url=response.type_url,
        nonce=response.nonce,
        removed_resources=response.removed,
    )
    for item in response.resources:
        added = message.resources.add(name=item.name, version=item.version)
        added.resource.type_url = item.type_url
        added.resource.value = item.payload
    return message


def pass_bytes(data: bytes) -> bytes:
    """gRPC response serializer for responses that are already wire bytes."""
    return data


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(message_type: Any, field_name: str) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return varint(message_type.DESCRIPTOR.fields_by_name[field_name].number << 3 | 2)


def _string_field(tag: bytes, text: str) -> bytes:
    if not text:
        return b""  # proto3: an empty string is not on the wire
    data = text.encode()
    return tag + varint(len(data)) + data


_SOTW_VERSION = _tag(DiscoveryResponse, "version_info")
_SOTW_NONCE = _tag(DiscoveryResponse, "nonce")
_DELTA_VERSION = _tag(DeltaDiscoveryResponse, "system_version_info")
_DELTA_NONCE = _tag(DeltaDiscoveryResponse, "nonce")


class ResponseEncoder:
    """Response wire bytes with the shared body serialized once (bounded LRU caches).

    Each cache keeps at most `max_entries` bodies and `max_bytes` of them (the newest always
    fits). The live set is a few bodies per (PoP, type): a fleet of 100 PoPs needs ~400 at
    once, so the entry bound is well above that (at 256, a reconnect storm over 100 PoPs
    missed the identity cache on ~40 % of its responses and built their content keys)."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # (mode, type_url, id(resources), removed) -> (resources, body)
        self._by_identity: OrderedDict[tuple[Any, ...], tuple[tuple[Resource, ...], bytes]] = (
            OrderedDict()
        )
        self._identity_bytes = 0
        # (mode, type_url, ((type_url, name, version), ...), removed) -> body
        self._by_content: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self._content_bytes = 0
        self.builds = 0  # bodies serialized (tests: once per shared body, not per stream)

    def encode(self, response: SotwResponse | DeltaResponse) -> bytes:
        if isinstance(response, SotwResponse):
            body = self._body("sotw", response.type_url, response.resources, ())
            version_tag, nonce_tag = _SOTW_VERSION, _SOTW_NONCE
        else:
            body = self._body("delta", response.type_url, response.resources, response.removed)
            version_tag, nonce_tag = _DELTA_VERSION, _DELTA_NONCE
        return (
            body
            + _string_field(version_tag, response.version)
            + _string_field(nonce_tag, response.nonce)
        )

    def _body(
        self, mode: str, type_url: str, resources: tuple[Resource, ...], removed: tuple[str, ...]
    ) -> bytes:
        key = (mode, type_url, id(resources), removed)
        found = self._by_identity.get(key)
        if found is not None and found[0] is resources:
            self._by_identity.move_to_end(key)
            return found[1]
        content = (
            mode, type_url, tuple((r.type_url, r.name, r.version) for r in resources), removed
        )
        body = self._by_content.get(content)
        if body is None:
            body = self._build(mode, type_url, resources, removed)
            self._by_content[content] = body
            self._content_bytes += len(body)
            while len(self._by_content) > 1 and (
                len(self._by_content) > self.max_entries or self._content_bytes > self.max_bytes
            ):
                self._content_bytes -= len(self._by_content.popitem(last=False)[1])
        else:
            self._by_content.move_to_end(content)
        if found is not None:  # the same key, another tuple (its id was reused)
            self._identity_bytes -= len(found[1])
        self._by_identity[key] = (resources, body)
        self._by_identity.move_to_end(key)
        self._identity_bytes += len(body)
        while len(self._by_identity) > 1 and (
            len(self._by_identity) > self.max_entries or self._identity_bytes > self.max_bytes
        ):
            self._identity_bytes -= len(self._by_identity.popitem(last=False)[1][1])
        return body

    def _build(
        self, mode: str, type_url: str, resources: tuple[Resource, ...], removed: tuple[str, ...]
    ) -> bytes:
        self.builds += 1
        if mode == "sotw":
            return encode_sotw(SotwResponse(type_url, "", "", resources)).SerializeToString()
        return encode_delta(DeltaResponse(type_url, "", "", resources, removed)).SerializeToString()
