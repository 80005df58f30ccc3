"""The sans-I/O core of one DeltaAggregatedResources (incremental) stream: requests and new
resources in, responses and events out (`protocol.py`: what it shares with the SotW core, and
the rules both keep).

`initial_resource_versions` are what the node already has; only what changed is sent and
removals are announced; a nonce answers the one response it was sent with, whatever came since.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

from control_plane.ads.index import EMPTY, ResourceSet, index, items_version
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits
from control_plane.ads.protocol import (
    NO_NAMES,
    WILDCARD,
    WILDCARD_TYPES,
    Ack,
    DeltaResponse,
    Nack,
    ProtocolError,
    StreamOutput,
    check_names,
    check_nonce,
    check_type,
    short_name,
    subscribed_view,
)
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    PUSH_ORDER,
    PopResources,
    Resource,
)

__all__ = ["DeltaStream"]

# delta responses remembered until (N)ACKed, per stream; Envoy answers each in order at once,
# a client that never answers cannot make a stream hold more
MAX_UNANSWERED = 64


@dataclass(slots=True)
class _DeltaType:
    # the subscription: everything of the type, and/or these names
    wildcard: bool = False
    names: frozenset[str] = NO_NAMES
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
        type_url = check_type(request.type_url, limits)
        check_nonce(request.response_nonce, limits)
        subscribing, unsubscribing = (
            request.resource_names_subscribe, request.resource_names_unsubscribe
        )
        initial = request.initial_resource_versions
        check_names(subscribing, len(subscribing), "resource_names_subscribe", limits)
        check_names(unsubscribing, len(unsubscribing), "resource_names_unsubscribe", limits)
        check_names(initial, len(initial), "initial_resource_versions", limits)
        check_names(initial.values(), 0, "initial_resource_versions (versions)", limits)
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
        wanted = subscribed_view(resources, type_url, state)
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
