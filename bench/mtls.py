"""mTLS cost on the xDS port: `python -m bench.mtls [--nodes N] [--rounds R]`.

1. The rotation check gRPC runs at every handshake (`ReloadingCredentials.fetch` with unchanged
   files: three `stat` calls): µs per call.
2. A connect storm: N simulated nodes (one TCP connection each) open an ADS stream and get
   their first CDS response, against the same server plaintext and then with mTLS (node
   certificates from `ballast certs`' helper). Server and clients share one process and loop,
   so the ratio of the two walls is the figure to read. Numbers in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from control_plane.security.cert_dir import CertDir
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from control_plane.translate.resources import CLUSTER_TYPE
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.envoy_process import free_port
from harness.xds_client import XdsClient, make_node


def fetch_cost(files: TlsFiles, calls: int = 20_000) -> float:
    credentials = ReloadingCredentials(files)
    started = time.perf_counter()
    for _ in range(calls):
        credentials.fetch()
    return (time.perf_counter() - started) / calls * 1e6


async def storm(nodes: int, certs: CertDir | None) -> float:
    tls = None
    if certs is not None:
        tls = ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert))
    server = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0", tls=tls,
    )
    await server.start()
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = []
    for i in range(nodes):
        pop = "ewr" if i % 2 else "sjc"
        target = f"127.0.0.1:{server.port}"
        if certs is None:
            channels.append((pop, i, grpc.aio.insecure_channel(target, options=options)))
        else:
            pair = certs.node(pop, f"n{i}")
            credentials = grpc.ssl_channel_credentials(
                certs.ca.cert.read_bytes(), pair.key.read_bytes(), pair.cert.read_bytes())
            channels.append((pop, i, grpc.aio.secure_channel(target, credentials, options)))

    async def one(pop: str, i: int, channel: grpc.aio.Channel) -> XdsClient:
        client = await XdsClient(channel, make_node(f"n{i}", pop)).start()
        await client.subscribe(CLUSTER_TYPE)
        await client.wait_for(lambda c: bool(c.responses(CLUSTER_TYPE)))
        return client

    started = time.perf_counter()
    clients = await asyncio.gather(*(one(*c) for c in channels))
    took = time.perf_counter() - started
    for client in clients:
        await client.close()
    for _, _, channel in channels:
        await channel.close()
    await server.stop(0)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mtls", description=__doc__)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ballast-bench-mtls-") as tmp:
        certs = CertDir(Path(tmp))
        ca, _ = certs.load_or_make_ca(1)
        certs.make_server(ca, ["127.0.0.1"], 1)
        for i in range(args.nodes):
            certs.make_node(ca, "ewr" if i % 2 else "sjc", f"n{i}", 1)
        files = TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert)
        print(f"rotation check per handshake (files unchanged): {fetch_cost(files):.1f} µs")
        walls: dict[str, list[float]] = {"plaintext": [], "mTLS": []}
        for _ in range(args.rounds):
            walls["plaintext"].append(asyncio.run(storm(args.nodes, None)))
            walls["mTLS"].append(asyncio.run(storm(args.nodes, certs)))
        for label, found in walls.items():
            print(f"{args.nodes} nodes to first CDS, {label:<9}: median "
                  f"{statistics.median(found):.2f} s  (runs: "
                  f"{', '.join(f'{w:.2f}' for w in found)})")
        ratio = statistics.median(walls["mTLS"]) / statistics.median(walls["plaintext"])
        print(f"mTLS / plaintext: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
