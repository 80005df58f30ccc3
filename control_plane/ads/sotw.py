"""The sans-I/O core of one StreamAggregatedResources (state of the world) stream: requests and
new resources in, responses and events out (`protocol.py`: what it shares with the delta core,
and the rules both keep).

In SotW a request whose nonce is not the type's latest is stale and ignored; every response
holds everything of the type the subscription gets, so a response is sent only when that
changed (or the node must be answered).
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest

from control_plane.ads.index import EMPTY, ResourceSet
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits
from control_plane.ads.protocol import (
    NO_NAMES,
    WILDCARD,
    WILDCARD_TYPES,
    Ack,
    Nack,
    SotwResponse,
    StreamOutput,
    check_names,
    check_nonce,
    check_type,
    subscribed_view,
)
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, PUSH_ORDER, PopResources

__all__ = ["SotwStream"]

# serialized resource_names -> frozenset of them, shared by every stream naming the same list;
# a SotW ACK repeats all names (150 for EDS of a large PoP): serializing them in C is ~3x
# cheaper than making a Python set, and the set is made once per distinct list, not per ACK.
# Bounded in bytes of keys (lists are client-supplied): emptied when full, big lists not kept.
_REQUESTED: dict[bytes, frozenset[str]] = {}
_REQUESTED_BYTES = [0]
MAX_REQUESTED_BYTES = 4 * 1024 * 1024
MAX_REQUESTED_KEY_BYTES = 64 * 1024
_NOT_NAMES = ("version_info", "node", "response_nonce", "error_detail")


def _requested_names(request: DiscoveryRequest, limits: AdsLimits) -> frozenset[str]:
    """`frozenset(request.resource_names)`, the same object for the same list; names checked
    against `limits` once per distinct list."""
    listed = request.resource_names
    if not listed:
        return NO_NAMES  # CDS and LDS of most nodes: one shared empty set, not one each
    if len(listed) < 8:
        check_names(listed, len(listed), "resource_names", limits)
        return frozenset(listed)
    check_names((), len(listed), "resource_names", limits)
    names_only = DiscoveryRequest()
    names_only.CopyFrom(request)
    for name in _NOT_NAMES:
        names_only.ClearField(name)
    key = names_only.SerializeToString(deterministic=True)
    names = _REQUESTED.get(key)
    if names is None:
        check_names(listed, len(listed), "resource_names", limits)
        names = frozenset(listed)
        if len(key) <= MAX_REQUESTED_KEY_BYTES:
            if _REQUESTED_BYTES[0] + len(key) > MAX_REQUESTED_BYTES:
                _REQUESTED.clear()
                _REQUESTED_BYTES[0] = 0
            _REQUESTED[key] = names
            _REQUESTED_BYTES[0] += len(key)
    return names


@dataclass(slots=True)
class _SotwType:
    # the subscription: everything of the type, and/or these names
    wildcard: bool = False
    names: frozenset[str] = NO_NAMES
    nonce: str | None = None  # latest nonce sent for this type
    sent: ResourceSet = EMPTY  # what the last response held
    # a NACKed version stays the sent version: it is not sent again until the content changes
    sent_version: str | None = None


class SotwStream:
    """One StreamAggregatedResources stream."""

    __slots__ = ("_counter", "_types", "limits")

    def __init__(self, limits: AdsLimits = DEFAULT_LIMITS) -> None:
        self._types: dict[str, _SotwType] = {}
        self._counter = 0
        self.limits = limits

    def subscribed(self, type_url: str) -> bool:
        return type_url in self._types

    def on_request(self, request: DiscoveryRequest, resources: PopResources) -> StreamOutput:
        type_url = check_type(request.type_url, self.limits)
        check_nonce(request.response_nonce, self.limits)
        out = StreamOutput()
        state = self._types.get(type_url)
        nonce = request.response_nonce
        if state is not None and nonce and nonce != state.nonce:
            return out  # stale: answers a response that has since been superseded
        first = state is None
        if state is None:
            state = self._types[type_url] = _SotwType()
        names = _requested_names(request, self.limits)
        wildcard = WILDCARD in names or (
            type_url in WILDCARD_TYPES and not names and (first or state.wildcard)
        )
        if WILDCARD in names:
            names = names - {WILDCARD}
        if wildcard != state.wildcard or (names is not state.names and names != state.names):
            state.wildcard, state.names = wildcard, names
        if nonce and nonce == state.nonce and state.sent_version is not None:
            version = state.sent_version
            if request.HasField("error_detail"):
                out.events.append(Nack(type_url, version, nonce, request.error_detail.message))
            else:
                out.events.append(Ack(type_url, version, nonce))
        wanted = subscribed_view(resources, type_url, state)
        must_answer = first and (state.wildcard or bool(wanted.items))
        changed = self._send_if_needed(out, type_url, wanted, force=must_answer)
        if type_url == CLUSTER_TYPE:
            self._resend_endpoints(out, changed, resources)
        return out

    def on_resources(self, resources: PopResources) -> StreamOutput:
        out = StreamOutput()
        removals: list[tuple[str, ResourceSet]] = []
        for type_url in PUSH_ORDER:
            state = self._types.get(type_url)
            if state is None:
                continue
            wanted = subscribed_view(resources, type_url, state)
            sent = state.sent
            gone = sent is not wanted and bool(wanted.diff_from(sent).gone)
            if type_url in WILDCARD_TYPES and gone:
                # make before break: keep what goes away until everything else moved over
                changed = self._send_if_needed(out, type_url, wanted.diff_from(sent).kept)
                removals.append((type_url, wanted))
            elif type_url == ENDPOINT_TYPE and any(
                r.type_url == CLUSTER_TYPE for r in out.responses
            ):
                continue  # already sent by _resend_endpoints right after the clusters
            else:
                changed = self._send_if_needed(out, type_url, wanted)
            if type_url == CLUSTER_TYPE:
                self._resend_endpoints(out, changed, resources)
        for type_url, wanted in reversed(removals):
            self._send_if_needed(out, type_url, wanted)
        return out

    def _resend_endpoints(
        self, out: StreamOutput, clusters: frozenset[str], resources: PopResources
    ) -> None:
        """Clusters changed: send EDS now, even unchanged (Envoy warms them until it arrives)."""
        state = self._types.get(ENDPOINT_TYPE)
        if state is None:
            return
        wanted = subscribed_view(resources, ENDPOINT_TYPE, state)
        force = bool(clusters) and any(name in wanted.items for name in clusters)
        self._send_if_needed(out, ENDPOINT_TYPE, wanted, force=force)

    def _send_if_needed(
        self, out: StreamOutput, type_url: str, wanted: ResourceSet, *, force: bool = False
    ) -> frozenset[str]:
        """Send `wanted` unless the node was sent exactly that; the names that changed."""
        state = self._types[type_url]
        version = wanted.version
        unchanged = version == state.sent_version
        nothing_yet = state.sent_version is None and not wanted.items and not state.wildcard
        if (unchanged or nothing_yet) and not force:
            return frozenset()
        self._counter += 1
        nonce = str(self._counter)
        changed = (
            frozenset() if wanted is state.sent else wanted.diff_from(state.sent).changed_names
        )
        out.responses.append(SotwResponse(type_url, version, nonce, wanted.resources))
        state.nonce = nonce
        state.sent = wanted
        state.sent_version = version
        return changed
