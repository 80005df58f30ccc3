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

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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
    missed the identity cache on ~40 % of its responses and built their content keys).

    Past `keep_bytes`, a body no stream has asked for in `idle_s` seconds leaves at the next
    insert: every reload replaces every PoP's CDS and EDS bodies (~2.2 MB at 100 PoPs x 20
    groups), so without it the caches held every earlier reload's bodies (and, through the
    identity cache, their resources) until `max_bytes`, a process growing for hours. A body
    evicted and asked for again is built once more, not once per stream."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024,
                 keep_bytes: int = 8 * 1024 * 1024, idle_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self.idle_s = idle_s
        self._clock = clock
        # (mode, type_url, id(resources), removed) -> (resources, body, last asked for)
        self._by_identity: OrderedDict[
            tuple[Any, ...], tuple[tuple[Resource, ...], bytes, float]] = OrderedDict()
        self._identity_bytes = 0
        # (mode, type_url, ((type_url, name, version), ...), removed) -> (body, last asked for)
        self._by_content: OrderedDict[tuple[Any, ...], tuple[bytes, float]] = OrderedDict()
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

    def held_bytes(self) -> int:
        """The bytes of bodies the two caches hold (a body in both counts twice)."""
        return self._identity_bytes + self._content_bytes

    def _body(
        self, mode: str, type_url: str, resources: tuple[Resource, ...], removed: tuple[str, ...]
    ) -> bytes:
        now = self._clock()
        key = (mode, type_url, id(resources), removed)
        found = self._by_identity.get(key)
        if found is not None and found[0] is resources:
            self._by_identity[key] = (resources, found[1], now)
            self._by_identity.move_to_end(key)
            return found[1]
        content = (
            mode, type_url, tuple((r.type_url, r.name, r.version) for r in resources), removed
        )
        kept = self._by_content.get(content)
        if kept is None:
            body = self._build(mode, type_url, resources, removed)
            self._by_content[content] = (body, now)
            self._content_bytes += len(body)
            self._content_bytes -= _evict(self._by_content, self._content_bytes, lambda v: v[0],
                                          lambda v: v[1], self._bounds(now))
        else:
            body = kept[0]
            self._by_content[content] = (body, now)
            self._by_content.move_to_end(content)
        if found is not None:  # the same key, another tuple (its id was reused)
            self._identity_bytes -= len(found[1])
        self._by_identity[key] = (resources, body, now)
        self._by_identity.move_to_end(key)
        self._identity_bytes += len(body)
        self._identity_bytes -= _evict(self._by_identity, self._identity_bytes, lambda v: v[1],
                                       lambda v: v[2], self._bounds(now))
        return body

    def _bounds(self, now: float) -> _Bounds:
        return _Bounds(self.max_entries, self.max_bytes, self.keep_bytes, now - self.idle_s)

    def _build(
        self, mode: str, type_url: str, resources: tuple[Resource, ...], removed: tuple[str, ...]
    ) -> bytes:
        self.builds += 1
        if mode == "sotw":
            return encode_sotw(SotwResponse(type_url, "", "", resources)).SerializeToString()
        return encode_delta(DeltaResponse(type_url, "", "", resources, removed)).SerializeToString()


@dataclass(frozen=True)
class _Bounds:
    """What a cache may hold: `entries` and `bytes` always; past `keep_bytes`, only bodies
    asked for after `idle_before`."""

    entries: int
    bytes: int
    keep_bytes: int
    idle_before: float


def _evict(cache: OrderedDict[tuple[Any, ...], Any], held: int, body: Callable[[Any], bytes],
           asked: Callable[[Any], float], bounds: _Bounds) -> int:
    """Drop the least recently asked-for entries while `cache` is over its bounds (the newest
    always stays); the bytes dropped."""
    dropped = 0
    while len(cache) > 1:
        head = next(iter(cache.values()))
        over = len(cache) > bounds.entries or held - dropped > bounds.bytes
        idle = held - dropped > bounds.keep_bytes and asked(head) < bounds.idle_before
        if not (over or idle):
            break
        dropped += len(body(cache.popitem(last=False)[1]))
    return dropped
