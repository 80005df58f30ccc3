"""What the two ADS stream cores share (`sotw.py`: StreamAggregatedResources, `delta.py`:
DeltaAggregatedResources): what a stream writes and reports, its errors, the checks of a
request's type, nonce and names, and a subscription's view of a PoP's resources.

Both cores are sans-I/O: nothing touches gRPC, sockets or clocks. A stream object is fed each
DiscoveryRequest (or DeltaDiscoveryRequest) with the node's current `PopResources`
(`on_request`), and each newer `PopResources` of its PoP (`on_resources`); it returns a
`StreamOutput`: the responses to write, in order, and the ACK/NACK events seen. Rules (xDS
protocol, and the Envoy 1.40 traps in docs/architecture.md, "xDS behaviour of Envoy 1.40"):

- nonces are per stream; a request with `error_detail` is a NACK of the response with that nonce;
- a version is sent once: after a NACK nothing is re-sent until the content changes (no loop);
- pushes go in make-before-break order (CDS, EDS, LDS, RDS), removals last, in reverse;
- whenever clusters are (re)sent, EDS of those clusters is re-sent too, or Envoy keeps them
  warming for 15 s;
- only what a node subscribed to is sent (CDS/LDS may be wildcard); names that do not exist yet
  are remembered and sent when they appear.

Cost: everything that is the same for every stream of a PoP — a type's resources per
subscription, their versions, the diff between two generations of a PoP's resources — is
computed once per generation in `index.py` and shared. Per stream, a push or an ACK that
changes nothing compares object identities and version strings; a push that changes k resources
touches those k.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from control_plane.ads.index import ResourceSet, index
from control_plane.ads.limits import AdsLimits, clip
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    PUSH_ORDER,
    PopResources,
    Resource,
)

__all__ = [
    "NO_NAMES", "WILDCARD", "WILDCARD_TYPES", "Ack", "DeltaResponse", "Nack", "ProtocolError",
    "SotwResponse", "StreamOutput", "Subscription", "check_names", "check_nonce", "check_type",
    "short_name", "subscribed_view",
]

WILDCARD = "*"
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


def check_type(type_url: str, limits: AdsLimits) -> str:
    """The served type URL `type_url` names (the shared string)."""
    served = _SERVED_TYPES.get(type_url)
    if served is not None:
        return served
    if not type_url:
        raise ProtocolError("request without type_url")
    shown = clip(type_url, limits.name_chars)
    raise ProtocolError(f"unsupported type_url {shown!r}; Ballast serves {', '.join(PUSH_ORDER)}")


def check_nonce(nonce: str, limits: AdsLimits) -> None:
    if len(nonce) > limits.nonce_chars:
        raise ProtocolError(
            f"response_nonce of {len(nonce):,} characters; Ballast's nonces have at most "
            f"{limits.nonce_chars}"
        )


def check_names(names: Iterable[str], count: int, what: str, limits: AdsLimits) -> None:
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


NO_NAMES: frozenset[str] = frozenset()


class Subscription(Protocol):
    """A type's subscription on one stream: everything of the type, and/or these names."""

    wildcard: bool
    names: frozenset[str]


def subscribed_view(resources: PopResources, type_url: str, state: Subscription) -> ResourceSet:
    """What a type's subscription gets of `resources`: one shared object per (resources, type,
    subscription). The state then holds the view's own name set, so later lookups match by
    identity."""
    view = index(resources, type_url).view(state.wildcard, state.names)
    if not state.wildcard and view.scope is not None:
        state.names = view.scope
    return view
