"""Session affinity (the failover source: "if your app uses sticky sessions or JWTs pinned to a
region, a naive weighted drain will break in-flight users"), for origin groups with `affinity`.

Envoy's stateful session filter (`envoy.filters.http.stateful_session`) is in the listener's
HTTP filters, before the router, without a session state of its own (a no-op); each virtual host
of a group with affinity turns it on (`typed_per_filter_config`) with the group's cookie
(`envoy.http.stateful_session.cookie`: path `/`, the group's `ttl`, 0 = a session cookie) or
header (`envoy.http.stateful_session.header`). The first answer to a user names the origin the
weights picked; later requests carrying it go to that origin whatever the weights are now,
while its endpoint is `HEALTHY` (cluster `override_host_status`). Ballast leaves a sick
origin's endpoint `UNKNOWN` (`endpoints.py`): load balancing treats it as healthy, so the
weights are unchanged, but sessions on it are balanced by the weights again (not strict) and
get a new cookie.

Why not hashing: with a ring hash on the cookie and the origins' weights, a key moves to another
origin whenever the weights move the ring's points; stateful session keeps every session where
it is.
"""

from __future__ import annotations

from envoy.config.core.v3.extension_pb2 import TypedExtensionConfig
from envoy.extensions.filters.http.stateful_session.v3.stateful_session_pb2 import (
    StatefulSession,
    StatefulSessionPerRoute,
)
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpFilter,
)
from envoy.extensions.http.stateful_session.cookie.v3.cookie_pb2 import CookieBasedSessionState
from envoy.extensions.http.stateful_session.header.v3.header_pb2 import HeaderBasedSessionState
from envoy.type.http.v3.cookie_pb2 import Cookie
from google.protobuf.any_pb2 import Any

from control_plane.desired.model import Affinity
from control_plane.translate.proto_values import duration_ms, packed

STATEFUL_SESSION_FILTER = "envoy.filters.http.stateful_session"
COOKIE_STATE = "envoy.http.stateful_session.cookie"
HEADER_STATE = "envoy.http.stateful_session.header"


def session_filter() -> HttpFilter:
    """The listener's filter: off until a virtual host turns it on."""
    return HttpFilter(name=STATEFUL_SESSION_FILTER, typed_config=packed(StatefulSession()))


def session_per_host(affinity: Affinity) -> Any:
    """A virtual host's `typed_per_filter_config` entry for the filter."""
    if affinity.kind == "cookie":
        cookie = Cookie(name=affinity.name, path="/", ttl=duration_ms(affinity.ttl_ms))
        state = TypedExtensionConfig(
            name=COOKIE_STATE, typed_config=packed(CookieBasedSessionState(cookie=cookie)))
    else:
        state = TypedExtensionConfig(
            name=HEADER_STATE, typed_config=packed(HeaderBasedSessionState(name=affinity.name)))
    return packed(StatefulSessionPerRoute(
        stateful_session=StatefulSession(session_state=state, strict=False)))
