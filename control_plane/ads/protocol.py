"""The sans-I/O core of one ADS stream: requests and new resources in, responses and events out.

Nothing here touches gRPC, sockets or clocks. A stream object is fed each DiscoveryRequest (or
DeltaDiscoveryRequest) with the node's current `PopResources` (`on_request`), and each newer
`PopResources` of its PoP (`on_resources`); it returns a `StreamOutput`: the responses to write,
in order, and the ACK/NACK events seen. Rules (xDS protocol, and the Envoy 1.40 traps in
docs/architecture.md, "xDS behaviour of Envoy 1.40"):

- nonces are per stream; in SotW a request whose nonce is not the type's latest is stale and
  ignored; a request with `error_detail` is a NACK of the response with that nonce;
- a version is sent once: after a NACK nothing is re-sent until the content changes (no loop);
- pushes go in make-before-break order (CDS, EDS, LDS, RDS), removals last, in reverse;
- whenever clusters are (re)sent, EDS of those clusters is re-sent too, or Envoy keeps them
  warming for 15 s;
- only what a node subscribed to is sent (CDS/LDS may be wildcard); names that do not exist yet
  are remembered and sent when they appear;
- delta: `initial_resource_versions` are what the node already has; removals are announced.

Cost: everything that is the same for every stream of a PoP — a type's resources per
subscription, their versions, the diff between two generations of a PoP's resources — is
computed once per generation in `index.py` and shared. Per stream, a push or an ACK that
changes nothing compares object identities and version strings; a push that changes k resources
touches those k.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control_plane.ads.index import EMPTY, ResourceSet, index, items_version
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits, clip
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    PUSH_ORDER,
    PopResources,
    Resource,
)

__all__ = [
    "WILDCARD", "Ack", "DeltaResponse", "DeltaStream", "Nack", "ProtocolError", "SotwResponse",
    "SotwStream", "StreamOutput", "items_version", "short_name",
]

WILDCARD = "*"
# delta responses remembered until (N)ACKed, per stream; Envoy answers each in order at once,
# a client that never answers cannot make a stream hold more
MAX_UNANSWERED = 64
WILDCARD_TYPES = frozenset({CLUSTER_TYPE, LISTENER_TYPE})  # an empty first request = everything
SHORT_NAMES = {
    CLUSTER_TYPE: "CDS",
    ENDPOINT_TYPE: "EDS",
    LISTENER_TYPE: "LDS",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": "RDS",
    "type.googleapis.com/envoy.service.runtime.v3.Runtime": "RTDS",
}


class ProtocolError(ValueError):
    """A request the server cannot accept (the stream's state is left untouched)."""


@dataclass(frozen=True, slots=True)
class SotwResponse:
    type_url: str
    version: str
    nonce: str
    resources: tuple[Resource, ...]


@dataclass(frozen=True, slots=True)
class DeltaResponse:
    type_url: str
    version: str  # system_version_info: the hash of what the node holds of this type afterwards
    nonce: str
    resources: tuple[Resource, ...]
    removed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Ack:
    type_url: str
    version: str
    nonce: str


@dataclass(frozen=True, slots=True)
class Nack:
    type_url: str
    version: str
    nonce: str
    message: str


@dataclass(slots=True)
class StreamOutput:
    """What a stream does with one request or one new generation of its PoP's resources."""

    responses: list[SotwResponse | DeltaResponse] = field(default_factory=list)
    events: list[Ack | Nack] = field(default_factory=list)


def short_name(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url)


# each served type URL -> its one string object: a request's type_url is a new string each
# time it is read, and every stream keeps its types' URLs (here and in its NodeEntry)
_SERVED_TYPES = {type_url: type_url for type_url in PUSH_ORDER}


def _check_type(type_url: str, limits: AdsLimits) -> str:
    """The served type URL `type_url` names (the shared string)."""
    served = _SERVED_TYPES.get(type_url)
    if served is not None:
        return served
    if not type_url:
        raise ProtocolError("request without type_url")
    shown = clip(type_url, limits.name_chars)
    raise ProtocolError(f"unsupported type_url {shown!r}; Ballast serves {', '.join(PUSH_ORDER)}")


def _check_nonce(nonce: str, limits: AdsLimits) -> None:
    if len(nonce) > limits.nonce_chars:
        raise ProtocolError(
            f"response_nonce of {len(nonce):,} characters; Ballast's nonces have at most "
            f"{limits.nonce_chars}"
        )


def _check_names(names: Iterable[str], count: int, what: str, limits: AdsLimits) -> None:
    """At most `names_per_subscription` names, each at most `name_chars` long."""
    if count > limits.names_per_subscription:
        raise ProtocolError(
            f"{what}: {count:,} names; the limit is {limits.names_per_subscription:,} "
            "per subscription"
        )
    longest = max(map(len, names), default=0)
    if longest > limits.name_chars:
        raise ProtocolError(
            f"{what}: a name of {longest:,} characters; the limit is {limits.name_chars}"
        )


_NO_NAMES: frozenset[str] = frozenset()


def _wanted(resources: PopResources, type_url: str, state: _SotwType | _DeltaType) -> ResourceSet:
    """What a type's subscription gets of `resources`: one shared object per (resources, type,
    subscription). The state then holds the view's own name set, so later lookups match by
    identity."""
    view = index(resources, type_url).view(state.wildcard, state.names)
    if not state.wildcard and view.scope is not None:
        state.names = view.scope
    return view


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
        return _NO_NAMES  # CDS and LDS of most nodes: one shared empty set, not one each
    if len(listed) < 8:
        _check_names(listed, len(listed), "resource_names", limits)
        return frozenset(listed)
    _check_names((), len(listed), "resource_names", limits)
    names_only = DiscoveryRequest()
    names_only.CopyFrom(request)
    for name in _NOT_NAMES:
        names_only.ClearField(name)
    key = names_only.SerializeToString(deterministic=True)
    names = _REQUESTED.get(key)
    if names is None:
        _check_names(listed, len(listed), "resource_names", limits)
        names = frozenset(listed)
        if len(key) <= MAX_REQUESTED_KEY_BYTES:
            if _REQUESTED_BYTES[0] + len(key) > MAX_REQUESTED_BYTES:
                _REQUESTED.clear()
                _REQUESTED_BYTES[0] = 0
            _REQUESTED[key] = names
            _REQUESTED_BYTES[0] += len(key)
    return names


# --------------------------------------------------------------------------------------------
# State of the world


@dataclass(slots=True)
class _SotwType:
    # the subscription: everything of the type, and/or these names
    wildcard: bool = False
    names: frozenset[str] = _NO_NAMES
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
        type_url = _check_type(request.type_url, self.limits)
        _check_nonce(request.response_nonce, self.limits)
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
        wanted = _wanted(resources, type_url, state)
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
            wanted = _wanted(resources, type_url, state)
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
        wanted = _wanted(resources, ENDPOINT_TYPE, state)
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


# --------------------------------------------------------------------------------------------
# Delta (incremental)


@dataclass(slots=True)
class _DeltaType:
    # the subscription: everything of the type, and/or these names
    wildcard: bool = False
    names: frozenset[str] = _NO_NAMES
    # name -> version the node holds, as far as we know: what it said it had, then what we sent
    # (a NACKed version stays here, so it is not sent again until it changes)
    has: dict[str, str] = field(default_factory=dict)
    # a shared set whose (name, version) pairs are exactly `has` (None: not known to be one);
    # lets a push or an ACK use shared diffs and versions instead of walking `has`
    holds: ResourceSet | None = EMPTY


class DeltaStream:
    """One DeltaAggregatedResources stream."""

    __slots__ = ("_counter", "_pending", "_types", "limits")

    def __init__(self, limits: AdsLimits = DEFAULT_LIMITS) -> None:
        self._types: dict[str, _DeltaType] = {}
        self._pending: dict[str, DeltaResponse] = {}  # nonce -> response awaiting (N)ACK
        self._counter = 0
        self.limits = limits

    def subscribed(self, type_url: str) -> bool:
        return type_url in self._types

    def on_request(self, request: DeltaDiscoveryRequest, resources: PopResources) -> StreamOutput:
        limits = self.limits
        type_url = _check_type(request.type_url, limits)
        _check_nonce(request.response_nonce, limits)
        subscribing, unsubscribing = (
            request.resource_names_subscribe, request.resource_names_unsubscribe
        )
        initial = request.initial_resource_versions
        _check_names(subscribing, len(subscribing), "resource_names_subscribe", limits)
        _check_names(unsubscribing, len(unsubscribing), "resource_names_unsubscribe", limits)
        _check_names(initial, len(initial), "initial_resource_versions", limits)
        _check_names(initial.values(), 0, "initial_resource_versions (versions)", limits)
        held = self._types[type_url].names if type_url in self._types else frozenset()
        if len(held) + len(subscribing) > limits.names_per_subscription:
            after = (held | set(subscribing)) - {WILDCARD} - set(unsubscribing)
            if len(after) > limits.names_per_subscription:
                raise ProtocolError(
                    f"{short_name(type_url)} subscription would hold {len(after):,} names; "
                    f"the limit is {limits.names_per_subscription:,}"
                )
        out = StreamOutput()
        nonce = request.response_nonce
        answered = self._pending.pop(nonce, None) if nonce else None
        if answered is not None and answered.type_url != type_url:
            self._pending[nonce] = answered
            raise ProtocolError(
                f"nonce {nonce} answers a {short_name(answered.type_url)} response, "
                f"not {short_name(type_url)}"
            )
        first = type_url not in self._types
        state = self._types.get(type_url)
        if state is None:
            state = self._types[type_url] = _DeltaType()
        if answered is not None:
            if request.HasField("error_detail"):
                out.events.append(
                    Nack(type_url, answered.version, nonce, request.error_detail.message)
                )
            else:
                out.events.append(Ack(type_url, answered.version, nonce))
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        wildcard = state.wildcard
        if first:
            state.has = dict(request.initial_resource_versions)
            state.holds = None if state.has else EMPTY
            wildcard = WILDCARD in subscribe or (type_url in WILDCARD_TYPES and not subscribe)
        if WILDCARD in subscribe:
            wildcard = True
        if WILDCARD in unsubscribe:
            wildcard = False
        if first or subscribe or unsubscribe:
            names = (state.names | (subscribe - {WILDCARD})) - unsubscribe
            if wildcard != state.wildcard or names != state.names:
                state.wildcard, state.names = wildcard, frozenset(names)
        for name in unsubscribe:
            if state.has.pop(name, None) is not None:
                state.holds = None
        self._push_type(out, type_url, resources, force=first and state.wildcard)
        if type_url == CLUSTER_TYPE and ENDPOINT_TYPE in self._types:
            self._push_type(out, ENDPOINT_TYPE, resources, removals=False)
        return out

    def on_resources(self, resources: PopResources) -> StreamOutput:
        out = StreamOutput()
        for type_url in PUSH_ORDER:
            if type_url in self._types:
                self._push_type(out, type_url, resources, removals=False)
        for type_url in reversed(PUSH_ORDER):
            if type_url in self._types:
                self._push_type(out, type_url, resources, updates=False)
        return out

    def _push_type(
        self,
        out: StreamOutput,
        type_url: str,
        resources: PopResources,
        *,
        updates: bool = True,
        removals: bool = True,
        force: bool = False,
    ) -> None:
        state = self._types[type_url]
        wanted = _wanted(resources, type_url, state)
        resend = self._warming_names(out) if type_url == ENDPOINT_TYPE else set()
        holds = state.holds
        if holds is not None:
            # `has` is exactly `holds`: the shared diff says what to send and remove
            diff = None if holds is wanted else wanted.diff_from(holds)
            send: tuple[Resource, ...] = ()
            if updates:
                changed = diff.changed if diff is not None else ()
                if resend and not resend.isdisjoint(wanted.items):
                    names = diff.changed_names if diff is not None else frozenset()
                    send = tuple(
                        r for name, r in wanted.items.items() if name in resend or name in names
                    )
                else:
                    send = changed
            removed = diff.removed if diff is not None and removals else ()
            if not send and not removed and not force:
                if diff is not None and not diff.changed and not diff.gone:
                    state.holds = wanted  # the same content: the next diff is from this view
                return
            after = diff.after(updates=updates, removals=removals) if diff else holds
        else:
            # `has` came from the node (initial versions) or lost names: compare name by name
            send, removed = self._compare(state, wanted, type_url, resources, resend,
                                          updates=updates, removals=removals)
            if not send and not removed and not force:
                if updates and wanted.same_items(state.has):
                    state.holds = wanted
                return
            after = None
        for item in send:
            state.has[item.name] = item.version
        for name in removed:
            state.has.pop(name, None)
        if after is None and wanted.same_items(state.has):
            after = wanted
        state.holds = after
        self._counter += 1
        nonce = str(self._counter)
        version = after.version if after is not None else items_version(state.has)
        response = DeltaResponse(type_url, version, nonce, send, removed)
        self._pending[nonce] = response
        if len(self._pending) > MAX_UNANSWERED:  # a client that never answers: forget the oldest
            del self._pending[next(iter(self._pending))]
        out.responses.append(response)

    @staticmethod
    def _compare(
        state: _DeltaType,
        wanted: ResourceSet,
        type_url: str,
        resources: PopResources,
        resend: set[str],
        *,
        updates: bool,
        removals: bool,
    ) -> tuple[tuple[Resource, ...], tuple[str, ...]]:
        """What to send and remove, from `has` itself (the general, per-name way)."""
        has = state.has
        send: tuple[Resource, ...] = ()
        if updates:
            send = tuple(
                r
                for name, r in wanted.items.items()
                if name in resend or has.get(name) != r.version
            )
        removed: tuple[str, ...] = ()
        if removals:
            available = index(resources, type_url).items
            scope = set(has) if state.wildcard else state.names & set(has)
            removed = tuple(sorted(name for name in scope if name not in available))
        return send, removed

    @staticmethod
    def _warming_names(out: StreamOutput) -> set[str]:
        """Clusters sent earlier in this output: their endpoints go again (Envoy warming)."""
        return {
            item.name
            for response in out.responses
            if response.type_url == CLUSTER_TYPE
            for item in response.resources
        }
