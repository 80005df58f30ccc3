"""The RouteConfiguration of a listener: classification rules, in order, route to tier clusters.

Each virtual host (one origin group) gets one route per classification rule (path prefix and
header matchers -> `<group>.<tier>`), then a catch-all `/` to the default tier (fail safe).

Timeouts per tier (the tiers source):
- per_try_timeout = read_timeout (one attempt's time to answer);
- timeout = queue_timeout + read_timeout x (retries + 1): the time a request may wait in the
  tier's pending queue plus every attempt; backoff waits (each at most 250 ms) come out of it.
Retries: `retry_on: 5xx,connect-failure,reset`, `num_retries` = the tier's retries, Envoy's
fully jittered exponential backoff (base 25 ms, max 250 ms), and a retry goes to another host
when there is one, in every tier, so a retry leaves a failing origin: the `previous_hosts`
predicate rejects a host an earlier attempt of the request used, and host selection is retried
up to `HOST_SELECTION_ATTEMPTS` (100) times. With one host per origin locality at 95/5, 3
attempts left 45 of 60 normal-tier retries on the failing primary (0.95^3 = 86 % stay); 100
leave 0.95^100 = 0.6 % there (measured through Envoy 1.40 in `tests/test_attribution_envoy.py`,
`test_retries_leave_a_failing_origin_in_every_tier`:
every retry of the critical and normal tiers reached the standby). When every host has been
tried (the critical tier's third attempt with two origins), Envoy takes the last draw anyway.
`previous_priorities` would need the origins in separate priorities, which the weighted split
does not use.
A tier without retries (the tiers source's background, `retryBudget: 0`) still gets one retry of
an attempt no origin served (`clusters.unserved_retry`: when the group has another origin):
`retry_on: connect-failure,refused-stream,reset-before-request,retriable-status-codes` with
`retriable_status_codes: [503]` — a connection refused or not made, a stream refused, a request
reset before it went out, or a 503, the status an origin declines a request with (RFC 9110
15.6.4: overload, a connection cap, maintenance; nginx's `limit_conn` answers it). None of them
did the request's work, so the retry adds no origin work: the request is served once, at another
origin (the same predicate), like gRPC's transparent retry of an RPC no server processed. A 500,
a 502, a 504, a reset after the request went out may follow work and stay final, as the source
wants for that tier. The retry counts against the tier's retry budget like any other (the
cluster's `min_retry_concurrency` lets an idle pool spend one, `clusters.py`); the route timeout
stays the tier's (a declined attempt takes no read time). Measured in `flap`: the cold standby's
connection cap refused 163 of 3,279 image revalidations (seeds 911-913), each one lost before;
with this retry none was lost to a refusal (seed 1290: 17 before, 0 after).

Hedging (the tiers source "50ms for P0 before we attempt hedging to a secondary origin"), for a tier
with `hedge_delay`: Envoy's `hedge_policy.hedge_on_per_try_timeout` with `per_try_timeout` =
the hedge delay. Measured on Envoy 1.40: when an attempt has not answered within the delay,
Envoy sends another attempt (after the retry backoff) without cancelling the first, answers with
whichever responds first and resets the other; the delay starts when the attempt is sent on a
connection, not while it waits in the tier's pending queue. Each hedge is one of the tier's
retries: counted in `upstream_rq_retry`, capped by `num_retries` and refused by the cluster's
retry budget (`upstream_rq_retry_overflow`) beyond it. A stalled attempt is still bounded by
the read timeout, as `per_try_idle_timeout` (no byte for that long ends it). A hedge, like any
retry, reaches the other origin despite a 95/5 weight split (see Retries).
Envoy adds `x-envoy-attempt-count` toward the origin, so it can tell a hedge (2, 3) apart.
Hedges respect the standby ramp: while a standby of the group is cold (at its warm pool) or
ramping, only its headroom may reach it through hedges, so each hedging route is split
(`hedged_routes`, share from `decide/ramp.py` `hedge_share`): a copy `<route>-hedged` for that
share of the requests (`runtime_fraction`) hedges, the route itself does not (measured through
Envoy 1.40: docs/benchmarks.md, "Hedges respect the ramp").
The request header `x-ballast-tier: <tier>` (overwriting any client value) tells the origin and
operators how a request was classified.

Priority that survives sub-requests (the tiers source: "tagging downstream sub-requests with the
parent's priority"): an origin that fetches a dependency through the edge while serving a
request copies that request's `x-ballast-tier` onto the sub-request. Connections from
`trusted_priority_sources` get the route configuration `<listener>.trusted` (`listeners.py`),
whose first routes, one per tier, send a request whose `x-ballast-tier` names a tier of the group
to that tier, before any classification rule; any other value falls through to the rules. Every
other connection gets the plain configuration, where the header is ignored and overwritten, so
an untrusted client cannot pick its own tier.

Tier actions (adaptive re-prioritization, the tiers source), when active for the group in this PoP:
- shedding (the re-prioritization's shed tier and the tiers shed for utilization) does not
  touch the routes: a shed tier keeps its floor, and its cluster's limits (the runtime layer,
  `runtime.py`) answer the rest at once with its `shed_action` (`overflow.py`);
- demotion: the routes of the demoted tier get `weighted_clusters`: `demote_share` percent to
  the `demote_to` tier's cluster, the rest to their own; each part says the tier that serves it
  in `x-ballast-tier`, and the demoted part also `x-ballast-demoted-from: <tier>`. Timeouts and
  retries stay those of the route's own tier (the client's deadline does not change). While the
  `demote_to` tier is shed (its pool is at its floor: a demoted request could not get through),
  the demoted share is answered at the edge instead (the tiers source's admission order: background
  first, then the demoted share, then the rest of the tier): each route of the demoted tier is
  preceded by `<name>@shed/<group>/<tier>` (`shed_route_name`: an access log counts what it
  answered against the tier it shed, the rollout gates' shed rate), matching the same requests
  with a `runtime_fraction` of `demote_share` percent (drawn per request), whose
  `direct_response` carries the demoted tier's own `shed_action` — `reject` 503; `defer` 202
  (the client may do the work later); `stale` 503 with `x-ballast-serve-stale: 1` and
  `cache-control: no-store`, which tells a cache in front to answer with its stale copy (e.g.
  nginx `proxy_cache_use_stale http_503`) and never to store the 503 itself — with `retry-after`
  = the recovery time in seconds and `x-ballast-shed: <tier>`; nothing reaches an origin.

A cache-warming mirror, when active for the group in this PoP, puts a GET/HEAD copy with
`request_mirror_policies` before each cacheable route (`mirror.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.core.v3.base_pb2 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    RuntimeFractionalPercent,
)
from envoy.config.route.v3.route_components_pb2 import (
    DirectResponseAction,
    HeaderMatcher,
    HedgePolicy,
    RetryPolicy,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
    WeightedCluster,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.retry.host.previous_hosts.v3.previous_hosts_pb2 import (
    PreviousHostsPredicate,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf.any_pb2 import Any

from control_plane.desired.model import (
    SHED_STATUS,
    ClassificationRule,
    Desired,
    HeaderMatch,
    Listener,
    Mirror,
    OriginGroup,
    Tier,
    TierActions,
)
from control_plane.desired.model import VirtualHost as DesiredVirtualHost
from control_plane.translate.affinity import STATEFUL_SESSION_FILTER, session_per_host
from control_plane.translate.clusters import cluster_name, unserved_retry
from control_plane.translate.listeners import trusted_route_name
from control_plane.translate.mirror import mirrored_routes
from control_plane.translate.proto_values import duration_ms, packed

TIER_HEADER = "x-ballast-tier"
POP_HEADER = "x-ballast-pop"  # tells origins (and their logs) which PoP a request came through
RETRY_ON = "5xx,connect-failure,reset"
# a tier without retries: only attempts no origin served (`clusters.unserved_retry`)
UNSERVED_RETRY_ON = "connect-failure,refused-stream,reset-before-request,retriable-status-codes"
DECLINED_STATUS = 503
RETRY_BASE_INTERVAL_MS = 25
RETRY_MAX_INTERVAL_MS = 250
PREVIOUS_HOSTS_PREDICATE = "envoy.retry_host_predicates.previous_hosts"
# Every tier: with 95/5 weights, 100 draws all land on the tried origin with p = 0.95^100.
HOST_SELECTION_ATTEMPTS = 100
CATCH_ALL_ROUTE = "default"
DEMOTED_HEADER = "x-ballast-demoted-from"
SHED_HEADER = "x-ballast-shed"
TRUSTED_ROUTE_PREFIX = "trusted-"  # the trusted routes are named trusted-<tier>
SERVE_STALE_HEADER = "x-ballast-serve-stale"
HEDGED_ROUTE_SUFFIX = "-hedged"
SHED_ROUTE_MARK = "@shed/"  # `<rule>@shed/<group>/<tier>`: a shed route (`shed_route_name`)
DEMOTED_SHED_KEY = "ballast.demoted_shed"  # its runtime key: <key>.<group>.<tier>


def route_timeout_ms(tier: Tier) -> int:
    return tier.queue_timeout_ms + tier.read_timeout_ms * (tier.retries + 1)


def route_configuration(
    desired: Desired,
    listener: Listener,
    pop: str,
    tier_actions: Mapping[str, TierActions] | None = None,
    *,
    trusted: bool = False,
    mirrors: Mapping[str, Mirror] | None = None,
    hedges: Mapping[str, int] | None = None,
) -> RouteConfiguration:
    """`tier_actions`: origin group -> the tier actions active for it in this PoP. `trusted`:
    the configuration for connections from trusted sources (named `<listener>.trusted`).
    `mirrors`: origin group -> its active cache-warming mirror (`mirror.py`). `hedges`: origin
    group -> the share (per million) of its hedged tiers' requests that may hedge while a
    standby is guarded by its ramp (`hedged_routes`); a group absent hedges every request."""
    actions = tier_actions or {}
    active = mirrors or {}
    guarded = hedges or {}
    return RouteConfiguration(
        name=trusted_route_name(listener.name) if trusted else listener.name,
        virtual_hosts=[
            _virtual_host(desired, vhost, actions.get(vhost.origin_group), trusted,
                          active.get(vhost.origin_group), guarded.get(vhost.origin_group))
            for vhost in listener.virtual_hosts
        ],
        request_headers_to_add=[_overwrite(POP_HEADER, pop)],
    )


def _virtual_host(
    desired: Desired, vhost: DesiredVirtualHost, actions: TierActions | None, trusted: bool,
    mirror: Mirror | None = None, hedge_share: int | None = None,
) -> VirtualHost:
    group = desired.group(vhost.origin_group)
    if actions is not None:
        check_tier_actions(group, actions)
    routes = [
        route
        for tier in (group.tiers if trusted else ())
        for route in _routes(f"{TRUSTED_ROUTE_PREFIX}{tier.name}", _trusted_match(tier), group,
                             tier, actions)
    ]
    routes += [
        route
        for rule in desired.classification
        for route in _routes(rule.name, _match(rule), group, group.tier(rule.tier), actions)
    ]
    routes += _routes(CATCH_ALL_ROUTE, RouteMatch(prefix="/"), group,
                      group.tier(desired.default_tier), actions)
    if mirror is not None:
        routes = [each for route in routes for each in mirrored_routes(group.name, route, mirror)]
    if hedge_share is not None:
        routes = [each for route in routes for each in hedged_routes(route, hedge_share)]
    host = VirtualHost(name=vhost.name, domains=list(vhost.domains), routes=routes,
                       include_request_attempt_count=True)
    if group.affinity is not None:
        host.typed_per_filter_config[STATEFUL_SESSION_FILTER].CopyFrom(
            session_per_host(group.affinity))
    for config in vhost.typed_per_filter_config:  # operator-added filters' per-route configs
        host.typed_per_filter_config[config.name].CopyFrom(
            Any(type_url=config.type_url, value=config.config))
    return host


def check_tier_actions(group: OriginGroup, actions: TierActions) -> None:
    """ValueError when the actions name a tier the group does not have."""
    names = {tier.name for tier in group.tiers}
    named = (actions.demote_tier, actions.demote_to, *actions.shed, *dict(actions.limits))
    for tier in named:
        if tier is not None and tier not in names:
            raise ValueError(f"tier actions of group {group.name!r} name tier {tier!r}, "
                             f"which it does not have (tiers: {', '.join(sorted(names))})")


def _trusted_match(tier: Tier) -> RouteMatch:
    return RouteMatch(
        prefix="/",
        headers=[HeaderMatcher(name=TIER_HEADER, string_match=StringMatcher(exact=tier.name))],
    )


def _match(rule: ClassificationRule) -> RouteMatch:
    return RouteMatch(
        prefix=rule.path_prefix or "/",
        headers=[_header_matcher(header) for header in rule.headers],
    )


def _header_matcher(header: HeaderMatch) -> HeaderMatcher:
    if header.kind == "present":
        return HeaderMatcher(name=header.name, present_match=True)
    string_match = {
        "exact": StringMatcher(exact=header.value),
        "prefix": StringMatcher(prefix=header.value),
        "contains": StringMatcher(contains=header.value),
    }[header.kind]
    return HeaderMatcher(name=header.name, string_match=string_match)


def _routes(
    name: str, match: RouteMatch, group: OriginGroup, tier: Tier, actions: TierActions | None
) -> list[Route]:
    """The route of one rule; while the rule's tier is demoted into a shed tier, preceded by
    the route that answers the demoted share at the edge."""
    route = _route(name, match, group, tier, actions)
    if actions is None or not _demoted_tier(actions, tier) or actions.demote_to not in \
            actions.shed:
        return [route]
    shed = _shed_route(shed_route_name(name, group.name, tier.name), match, tier,
                       actions.retry_after_s)
    shed.match.runtime_fraction.CopyFrom(RuntimeFractionalPercent(
        default_value=FractionalPercent(numerator=actions.demote_share,
                                        denominator=FractionalPercent.HUNDRED),
        runtime_key=f"{DEMOTED_SHED_KEY}.{group.name}.{tier.name}"))
    return [shed, route]


def _demoted_tier(actions: TierActions, tier: Tier) -> bool:
    return (actions.demote_tier == tier.name and actions.demote_to is not None
            and actions.demote_share > 0)


def _route(
    name: str, match: RouteMatch, group: OriginGroup, tier: Tier, actions: TierActions | None
) -> Route:
    action = RouteAction(
        timeout=duration_ms(route_timeout_ms(tier)),
        retry_policy=_retry_policy(group, tier),
    )
    if tier.hedge_delay_ms:
        action.hedge_policy.CopyFrom(HedgePolicy(hedge_on_per_try_timeout=True))
    if actions is not None and _demoted_tier(actions, tier) and actions.demote_to is not None \
            and actions.demote_to not in actions.shed:
        action.weighted_clusters.CopyFrom(
            _demoted(group.name, tier.name, actions.demote_to, actions.demote_share)
        )
        return Route(name=name, match=match, route=action)
    action.cluster = cluster_name(group.name, tier.name)
    return Route(
        name=name,
        match=match,
        route=action,
        request_headers_to_add=[_overwrite(TIER_HEADER, tier.name)],
    )


def _demoted(group: str, tier: str, to: str, share: int) -> WeightedCluster:
    """`share` percent to the `to` tier's cluster, the rest stays; zero-weight parts left out."""
    parts = [
        WeightedCluster.ClusterWeight(
            name=cluster_name(group, tier),
            request_headers_to_add=[_overwrite(TIER_HEADER, tier)],
        ),
        WeightedCluster.ClusterWeight(
            name=cluster_name(group, to),
            request_headers_to_add=[_overwrite(TIER_HEADER, to), _overwrite(DEMOTED_HEADER, tier)],
        ),
    ]
    parts[0].weight.value = 100 - share
    parts[1].weight.value = share
    return WeightedCluster(clusters=[part for part in parts if part.weight.value > 0])


def _shed_route(name: str, match: RouteMatch, tier: Tier, retry_after_s: int) -> Route:
    """The demoted share of `tier` answered at the edge with its `shed_action`."""
    headers = [_overwrite("retry-after", str(retry_after_s)), _overwrite(SHED_HEADER, tier.name)]
    if tier.shed_action == "stale":
        headers += [_overwrite(SERVE_STALE_HEADER, "1"), _overwrite("cache-control", "no-store")]
    later = "accepted; do it" if tier.shed_action == "defer" else "retry"
    return Route(
        name=name,
        match=match,
        direct_response=DirectResponseAction(
            status=SHED_STATUS[tier.shed_action],
            body=DataSource(inline_string=f"shed: part of tier {tier.name} is demoted while "
                            f"the origin is under stress; {later} in {retry_after_s} s\n"),
        ),
        response_headers_to_add=headers,
    )


def shed_route_name(rule: str, group: str, tier: str) -> str:
    """A shed route's name: its rule's, then the group and tier it sheds (`<rule>@shed/<group>/
    <tier>`). Envoy's access log names the route that answered a request, so a shed request is
    counted against its (group, tier) (`observe/access_log.py`)."""
    return f"{rule}{SHED_ROUTE_MARK}{group}/{tier}"


def shed_of_route(name: str) -> tuple[str, str] | None:
    """(group, tier) a shed route's name (`shed_route_name`) names; None for any other."""
    _, mark, rest = name.partition(SHED_ROUTE_MARK)
    group, slash, tier = rest.partition("/")
    if not mark or not slash or not group or not tier or "/" in tier:
        return None
    return group, tier


def hedged_routes(route: Route, share: int) -> list[Route]:
    """A hedging route split by `share` (per million of its requests): a copy named
    `<route>-hedged` matching that share (`runtime_fraction`) keeps the hedge, then the route
    itself without it (its attempts wait `read_timeout`, its retries still leave a failing
    origin). Routes that do not hedge are left as they are."""
    if route.WhichOneof("action") != "route" or not route.route.HasField("hedge_policy"):
        return [route]
    base = Route()
    base.CopyFrom(route)
    base.route.ClearField("hedge_policy")
    base.route.retry_policy.ClearField("per_try_idle_timeout")
    base.route.retry_policy.per_try_timeout.CopyFrom(
        route.route.retry_policy.per_try_idle_timeout)
    if share <= 0:
        return [base]
    copy = Route()
    copy.CopyFrom(route)
    copy.name = route.name + HEDGED_ROUTE_SUFFIX
    copy.match.runtime_fraction.CopyFrom(RuntimeFractionalPercent(
        default_value=FractionalPercent(numerator=share, denominator=FractionalPercent.MILLION)))
    return [copy, base]


def _overwrite(name: str, value: str) -> HeaderValueOption:
    """A header that replaces whatever value was there (the client's, or the origin's)."""
    return HeaderValueOption(
        header=HeaderValue(key=name, value=value),
        append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _retry_policy(group: OriginGroup, tier: Tier) -> RetryPolicy:
    unserved = unserved_retry(group, tier)
    policy = RetryPolicy(
        retry_on=UNSERVED_RETRY_ON if unserved else RETRY_ON,
        per_try_timeout=duration_ms(tier.read_timeout_ms),
        retry_back_off=RetryPolicy.RetryBackOff(
            base_interval=duration_ms(RETRY_BASE_INTERVAL_MS),
            max_interval=duration_ms(RETRY_MAX_INTERVAL_MS),
        ),
        retry_host_predicate=[
            RetryPolicy.RetryHostPredicate(
                name=PREVIOUS_HOSTS_PREDICATE, typed_config=packed(PreviousHostsPredicate())
            )
        ],
        host_selection_retry_max_attempts=HOST_SELECTION_ATTEMPTS,
    )
    policy.num_retries.value = tier.retries
    if unserved:
        policy.retriable_status_codes.append(DECLINED_STATUS)
        policy.num_retries.value = 1
    if tier.hedge_delay_ms:
        policy.per_try_timeout.CopyFrom(duration_ms(tier.hedge_delay_ms))
        policy.per_try_idle_timeout.CopyFrom(duration_ms(tier.read_timeout_ms))
    return policy
