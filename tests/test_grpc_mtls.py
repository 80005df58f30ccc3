"""mTLS for proxyless gRPC clients as gRPC supports it: the bootstrap `ballast bootstrap --grpc
--tls-*` writes (run as the CLI) reaches Ballast's mTLS-only xDS port through the `tls` channel
credentials (gRFC A65), the node's certificate naming its PoP and id; a TLS service's origins
are reached through the certificate provider instance `ballast` of that bootstrap (gRFC A29):
the client presents the node's certificate to origins that require one, and checks theirs
against the CA and the origins' names. Its load reports arrive over the same mTLS connection,
bound to its certificate.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc

from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir
from control_plane.security.certs import issue_server
from control_plane.security.tls import TlsFiles
from harness.envoy_process import free_port
from harness.eventually import eventually
from harness.grpc_client import GrpcClientProcess
from harness.grpc_fleet import grpc_desired
from harness.grpc_origin import GrpcOrigin


async def test_grpc_client_over_mtls_to_ballast_and_to_tls_origins(tmp_path: Path) -> None:
    certs = CertDir(tmp_path / "certs")
    authority, _ = certs.load_or_make_ca(1)
    server = certs.make_server(authority, ["127.0.0.1"], 1)
    node = certs.make_node(authority, "ewr", "ewr-grpc-1", 1)
    origin_cert = issue_server(authority, ["127.0.0.1"], days=1)
    credentials = grpc.ssl_server_credentials(
        [(origin_cert.key_pem, origin_cert.cert_pem)],
        root_certificates=certs.ca.cert.read_bytes(), require_client_auth=True)
    origins = {name: await GrpcOrigin(name, free_port(), credentials=credentials).start()
               for name in ("primary", "secondary")}
    desired = tmp_path / "desired.yaml"
    desired.write_text(grpc_desired(origins["primary"].port, origins["secondary"].port)
                       .replace("    port: ", "    tls: true\n    port: ", 1))
    xds_port = free_port()
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{xds_port}",
        admin_address=None, metrics_source="lrs", probes=False, lrs_interval_ms=1000,
        reconcile_interval_ms=3_600_000,
        tls=TlsFiles(server.cert, server.key, certs.ca.cert)))
    client = None
    try:
        await service.start()
        made = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "control_plane.cli.main", "bootstrap", "--grpc", "--pop", "ewr",
            "--node-id", "ewr-grpc-1", "--xds", f"127.0.0.1:{xds_port}",
            "--tls-cert", str(node.cert), "--tls-key", str(node.key),
            "--tls-ca", str(certs.ca.cert)], capture_output=True, text=True, check=True)
        bootstrap = json.loads(made.stdout)
        assert bootstrap["xds_servers"][0]["channel_creds"][0]["type"] == "tls"
        client = await asyncio.to_thread(GrpcClientProcess, bootstrap, "xds:///shop-api", "ewr",
                                         tmp_path, xds_credentials=True)
        answer = await asyncio.to_thread(client.ask, "calls 40")
        assert not answer["errors"], answer
        assert answer["by_origin"].get("primary", 0) >= 30, answer
        assert origins["primary"].calls["ewr"] == answer["by_origin"]["primary"]
        (stream,) = service.server.nodes.by_node("ewr-grpc-1")
        assert stream.status == "SYNCED" and stream.capability_key.startswith("grpc")
        await eventually(lambda: [r["node"] for r in service.load_reports.reporters()
                                  if r["clusters"]] == ["ewr-grpc-1"], 10,
                         "the client's load reports over mTLS")
    finally:
        if client is not None:
            await asyncio.to_thread(client.stop)
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()
