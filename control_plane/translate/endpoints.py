"""One ClusterLoadAssignment per tier cluster: one locality per origin, weighted for this PoP.

`locality.zone` is the origin name, so Envoy (whose node zone is the PoP) emits per-(PoP, origin)
stats inside each tier cluster (docs/architecture.md, "Per-origin stats"). All localities are
priority 0: the weights alone move traffic between origins.

Weight 0: Envoy rejects `load_balancing_weight: 0` (the field must be >= 1), so an origin at 0
keeps its locality with the weight left unset. Under locality-weighted load balancing an unweighted
locality gets no requests, while its host stays known to Envoy (its per-zone stats, no connection
churn) and comes back as soon as its weight is above 0 again.

Session affinity (a group with `affinity`): each origin's endpoint is `HEALTHY` unless the weight
controller holds it sick in this PoP, then its health is left `UNKNOWN`. Load balancing treats
both alike (the weights alone move traffic); the stateful session filter honours a session's
origin only when it is `HEALTHY` (the cluster's `override_host_status`), so users pinned to a
sick origin are balanced by the weights again (`affinity.py`).
"""

from __future__ import annotations

from envoy.config.core.v3.address_pb2 import Address, SocketAddress
from envoy.config.core.v3.base_pb2 import Locality, Metadata
from envoy.config.core.v3.health_check_pb2 import HealthStatus
from envoy.config.endpoint.v3.endpoint_components_pb2 import (
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from google.protobuf.struct_pb2 import Struct
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import GroupWeights, Origin, OriginGroup
from control_plane.translate.clusters import (
    TRANSPORT_SOCKET_MATCH_FILTER,
    TRANSPORT_SOCKET_MATCH_KEY,
)


def load_assignment(
    cluster: str, group: OriginGroup, weights: GroupWeights,
    sick: frozenset[str] = frozenset(),
) -> ClusterLoadAssignment:
    """The endpoints of one tier cluster of `group`, weighted by `weights` (origin -> percent).
    With session affinity, `sick` names the origins a session may not stay on."""
    affinity = group.affinity is not None
    return ClusterLoadAssignment(
        cluster_name=cluster,
        endpoints=[origin_locality(origin, weights[origin.name],
                                   affinity and origin.name not in sick)
                   for origin in group.origins],
    )


def origin_locality(origin: Origin, weight: int, marked_healthy: bool = False
                    ) -> LocalityLbEndpoints:
    lb_endpoint = LbEndpoint(endpoint=_endpoint(origin))
    if marked_healthy:
        lb_endpoint.health_status = HealthStatus.HEALTHY
    if origin.tls:
        lb_endpoint.metadata.CopyFrom(_tls_match_metadata(origin))
    locality = LocalityLbEndpoints(
        locality=Locality(zone=origin.name), lb_endpoints=[lb_endpoint], priority=0
    )
    if weight > 0:
        locality.load_balancing_weight.CopyFrom(UInt32Value(value=weight))
    return locality


def _endpoint(origin: Origin) -> Endpoint:
    return Endpoint(
        address=Address(
            socket_address=SocketAddress(address=origin.address, port_value=origin.port)
        )
    )


def _tls_match_metadata(origin: Origin) -> Metadata:
    """Names the origin for the cluster's TLS transport socket match (see `clusters.py`)."""
    match = Struct()
    match.update({TRANSPORT_SOCKET_MATCH_KEY: origin.name})
    metadata = Metadata()
    metadata.filter_metadata[TRANSPORT_SOCKET_MATCH_FILTER].CopyFrom(match)
    return metadata
