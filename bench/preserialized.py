"""A prototype of the serialization path NOTES.md suggests, for the benchmarks only.

The resources part of a response (type URL, resources, removals) is serialized once per
(mode, type, resource names and versions, removals) and kept in a small LRU; per stream only the
version and the nonce are appended. Protobuf reads concatenated fields as one message, so the
bytes parse to exactly `encode_sotw`/`encode_delta` of the response. Serving these bytes needs a
gRPC handler whose response serializer passes bytes through; `control_plane/ads/server.py`
does not do that (the fan-out benchmark did not show an end-to-end win: docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse

from control_plane.ads.protocol import DeltaResponse, SotwResponse
from control_plane.ads.server import encode_delta, encode_sotw


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(message_type: Any, field_name: str) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(message_type.DESCRIPTOR.fields_by_name[field_name].number << 3 | 2)


def _string_field(tag: bytes, text: str) -> bytes:
    if not text:
        return b""  # proto3: an empty string is not on the wire
    data = text.encode()
    return tag + _varint(len(data)) + data


_SOTW_VERSION = _tag(DiscoveryResponse, "version_info")
_SOTW_NONCE = _tag(DiscoveryResponse, "nonce")
_DELTA_VERSION = _tag(DeltaDiscoveryResponse, "system_version_info")
_DELTA_NONCE = _tag(DeltaDiscoveryResponse, "nonce")


class ResponseEncoder:
    """Wire bytes of responses, the shared part serialized once for every stream (resource
    versions are content hashes of the payloads, so equal keys mean equal bytes)."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._bodies: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def encode(self, response: SotwResponse | DeltaResponse) -> bytes:
        resources = tuple((item.name, item.version) for item in response.resources)
        if isinstance(response, SotwResponse):
            key: tuple[Any, ...] = ("sotw", response.type_url, resources)
            version_tag, nonce_tag = _SOTW_VERSION, _SOTW_NONCE
        else:
            key = ("delta", response.type_url, resources, response.removed)
            version_tag, nonce_tag = _DELTA_VERSION, _DELTA_NONCE
        body = self._bodies.get(key)
        if body is None:
            self.misses += 1
            shared = dataclasses.replace(response, version="", nonce="")
            message = (
                encode_sotw(shared) if isinstance(shared, SotwResponse) else encode_delta(shared)
            )
            body = message.SerializeToString()
            self._bodies[key] = body
            if len(self._bodies) > self.max_entries:
                self._bodies.popitem(last=False)
        else:
            self.hits += 1
            self._bodies.move_to_end(key)
        return (
            body
            + _string_field(version_tag, response.version)
            + _string_field(nonce_tag, response.nonce)
        )
