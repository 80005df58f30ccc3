"""Real Envoy 1.40 over mTLS to a real Ballast, certificates from `ballast certs`' helper.

A node with its own certificate ACKs everything; a certificate of another PoP is refused with
PERMISSION_DENIED (and a `node_refused` record) and the Envoy gets no configuration; an Envoy
without a client certificate never gets past the TLS handshake.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from control_plane.observe.sink import SinkStore, add_metrics_service
from control_plane.security.cert_dir import CertDir
from control_plane.security.peer import check_node_peer, peer_pop
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from control_plane.translate.bootstrap import XdsClientTls, ads_bootstrap
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.background_loop import BackgroundLoop
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking

pytestmark = pytest.mark.envoy

TYPES = {"CDS", "EDS", "LDS", "RDS", "RTDS"}  # RTDS: the tier-lending runtime layer


@dataclass
class Stack:
    bg: BackgroundLoop
    ballast: BallastServer
    certs: CertDir
    records: list[tuple[str, dict[str, Any]]]
    sink: SinkStore

    def nodes(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.bg.call(self.ballast.nodes.statuses)]

    def bootstrap(
        self, pop: str, node_id: str, tls: XdsClientTls, *, delta: bool = False
    ) -> dict[str, Any]:
        return ads_bootstrap(node_id=node_id, pop=pop, xds_port=self.ballast.port,
                             admin_port=free_port(), tls=tls, metrics_sink=True,
                             stats_flush_interval_ms=200, delta=delta)

    def node_tls(self, pop: str, node_id: str) -> XdsClientTls:
        authority, _ = self.certs.load_or_make_ca(1)
        pair = self.certs.make_node(authority, pop, node_id, 1)
        return XdsClientTls(cert=str(pair.cert), key=str(pair.key), ca=str(self.certs.ca.cert))


def envoy(bootstrap: dict[str, Any]) -> EnvoyProcess:
    return EnvoyProcess(bootstrap, bootstrap["admin"]["address"]["socket_address"]["port_value"])


def stat(envoy: EnvoyProcess, name: str) -> int:
    for line in envoy.admin(f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def admin_up(envoy: EnvoyProcess) -> bool:
    try:
        return bool(envoy.admin("/server_info"))
    except (OSError, urllib.error.URLError):
        return False


def dynamic_clusters(envoy: EnvoyProcess) -> list[str]:
    dump = envoy.admin_json("/config_dump?resource=dynamic_active_clusters")
    return [c["cluster"]["name"] for c in dump.get("configs", [])]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    certs = CertDir(tmp_path_factory.mktemp("certs"))
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    bg = BackgroundLoop()
    records: list[tuple[str, dict[str, Any]]] = []
    first = free_port()
    ballast = BallastServer(
        desired(listener_port=first, sjc_offset=1, primary_port=free_port(),
                secondary_port=free_port()),
        xds_address="127.0.0.1:0",
        record=lambda kind, fields: records.append((kind, fields)),
        tls=ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert)),
    )
    sink = SinkStore()
    ballast.add_service(lambda server: add_metrics_service(
        server, sink, verify_peer=check_node_peer, peer_pop=peer_pop))
    try:
        bg.run(ballast.start())
        yield Stack(bg, ballast, certs, records, sink)
    finally:
        bg.run(ballast.stop(0.2))
        bg.close()


@pytest.mark.parametrize("mode", ["sotw", "delta"])
def test_envoy_with_its_own_certificate_acks_everything(stack: Stack, mode: str) -> None:
    node = f"ewr-1-{mode}"
    bootstrap = stack.bootstrap("ewr", node, stack.node_tls("ewr", node), delta=mode == "delta")
    with envoy(bootstrap) as proxy:
        proxy.wait_ready()

        def synced() -> bool:
            mine = [n for n in stack.nodes() if n["node_id"] == node]
            return (len(mine) == 1 and mine[0]["status"] == "SYNCED"
                    and mine[0]["mode"] == mode and set(mine[0]["types"]) == TYPES)

        eventually_blocking(synced, 5, f"{node} SYNCED on CDS, EDS, LDS, RDS over mTLS")
        assert stat(proxy, "control_plane.connected_state") == 1
        assert "shop.critical" in dynamic_clusters(proxy)
        assert stat(proxy, "cluster.ballast_xds.ssl.handshake") >= 1
        # its stats arrive over the same mTLS port, as its own node and PoP
        eventually_blocking(lambda: stack.bg.call(stack.sink.nodes).get(node) == "ewr", 5,
                   f"{node}'s metrics_service stream")


def test_envoy_with_a_certificate_of_another_pop_is_refused_and_gets_nothing(
    stack: Stack,
) -> None:
    # a real sjc certificate, used by an Envoy that claims to be ewr-2 of PoP ewr
    stolen = stack.node_tls("sjc", "ewr-2")
    with envoy(stack.bootstrap("ewr", "ewr-2", stolen)) as proxy:

        def refused() -> list[dict[str, Any]]:
            return [f for kind, f in list(stack.records)
                    if kind == "node_refused" and f["node"] == "ewr-2"]

        eventually_blocking(lambda: bool(refused()), 10, "a node_refused record for ewr-2")
        record = refused()[0]
        assert record["pop"] == "ewr"
        assert "PoP 'sjc'" in record["reason"] and "'ewr'" in record["reason"]
        # nothing applied (Envoy's connected_state is not a witness: it turns 1 for a moment
        # when the stream opens, before the refusal arrives)
        assert dynamic_clusters(proxy) == []
        assert stat(proxy, "cluster_manager.cds.update_success") == 0
        assert "ewr-2" not in {n["node_id"] for n in stack.nodes()}
        assert "ewr-2" not in stack.bg.call(stack.sink.nodes)  # its stats are refused too


def test_envoy_without_a_client_certificate_is_refused_at_the_handshake(stack: Stack) -> None:
    bootstrap = stack.bootstrap("ewr", "ewr-3", stack.node_tls("ewr", "ewr-3"))
    (xds,) = bootstrap["static_resources"]["clusters"]
    del xds["transport_socket"]["typed_config"]["common_tls_context"]["tls_certificates"]
    with envoy(bootstrap) as proxy:
        eventually_blocking(lambda: admin_up(proxy), 10, "Envoy's admin API up")
        eventually_blocking(lambda: stat(proxy, "cluster.ballast_xds.upstream_cx_connect_fail")
                   + stat(proxy, "cluster.ballast_xds.upstream_cx_destroy") >= 2,
                   10, "two failed connections to Ballast")
        assert dynamic_clusters(proxy) == []
        assert stat(proxy, "cluster_manager.cds.update_success") == 0
        assert "ewr-3" not in {n["node_id"] for n in stack.nodes()}
        # refused by the TLS layer: the server never read a request of it
        assert not [f for _, f in list(stack.records) if f.get("node") == "ewr-3"]
