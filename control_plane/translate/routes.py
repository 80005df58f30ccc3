"""The RouteConfiguration of a listener: classification rules, in order, route to tier clusters.

Each virtual host (one origin group) gets one route per classification rule (path prefix and
header matchers -> `<group>.<tier>`), then a catch-all `/` to the default tier (fail safe).

Timeouts per tier (seed 000):
- per_try_timeout = read_timeout (one attempt's time to answer);
- timeout = queue_timeout + read_timeout x (retries + 1): the time a request may wait in the
  tier's pending queue plus every attempt; backoff waits (each at most 250 ms) come out of it.
Retries: `retry_on: 5xx,connect-failure,reset`, `num_retries` = the tier's retries, Envoy's
fully jittered exponential backoff (base 25 ms, max 250 ms), and a retry goes to another host
when there is one (previous_hosts), so a retry leaves a failing origin.
The request header `x-ballast-tier: <tier>` (overwriting any client value) tells the origin and
operators how a request was classified.
"""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.config.route.v3.route_components_pb2 import (
    HeaderMatcher,
    RetryPolicy,
    Route,
    RouteAction,
    RouteMatch,
    VirtualHost,
)
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.extensions.retry.host.previous_hosts.v3.previous_hosts_pb2 import (
    PreviousHostsPredicate,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher

from control_plane.desired.model import (
    ClassificationRule,
    Desired,
    HeaderMatch,
    Listener,
    Tier,
)
from control_plane.desired.model import VirtualHost as DesiredVirtualHost
from control_plane.translate.clusters import cluster_name
from control_plane.translate.proto_values import duration_ms, packed

TIER_HEADER = "x-ballast-tier"
POP_HEADER = "x-ballast-pop"  # tells origins (and their logs) which PoP a request came through
RETRY_ON = "5xx,connect-failure,reset"
RETRY_BASE_INTERVAL_MS = 25
RETRY_MAX_INTERVAL_MS = 250
PREVIOUS_HOSTS_PREDICATE = "envoy.retry_host_predicates.previous_hosts"
HOST_SELECTION_RETRY_MAX_ATTEMPTS = 3
CATCH_ALL_ROUTE = "default"


def route_timeout_ms(tier: Tier) -> int:
    return tier.queue_timeout_ms + tier.read_timeout_ms * (tier.retries + 1)


def route_configuration(desired: Desired, listener: Listener, pop: str) -> RouteConfiguration:
    return RouteConfiguration(
        name=listener.name,
        virtual_hosts=[_virtual_host(desired, vhost) for vhost in listener.virtual_hosts],
        request_headers_to_add=[_overwrite(POP_HEADER, pop)],
    )


def _virtual_host(desired: Desired, vhost: DesiredVirtualHost) -> VirtualHost:
    group = desired.group(vhost.origin_group)
    routes = [
        _route(rule.name, _match(rule), group.name, group.tier(rule.tier))
        for rule in desired.classification
    ]
    routes.append(
        _route(
            CATCH_ALL_ROUTE, RouteMatch(prefix="/"), group.name, group.tier(desired.default_tier)
        )
    )
    return VirtualHost(name=vhost.name, domains=list(vhost.domains), routes=routes)


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


def _route(name: str, match: RouteMatch, group: str, tier: Tier) -> Route:
    return Route(
        name=name,
        match=match,
        route=RouteAction(
            cluster=cluster_name(group, tier.name),
            timeout=duration_ms(route_timeout_ms(tier)),
            retry_policy=_retry_policy(tier),
        ),
        request_headers_to_add=[_overwrite(TIER_HEADER, tier.name)],
    )


def _overwrite(name: str, value: str) -> HeaderValueOption:
    """A request header toward the origin that replaces whatever the client sent."""
    return HeaderValueOption(
        header=HeaderValue(key=name, value=value),
        append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _retry_policy(tier: Tier) -> RetryPolicy:
    policy = RetryPolicy(
        retry_on=RETRY_ON,
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
        host_selection_retry_max_attempts=HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    )
    policy.num_retries.value = tier.retries
    return policy
