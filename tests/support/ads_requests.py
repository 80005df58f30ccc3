"""Hand-made xDS requests for the sans-I/O ADS core tests (SotW and delta), optionally NACKs."""

from __future__ import annotations

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from google.rpc.status_pb2 import Status


def sotw_request(
    type_url: str, names: tuple[str, ...] = (), nonce: str = "", error: str = ""
) -> DiscoveryRequest:
    """A SotW request; with `error`, a NACK of `nonce` carrying that message."""
    request = DiscoveryRequest(type_url=type_url, resource_names=names, response_nonce=nonce)
    if error:
        request.error_detail.CopyFrom(Status(code=13, message=error))
    return request


def delta_request(
    type_url: str,
    subscribe: tuple[str, ...] = (),
    unsubscribe: tuple[str, ...] = (),
    nonce: str = "",
    error: str = "",
    initial: dict[str, str] | None = None,
) -> DeltaDiscoveryRequest:
    """A delta request; with `error`, a NACK of `nonce` carrying that message."""
    request = DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=subscribe,
        resource_names_unsubscribe=unsubscribe,
        response_nonce=nonce,
        initial_resource_versions=initial or {},
    )
    if error:
        request.error_detail.CopyFrom(Status(code=13, message=error))
    return request
