"""BASELINE for benchmarks only: `control_plane/ads/protocol.py` (now split into `sotw.py`,
`delta.py` and the shared `protocol.py`) as it was before the
per-snapshot index (`control_plane/ads/index.py`), kept verbatim except that the response and
event types are imported from the current module and named as there (`StreamOutput`,
`on_resources`) (so `bench.fanout_server --protocol baseline`
can run it inside the real server). It copies, sorts and hashes every resource of a type per
stream on every push and every ACK. Compared against the current core in
`bench/protocol_core.py` and `bench.run --compare-protocol`; not used by the service.

The original module docstring follows.

The sans-I/O core of one ADS stream: requests and new resources in, responses and events out.

Nothing here touches gRPC, sockets or clocks. A stream object is fed each DiscoveryRequest (or
DeltaDiscoveryRequest) with the node's current `PopResources`, and each newer `PopResources`; it
returns a `StreamOutput`: the responses to write, in order, and the ACK/NACK events seen. Rules
(xDS protocol, and the Envoy 1.40 traps in docs/architecture.md, "xDS behaviour of Envoy 1.40"):

- nonces are per stream; in SotW a request whose nonce is not the type's latest is stale and
  ignored; a request with `error_detail` is a NACK of the response with that nonce;
- a version is sent once: after a NACK nothing is re-sent until the content changes (no loop);
- pushes go in make-before-break order (CDS, EDS, LDS, RDS), removals last, in reverse;
- whenever clusters are (re)sent, EDS of those clusters is re-sent too, or Envoy keeps them
  warming for 15 s;
- only what a node subscribed to is sent (CDS/LDS may be wildcard); names that do not exist yet
  are remembered and sent when they appear;
- delta: `initial_resource_versions` are what the node already has; removals are announced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from control_plane.ads.protocol import (
    Ack,
    DeltaResponse,
    Nack,
    ProtocolError,
    SotwResponse,
    StreamOutput,
)
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    PUSH_ORDER,
    PopResources,
    Resource,
    content_version,
)

WILDCARD = "*"
WILDCARD_TYPES = frozenset({CLUSTER_TYPE, LISTENER_TYPE})  # an empty first request = everything
SHORT_NAMES = {
    CLUSTER_TYPE: "CDS",
    ENDPOINT_TYPE: "EDS",
    LISTENER_TYPE: "LDS",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": "RDS",
}


def short_name(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url)


def items_version(items: dict[str, str]) -> str:
    """Version of a set of (name, version); equals `PopResources.type_version` for a full type."""
    return content_version(repr(sorted(items.items())).encode())


def _check_type(type_url: str) -> None:
    if not type_url:
        raise ProtocolError("request without type_url")
    if type_url not in PUSH_ORDER:
        served = ", ".join(PUSH_ORDER)
        raise ProtocolError(f"unsupported type_url {type_url!r}; Ballast serves {served}")


@dataclass
class _Subscription:
    wildcard: bool = False
    names: set[str] = field(default_factory=set)

    def wanted(self, available: dict[str, Resource]) -> dict[str, Resource]:
        if self.wildcard:
            return dict(available)
        return {name: available[name] for name in sorted(self.names) if name in available}


# --------------------------------------------------------------------------------------------
# State of the world


@dataclass
class _SotwType:
    sub: _Subscription = field(default_factory=_Subscription)
    nonce: str | None = None  # latest nonce sent for this type
    sent: dict[str, Resource] = field(default_factory=dict)  # what the last response held
    # a NACKed version stays the sent version: it is not sent again until the content changes
    sent_version: str | None = None


class SotwStream:
    """One StreamAggregatedResources stream."""

    def __init__(self) -> None:
        self._types: dict[str, _SotwType] = {}
        self._counter = 0

    def subscribed(self, type_url: str) -> bool:
        return type_url in self._types

    def on_request(self, request: DiscoveryRequest, resources: PopResources) -> StreamOutput:
        _check_type(request.type_url)
        type_url = request.type_url
        out = StreamOutput()
        state = self._types.get(type_url)
        nonce = request.response_nonce
        if state is not None and nonce and nonce != state.nonce:
            return out  # stale: answers a response that has since been superseded
        first = state is None
        if state is None:
            state = self._types[type_url] = _SotwType()
        names = set(request.resource_names)
        state.sub = _Subscription(
            wildcard=WILDCARD in names
            or (type_url in WILDCARD_TYPES and not names and (first or state.sub.wildcard)),
            names=names - {WILDCARD},
        )
        if nonce and nonce == state.nonce and state.sent_version is not None:
            version = state.sent_version
            if request.HasField("error_detail"):
                out.events.append(Nack(type_url, version, nonce, request.error_detail.message))
            else:
                out.events.append(Ack(type_url, version, nonce))
        wanted = state.sub.wanted(dict(resources.of_type(type_url)))
        must_answer = first and (state.sub.wildcard or bool(wanted))
        changed = self._send_if_needed(out, type_url, wanted, force=must_answer)
        if type_url == CLUSTER_TYPE:
            self._resend_endpoints(out, changed, resources)
        return out

    def on_resources(self, resources: PopResources) -> StreamOutput:
        out = StreamOutput()
        removals: list[tuple[str, dict[str, Resource]]] = []
        for type_url in PUSH_ORDER:
            state = self._types.get(type_url)
            if state is None:
                continue
            wanted = state.sub.wanted(dict(resources.of_type(type_url)))
            gone = set(state.sent) - set(wanted)
            if type_url in WILDCARD_TYPES and gone:
                # make before break: keep what goes away until everything else moved over
                keep = {name: state.sent[name] for name in gone}
                changed = self._send_if_needed(out, type_url, {**keep, **wanted})
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
        self, out: StreamOutput, clusters: set[str], resources: PopResources
    ) -> None:
        """Clusters changed: send EDS now, even unchanged (Envoy warms them until it arrives)."""
        state = self._types.get(ENDPOINT_TYPE)
        if state is None:
            return
        wanted = state.sub.wanted(dict(resources.of_type(ENDPOINT_TYPE)))
        self._send_if_needed(out, ENDPOINT_TYPE, wanted, force=bool(clusters & set(wanted)))

    def _send_if_needed(
        self, out: StreamOutput, type_url: str, wanted: dict[str, Resource], *, force: bool = False
    ) -> set[str]:
        """Send `wanted` unless the node was sent exactly that; the names that changed."""
        state = self._types[type_url]
        version = items_version({name: r.version for name, r in wanted.items()})
        unchanged = version == state.sent_version
        nothing_yet = state.sent_version is None and not wanted and not state.sub.wildcard
        if (unchanged or nothing_yet) and not force:
            return set()
        self._counter += 1
        nonce = str(self._counter)
        changed = {
            name
            for name, r in wanted.items()
            if name not in state.sent or state.sent[name].version != r.version
        }
        out.responses.append(SotwResponse(type_url, version, nonce, tuple(wanted.values())))
        state.nonce = nonce
        state.sent = wanted
        state.sent_version = version
        return changed


# --------------------------------------------------------------------------------------------
# Delta (incremental)


@dataclass
class _DeltaType:
    sub: _Subscription = field(default_factory=_Subscription)
    # name -> version the node holds, as far as we know: what it said it had, then what we sent
    # (a NACKed version stays here, so it is not sent again until it changes)
    has: dict[str, str] = field(default_factory=dict)


class DeltaStream:
    """One DeltaAggregatedResources stream."""

    def __init__(self) -> None:
        self._types: dict[str, _DeltaType] = {}
        self._pending: dict[str, DeltaResponse] = {}  # nonce -> response awaiting (N)ACK
        self._counter = 0

    def subscribed(self, type_url: str) -> bool:
        return type_url in self._types

    def on_request(self, request: DeltaDiscoveryRequest, resources: PopResources) -> StreamOutput:
        _check_type(request.type_url)
        type_url = request.type_url
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
        state = self._types.setdefault(type_url, _DeltaType())
        if answered is not None:
            if request.HasField("error_detail"):
                out.events.append(
                    Nack(type_url, answered.version, nonce, request.error_detail.message)
                )
            else:
                out.events.append(Ack(type_url, answered.version, nonce))
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        if first:
            state.has = dict(request.initial_resource_versions)
            state.sub.wildcard = WILDCARD in subscribe or (
                type_url in WILDCARD_TYPES and not subscribe
            )
        if WILDCARD in subscribe:
            state.sub.wildcard = True
        if WILDCARD in unsubscribe:
            state.sub.wildcard = False
        state.sub.names |= subscribe - {WILDCARD}
        state.sub.names -= unsubscribe
        for name in unsubscribe:
            state.has.pop(name, None)
        self._push_type(out, type_url, resources, force=first and state.sub.wildcard)
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
        available = dict(resources.of_type(type_url))
        wanted = state.sub.wanted(available)
        resend = self._warming_names(out) if type_url == ENDPOINT_TYPE else set()
        send: tuple[Resource, ...] = ()
        if updates:
            send = tuple(
                r
                for name, r in wanted.items()
                if name in resend or state.has.get(name) != r.version
            )
        removed: tuple[str, ...] = ()
        if removals:
            scope = set(state.has) if state.sub.wildcard else state.sub.names & set(state.has)
            removed = tuple(sorted(name for name in scope if name not in available))
        if not send and not removed and not force:
            return
        for item in send:
            state.has[item.name] = item.version
        for name in removed:
            state.has.pop(name, None)
        self._counter += 1
        nonce = str(self._counter)
        response = DeltaResponse(type_url, items_version(state.has), nonce, send, removed)
        self._pending[nonce] = response
        out.responses.append(response)

    @staticmethod
    def _warming_names(out: StreamOutput) -> set[str]:
        """Clusters sent earlier in this output: their endpoints go again (Envoy warming)."""
        return {
            item.name
            for response in out.responses
            if response.type_url == CLUSTER_TYPE
            for item in response.resources
        }
