"""The xDS bootstrap a proxyless gRPC client starts from (`GRPC_XDS_BOOTSTRAP`). Pure data.

gRPC reads it once per process (gRFC A27): the xDS servers (Ballast, and its replicas in the
order gRPC falls back to them, gRFC A71), the channel credentials to reach them, its node (id,
the PoP as its locality zone, `ballast_client: grpc` in its metadata) and `server_features`
`xds_v3` and `ignore_resource_deletion` (a resource Ballast stops sending is kept, gRFC A53).

With mTLS (`XdsClientTls`) both connections a client makes use the node's certificate, as gRPC
supports it: to Ballast through the `tls` channel credentials (gRFC A65), to the origins of a TLS
service through the certificate provider instance `ballast` (gRFC A29), a `file_watcher` of the
same files — re-read every `refresh_interval`, so certificates renewed in place are used
without a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from control_plane.translate.bootstrap import XdsClientTls
from control_plane.translate.grpc_capabilities import CLIENT_METADATA
from control_plane.translate.grpc_resources import CERTIFICATE_PROVIDER

SERVER_FEATURES = ("xds_v3", "ignore_resource_deletion")
REFRESH_INTERVAL = "60s"


def _files(tls: XdsClientTls) -> dict[str, str]:
    return {"certificate_file": tls.cert, "private_key_file": tls.key,
            "ca_certificate_file": tls.ca, "refresh_interval": REFRESH_INTERVAL}


def grpc_bootstrap(
    *, node_id: str, pop: str, servers: Sequence[tuple[str, int]],
    tls: XdsClientTls | None = None,
) -> dict[str, Any]:
    """The bootstrap of one gRPC client of `pop`; `servers` (host, port), preferred first."""
    credentials = ([{"type": "tls", "config": _files(tls)}] if tls is not None
                   else [{"type": "insecure"}])
    bootstrap: dict[str, Any] = {
        "xds_servers": [{
            "server_uri": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            "channel_creds": credentials,
            "server_features": list(SERVER_FEATURES),
        } for host, port in servers],
        "node": {
            "id": node_id,
            "locality": {"zone": pop},
            "metadata": {CLIENT_METADATA: "grpc"},
        },
    }
    if tls is not None:
        bootstrap["certificate_providers"] = {
            CERTIFICATE_PROVIDER: {"plugin_name": "file_watcher", "config": _files(tls)}}
    return bootstrap
