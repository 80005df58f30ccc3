"""One Listener per desired listener: an HTTP connection manager whose routes come by RDS over ADS.

The listener binds the PoP's `listen_address` at `port + port_offset` (several PoPs on one host);
its route configuration has the listener's name (see `routes.py`).
"""

from __future__ import annotations

from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.config_source_pb2 import (
    AggregatedConfigSource,
    ApiVersion,
    ConfigSource,
)
from envoy.config.listener.v3.listener_components_pb2 import Filter, FilterChain
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.http.router.v3.router_pb2 import Router
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
    HttpFilter,
    Rds,
)

from control_plane.desired.model import Listener as DesiredListener
from control_plane.desired.model import Pop
from control_plane.translate.proto_values import packed

HTTP_CONNECTION_MANAGER = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"


def listener(desired_listener: DesiredListener, pop: Pop) -> Listener:
    hcm = HttpConnectionManager(
        stat_prefix=desired_listener.name,
        rds=Rds(
            config_source=ConfigSource(
                ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3
            ),
            route_config_name=desired_listener.name,
        ),
        http_filters=[HttpFilter(name=ROUTER, typed_config=packed(Router()))],
    )
    return Listener(
        name=desired_listener.name,
        address=Address(
            socket_address=SocketAddress(
                address=pop.listen_address,
                port_value=desired_listener.port + pop.port_offset,
            )
        ),
        filter_chains=[
            FilterChain(filters=[Filter(name=HTTP_CONNECTION_MANAGER, typed_config=packed(hcm))])
        ],
    )
