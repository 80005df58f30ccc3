"""Translate the desired state into the Envoy resources of one PoP (pure: no I/O, no clocks).

Incremental: given the PoP's `previous` resources, a resource whose inputs are equal to the ones
it was built from is taken over as it is (same object, same bytes, same version); only the others
are translated and serialized. The inputs of each resource are exactly what its builder reads:

- Cluster `<group>.<tier>`: the origin group, the tier, the node capabilities;
- ClusterLoadAssignment `<group>.<tier>`: the origin group, its weights in this PoP, its sick
  origins (groups with session affinity);
- Listener (those the PoP serves): the desired listener (its certificates by name only), the
  PoP, the trusted priority
  sources, the access-log sample rate (nodes that asked for access logs), the HTTP filter types
  the node lacks, the origin groups of its virtual hosts (their tiers' overflow replies: group,
  tier, shed action, queue timeout; whether one has session affinity);
- Secret `<listener>.<certificate>` (SDS) of each TLS listener the PoP serves: the certificate
  (chain and key as read from its files);
- RouteConfiguration (`<listener>` and, with trusted priority sources, `<listener>.trusted`): the
  desired listener, the PoP, which of the two, the classification rules, the default tier, and
  per virtual host its origin group and that group's active tier actions, mirror and hedge share.

- Runtime `ballast_tiers` (RTDS): every group's lent limits (`runtime.py`).

A proxyless gRPC client (`caps.grpc`) gets its gRPC services instead, built by
`grpc_resources.py` with the same builder.

So a weight change re-builds the ClusterLoadAssignments of that group, a tier action the routes
and the runtime layer,
a desired-state edit the resources whose inputs it touched. Without `previous` every resource is
built: that full translation is the reference the incremental one is tested against (byte for
byte, `tests/test_translate_incremental.py`). What was built is kept with the resources
(`built_resources`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from envoy.config.route.v3.route_pb2 import RouteConfiguration
from google.protobuf.message import Message

from control_plane.desired.model import (
    Desired,
    GroupWeights,
    Listener,
    Mirror,
    OriginGroup,
    PopWeights,
    Tier,
    TierActions,
)
from control_plane.translate.clusters import cluster_name, tier_cluster
from control_plane.translate.endpoints import load_assignment
from control_plane.translate.grpc_resources import grpc_resources
from control_plane.translate.listeners import listener, trusted_route_name
from control_plane.translate.mirror import (
    has_mirror,
    mirror_cluster,
    mirror_cluster_name,
    mirror_load_assignment,
)
from control_plane.translate.overflow import overflow_of
from control_plane.translate.queue_policy import choose_queue_policy
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    RUNTIME_TYPE,
    SECRET_TYPE,
    Capabilities,
    PopResources,
    Resource,
)
from control_plane.translate.routes import route_configuration
from control_plane.translate.runtime import RUNTIME_LAYER, tier_runtime
from control_plane.translate.secrets import secret
from control_plane.translate.weights import resolve_weights

ResourceKey = tuple[str, str]  # (type URL, name)
_INPUTS = "translate:inputs"  # derived slot: ResourceKey -> the inputs it was built from
_BUILT = "translate:built"  # derived slot: the ResourceKeys translated for these resources
_POP_INPUTS = "translate:pop_inputs"  # derived slot: the `_PopInputs` it was translated from


class UnknownPop(LookupError):
    """A PoP the desired state does not define."""


@dataclass(frozen=True)
class _Built:
    inputs: tuple[object, ...]
    resource: Resource
    note: str | None = None  # a capability fallback said about it (clusters)


class _Builder:
    """Takes a resource over from the previous resources when its inputs are equal."""

    def __init__(self, previous: PopResources | None, *, carry: bool = False) -> None:
        """`carry`: every resource of `previous` is kept unless replaced (else only those
        asked for)."""
        self._previous: Mapping[ResourceKey, _Built] = (
            {} if previous is None else previous.derived(_INPUTS, lambda _: {})
        )
        self.kept: dict[ResourceKey, _Built] = dict(self._previous) if carry else {}
        self.built: list[ResourceKey] = []
        # one object per equal model part, so later comparisons are identity checks
        self._canonical: dict[int, object] = {}

    def canonical(self, old: object | None, new: object) -> object:
        """`old` when it equals `new` (compared once per call), else `new`."""
        if old is None or old is new:
            return new
        known = self._canonical.get(id(new))
        if known is None:
            known = old if old == new else new
            self._canonical[id(new)] = known
        return known

    def resource(self, type_url: str, name: str, inputs: tuple[object, ...],
                 build: Callable[[], tuple[Message, str | None]]) -> _Built:
        """The previous translation's resource when `inputs` equal its inputs, else `build()`."""
        key = (type_url, name)
        before = self._previous.get(key)
        if before is not None and before.inputs == inputs:
            self.kept[key] = before
            return before
        message, note = build()
        made = self.kept[key] = _Built(inputs, Resource.of(type_url, name, message), note)
        self.built.append(key)
        return made

    def previous_input(self, type_url: str, name: str, index: int) -> object | None:
        before = self._previous.get((type_url, name))
        return None if before is None or len(before.inputs) <= index else before.inputs[index]


@dataclass(frozen=True)
class PopIntent:
    """Everything one PoP's translation takes from the running intent: the one value the
    running intent hands over (`RunningIntent.for_pop`), so `serve`, `plan`, `render` and
    `validate` all translate the same inputs. Empty: the desired state as written (home
    weights, no tier actions, no mirror).

    `weights`: origin group -> origin -> weight (sum 100); a group missing from it is at its
    home weights. `tier_actions`: origin group -> the tier actions active in this PoP
    (demotion, shedding; `routes.py`) change the routes; lent limits the runtime layer
    (`runtime.py`). `mirrors`: origin group -> its active cache-warming mirror (`mirror.py`);
    only the routes change (the mirror clusters of every standby are always there). `sick`:
    origin group with session affinity -> the origins its sessions may not stay on (their
    endpoints are not marked HEALTHY, `endpoints.py`). `hedges`: the routes change.
    """

    weights: Mapping[str, GroupWeights] = field(default_factory=dict)
    tier_actions: Mapping[str, TierActions] = field(default_factory=dict)
    mirrors: Mapping[str, Mirror] = field(default_factory=dict)
    sick: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # origin group -> per million of its hedged tiers' requests that may hedge while a standby
    # is guarded by its ramp (`decide/ramp.py` `hedge_share`; `routes.py` `hedged_routes`)
    hedges: Mapping[str, int] = field(default_factory=dict)


def translate_pop(
    desired: Desired,
    pop: str,
    caps: Capabilities,
    intent: PopIntent | None = None,
    *,
    previous: PopResources | None = None,
) -> PopResources:
    """Clusters and endpoints per (origin group, tier), listeners and routes, for one PoP,
    under `intent` (what the running intent holds for it; None: the desired state as written).

    `caps` decides adaptive LIFO vs FIFO; every fallback is in `notes`. `previous`: this PoP's
    last translation, whose resources are reused where their inputs did not change (see the
    module docstring). The Cluster message carries field 62 (queue policy) among its unknown
    fields, so its payload, version and re-serializations include it. Raises `UnknownPop` for
    a PoP not in `desired` and `WeightsError` for weights that do not fit it.
    """
    if pop not in desired.pop_names:
        raise UnknownPop(f"unknown PoP {pop!r}; known: {', '.join(desired.pop_names)}")
    held = intent or PopIntent()
    inputs = _PopInputs(desired, caps, resolve_weights(desired, pop, held.weights),
                        dict(held.tier_actions), dict(held.mirrors),
                        {g: sick for g, sick in held.sick.items() if sick}, dict(held.hedges))
    if caps.grpc is not None:  # a proxyless gRPC client: its gRPC services, nothing else
        make = _Builder(previous if previous is not None and previous.pop == pop else None)
        by_type, notes = grpc_resources(desired, caps.grpc, inputs.weights, make)
        return _finish(pop, inputs, make, notes, by_type)
    last = None if previous is None or previous.pop != pop else previous.derived(
        _POP_INPUTS, lambda _: None)
    if previous is not None and last is not None and last.desired is desired \
            and last.caps == caps:
        return _changed_weights_or_actions(previous, last, inputs)
    return _translate(pop, inputs, _Builder(previous))


@dataclass(frozen=True)
class _PopInputs:
    """Everything a PoP's translation reads (kept with the resources as `_POP_INPUTS`)."""

    desired: Desired
    caps: Capabilities
    weights: PopWeights  # resolved: every group
    actions: Mapping[str, TierActions]
    mirrors: Mapping[str, Mirror]
    sick: Mapping[str, frozenset[str]]  # groups with affinity: origins sessions may not stay on
    hedges: Mapping[str, int]  # groups whose hedging a ramp guards: per million that may hedge


def _translate(pop: str, inputs: _PopInputs, make: _Builder) -> PopResources:
    """Every resource, each taken over from the previous translation when its inputs are equal."""
    desired = inputs.desired
    the_pop = desired.pop(pop)
    clusters: dict[str, Resource] = {}
    endpoints: dict[str, Resource] = {}
    notes: list[str] = []
    groups: dict[str, object] = {}
    for group in desired.origin_groups:
        for tier in group.tiers:
            name = cluster_name(group.name, tier.name)
            # the previous translation's equal group object, so the comparisons below are cheap
            same = make.canonical(make.previous_input(CLUSTER_TYPE, name, 0), group)
            groups.setdefault(group.name, same)
            cluster = make.resource(
                CLUSTER_TYPE, name, (same, tier, inputs.caps),
                lambda name=name, group=group, tier=tier: _cluster(name, group, tier,
                                                                   inputs.caps),
            )
            clusters[name] = cluster.resource
            if cluster.note is not None:
                notes.append(cluster.note)
            endpoints[name] = _endpoints(make, name, same, group, inputs.weights[group.name],
                                         inputs.sick.get(group.name, frozenset()))
        for origin in group.preference[pop][1:] if has_mirror(group) else ():
            name = mirror_cluster_name(group.name, origin)
            clusters[name] = make.resource(
                CLUSTER_TYPE, name, (groups[group.name], origin),
                lambda group=group, origin=origin: (mirror_cluster(group, origin), None),
            ).resource
            endpoints[name] = make.resource(
                ENDPOINT_TYPE, name, (groups[group.name], origin),
                lambda group=group, origin=origin: (mirror_load_assignment(group, origin), None),
            ).resource
    trusted = desired.trusted_priority_sources
    sample = desired.access_log.sample_rate if inputs.caps.access_log else None
    missing = inputs.caps.missing_filters
    listeners: dict[str, Resource] = {}
    secrets: dict[str, Resource] = {}
    for item in _served(desired, pop):
        groups_served = [desired.group(v.origin_group) for v in item.virtual_hosts]
        served = overflow_of(groups_served)
        sessions = any(g.affinity is not None for g in groups_served)
        built = make.resource(
            LISTENER_TYPE, item.name,
            (item.shape, the_pop, trusted, sample, missing, served, sessions),
            lambda item=item, served=served, sessions=sessions: listener(
                item, the_pop, trusted, sample, missing, served, sessions),
        )
        listeners[item.name] = built.resource
        if built.note is not None:
            notes.append(built.note)
        for certificate in item.tls.certificates if item.tls is not None else ():
            secrets[certificate.secret_name] = make.resource(
                SECRET_TYPE, certificate.secret_name, (certificate,),
                lambda certificate=certificate: (secret(certificate), None),
            ).resource
    routes = _routes(make, pop, inputs, groups)
    return _finish(pop, inputs, make, notes, {
        CLUSTER_TYPE: clusters,
        ENDPOINT_TYPE: endpoints,
        SECRET_TYPE: secrets,
        LISTENER_TYPE: listeners,
        ROUTE_TYPE: routes,
        RUNTIME_TYPE: _runtime(make, inputs),
    })


def _served(desired: Desired, pop: str) -> list[Listener]:
    """The listeners `pop` serves (a listener's `pops`, default every PoP)."""
    return [item for item in desired.listeners if item.served_in(pop)]


def _changed_weights_or_actions(
    previous: PopResources, last: _PopInputs, inputs: _PopInputs
) -> PopResources:
    """Same desired state and capabilities as `previous`: only the ClusterLoadAssignments of
    groups whose weights changed and, when tier actions changed, the routes are looked at."""
    make = _Builder(previous, carry=True)
    by_type = dict(previous.by_type)
    desired = inputs.desired
    moved = [g for g in desired.origin_groups if inputs.weights[g.name] != last.weights[g.name]
             or inputs.sick.get(g.name) != last.sick.get(g.name)]
    if moved:
        endpoints = dict(previous.of_type(ENDPOINT_TYPE))
        for group in moved:
            for tier in group.tiers:
                name = cluster_name(group.name, tier.name)
                same = make.previous_input(ENDPOINT_TYPE, name, 0) or group
                endpoints[name] = _endpoints(make, name, same, group, inputs.weights[group.name],
                                             inputs.sick.get(group.name, frozenset()))
        by_type[ENDPOINT_TYPE] = endpoints
    if inputs.actions != last.actions:
        by_type[RUNTIME_TYPE] = _runtime(make, inputs)
    if (inputs.actions != last.actions or inputs.mirrors != last.mirrors
            or inputs.hedges != last.hedges):
        groups = {
            g.name: make.previous_input(CLUSTER_TYPE, cluster_name(g.name, g.tiers[0].name), 0)
            or g
            for g in desired.origin_groups if g.tiers
        }
        by_type[ROUTE_TYPE] = _routes(make, previous.pop, inputs, groups)
    return _finish(previous.pop, inputs, make, list(previous.notes), by_type)


def _endpoints(
    make: _Builder, name: str, same: object, group: OriginGroup, weights: GroupWeights,
    sick: frozenset[str],
) -> Resource:
    return make.resource(
        ENDPOINT_TYPE, name, (same, weights, sick),
        lambda: (load_assignment(name, group, weights, sick), None),
    ).resource


def _routes(
    make: _Builder, pop: str, inputs: _PopInputs, groups: Mapping[str, object]
) -> dict[str, Resource]:
    """Each listener's route configuration, then (with trusted priority sources) each one's
    `<listener>.trusted` configuration."""
    desired, actions, mirrors, hedges = (inputs.desired, inputs.actions, inputs.mirrors,
                                         inputs.hedges)
    routes: dict[str, Resource] = {}
    for trusted in (False, True) if desired.trusted_priority_sources else (False,):
        for item in _served(desired, pop):
            if item.redirect_to_https:
                continue  # its one route is inline (`listeners.py`)
            name = trusted_route_name(item.name) if trusted else item.name
            left_out = _left_out(item, inputs.caps.missing_filters)
            routes[name] = make.resource(
                ROUTE_TYPE, name,
                (item.shape, pop, trusted, desired.classification, desired.default_tier,
                 tuple((groups.get(v.origin_group), actions.get(v.origin_group),
                        mirrors.get(v.origin_group), hedges.get(v.origin_group))
                       for v in item.virtual_hosts), left_out),
                lambda item=item, trusted=trusted, left_out=left_out: (
                    _without_configs_of(route_configuration(
                        desired, item, pop, actions, trusted=trusted, mirrors=mirrors,
                        hedges=hedges), left_out),
                    None),
            ).resource
    return routes


def _left_out(item: Listener, missing: frozenset[str]) -> frozenset[str]:
    """The names of the listener's added filters the node's Envoy lacks (`listeners.py` leaves
    them out, so their per-route configs go too)."""
    return frozenset(f.name for f in item.http_filters if f.type_name in missing)


def _without_configs_of(routes: RouteConfiguration, filters: frozenset[str]) -> Message:
    for host in routes.virtual_hosts if filters else ():
        for name in filters:
            if name in host.typed_per_filter_config:
                del host.typed_per_filter_config[name]
    return routes


def _finish(
    pop: str, inputs: _PopInputs, make: _Builder, notes: list[str],
    by_type: Mapping[str, Mapping[str, Resource]],
) -> PopResources:
    resources = PopResources(pop=pop, capabilities=inputs.caps, by_type=by_type,
                             notes=tuple(notes))
    resources.derived(_INPUTS, lambda _: make.kept)
    resources.derived(_BUILT, lambda _: tuple(make.built))
    resources.derived(_POP_INPUTS, lambda _: inputs)
    return resources


def _runtime(make: _Builder, inputs: _PopInputs) -> dict[str, Resource]:
    groups = {g.name: g for g in inputs.desired.origin_groups}
    slots = tuple(sorted((g, s.limits, s.pending_limits) for g, a in inputs.actions.items()
                         if (s := a.with_floors(groups[g])).limits or s.pending_limits))
    return {RUNTIME_LAYER: make.resource(
        RUNTIME_TYPE, RUNTIME_LAYER, (slots,),
        lambda: (tier_runtime(inputs.actions, groups), None),
    ).resource}


def _cluster(
    name: str, group: OriginGroup, tier: Tier, caps: Capabilities
) -> tuple[Message, str | None]:
    choice = choose_queue_policy(name, tier, caps)
    return (tier_cluster(group, tier, choice, per_endpoint_stats=not caps.load_reports),
            choice.fallback_note)


def built_resources(resources: PopResources) -> tuple[ResourceKey, ...]:
    """The (type URL, name) of every resource translated (not taken over) for these resources."""
    return resources.derived(_BUILT, lambda r: tuple(
        (type_url, name) for type_url, items in r.by_type.items() for name in items
    ))
