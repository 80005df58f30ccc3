"""mTLS on the xDS port with real gRPC clients: node identity against the certificate, one live
stream per node id, and certificate rotation picked up by new connections."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from control_plane.ads.limits import AdsLimits, clip
from control_plane.cli.main import main
from control_plane.security.cert_dir import CertDir, Pair, write_pair
from control_plane.security.certs import Issued, issue_server, make_ca
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from control_plane.translate.resources import CLUSTER_TYPE
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.envoy_process import free_port
from harness.models import example_desired
from harness.xds_client import XdsClient, make_node
from tests.support.admin_stack import connect_node, start_stack

Records = list[tuple[str, dict[str, Any]]]


def channel(port: int, certs: CertDir, pair: Pair | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        certs.ca.cert.read_bytes(),
        pair.key.read_bytes() if pair else None,
        pair.cert.read_bytes() if pair else None,
    )
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}", credentials, options=[("grpc.use_local_subchannel_pool", 1)]
    )


async def served(
    certs: CertDir, records: Records, *, tls: bool = True
) -> BallastServer:
    server = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0",
        record=lambda kind, fields: records.append((kind, fields)),
        tls=ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert))
        if tls else None,
    )
    await server.start()
    return server


@pytest.fixture
def certs(tmp_path: Path) -> CertDir:
    certs = CertDir(tmp_path / "certs")
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    return certs


@pytest.fixture
async def tls_server(certs: CertDir) -> AsyncIterator[tuple[BallastServer, Records]]:
    records: Records = []
    server = await served(certs, records)
    yield server, records
    await server.stop(0)


async def first_response(client: XdsClient, timeout: float = 5) -> None:
    await client.subscribe(CLUSTER_TYPE)
    await asyncio.wait_for(
        client.wait_for(lambda c: bool(c.responses(CLUSTER_TYPE)) or c.error is not None),
        timeout,
    )


async def test_node_with_matching_certificate_gets_its_config(
    certs: CertDir, tls_server: tuple[BallastServer, Records]
) -> None:
    server, _ = tls_server
    authority, _ = certs.load_or_make_ca(1)
    pair = certs.make_node(authority, "ewr", "ewr-7", 1)
    async with channel(server.port, certs, pair) as ch:
        client = await XdsClient(ch, make_node("ewr-7", "ewr")).start()
        await first_response(client)
        assert client.error is None
        assert [s.node_id for s in server.nodes.statuses()] == ["ewr-7"]
        await client.close()


@pytest.mark.parametrize(
    ("cert_for", "claims", "why"),
    [
        (("sjc", "n1"), ("ewr", "n1"),
         "the certificate is for PoP 'sjc', the node claims PoP 'ewr'"),
        (("ewr", "n1"), ("ewr", "n2"), "the certificate is for node 'n1', the stream claims node "
                                        "id 'n2'"),
        (("ewr", "n1"), ("ewr", "n1" * 400), "the stream claims node id 'n1n1"),
    ],
)
async def test_identity_mismatch_is_permission_denied_with_a_short_record(
    certs: CertDir,
    tls_server: tuple[BallastServer, Records],
    cert_for: tuple[str, str],
    claims: tuple[str, str],
    why: str,
) -> None:
    server, records = tls_server
    authority, _ = certs.load_or_make_ca(1)
    pair = certs.make_node(authority, *cert_for, 1)
    async with channel(server.port, certs, pair) as ch:
        client = await XdsClient(ch, make_node(claims[1], claims[0])).start()
        await first_response(client)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert why in (client.error.details() or "")
        assert client.state.log == []  # nothing was sent
        await client.close()
    (refused,) = [f for kind, f in records if kind == "node_refused"]
    assert why in refused["reason"]
    assert refused["node"] == clip(claims[1], 64)  # claimed values quoted to 64 characters
    assert len(refused["node"]) < 64 + 40 and len(refused["pop"]) < 64 + 40
    assert len(refused["reason"]) <= 300
    assert server.nodes.statuses() == []


async def test_certificate_without_a_node_identity_is_refused(
    certs: CertDir, tls_server: tuple[BallastServer, Records]
) -> None:
    server, _ = tls_server
    authority, _ = certs.load_or_make_ca(1)
    admin = certs.make_admin(authority, "oncall", 1)  # an admin identity is not a node
    async with channel(server.port, certs, admin) as ch:
        client = await XdsClient(ch, make_node("oncall", "ewr")).start()
        await first_response(client)
        assert client.error is not None
        assert client.error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "names no node identity" in (client.error.details() or "")
        await client.close()


async def test_no_client_certificate_or_plaintext_gets_no_stream(
    certs: CertDir, tls_server: tuple[BallastServer, Records]
) -> None:
    server, records = tls_server
    for ch in (channel(server.port, certs, None),
               grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")):
        async with ch:
            client = await XdsClient(ch, make_node("ewr-1", "ewr")).start()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await first_response(client)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            await client.close()
    assert server.nodes.statuses() == []
    assert records == []  # refused by the TLS layer, before any request is read


@pytest.mark.parametrize("tls", [True, False])
async def test_newer_stream_with_the_same_node_id_wins(certs: CertDir, tls: bool) -> None:
    records: Records = []
    server = await served(certs, records, tls=tls)
    authority, _ = certs.load_or_make_ca(1)
    pair = certs.make_node(authority, "ewr", "twin", 1)

    def open_channel() -> grpc.aio.Channel:
        if tls:
            return channel(server.port, certs, pair)
        return grpc.aio.insecure_channel(f"127.0.0.1:{server.port}",
                                         options=[("grpc.use_local_subchannel_pool", 1)])

    try:
        async with open_channel() as old_ch, open_channel() as new_ch:
            older = await XdsClient(old_ch, make_node("twin", "ewr")).start()
            await first_response(older)
            (first,) = server.nodes.statuses()
            newer = await XdsClient(new_ch, make_node("twin", "ewr")).start()
            await first_response(newer)
            await asyncio.wait_for(older.done.wait(), 5)
            assert older.error is not None
            assert older.error.code() == grpc.StatusCode.ABORTED
            assert "newer stream" in (older.error.details() or "")
            assert newer.error is None
            (now,) = server.nodes.statuses()  # the id once, the newer stream
            assert now.node_id == "twin" and now.stream != first.stream
            (superseded,) = [f for kind, f in records if kind == "node_superseded"]
            assert superseded["closed_stream"] == first.stream
            assert superseded["stream"] == now.stream
            await older.close()
            await newer.close()
    finally:
        await server.stop(0)


# -- rotation ---------------------------------------------------------------------------------


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def server_serial(port: int, pair: Pair, ca_pem: bytes) -> int:
    """The serial of the certificate Ballast shows a new TLS connection presenting `pair`;
    ssl.SSLError when Ballast refuses that client certificate.

    With TLS 1.3 the server checks the client's certificate after the client considers the
    handshake done: the refusal arrives as an alert on the first read, acceptance as HTTP/2
    frames (the answer to our connection preface)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.load_cert_chain(pair.cert, pair.key)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
        tls.sendall(H2_PREFACE)
        if not tls.recv(9):  # a frame header
            raise ssl.SSLError("connection closed without an HTTP/2 frame")
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_rotated_files_are_used_from_the_next_connection(
    certs: CertDir, tls_server: tuple[BallastServer, Records]
) -> None:
    server, _ = tls_server
    authority, _ = certs.load_or_make_ca(1)
    node = certs.make_node(authority, "ewr", "ewr-1", 1)
    ca_pem = certs.ca.cert.read_bytes()
    old_serial = Issued(certs.server.cert.read_bytes(), b"").cert.serial_number
    assert await asyncio.to_thread(server_serial, server.port, node, ca_pem) == old_serial
    # a stream opened before the rotation
    async with channel(server.port, certs, node) as ch:
        before = await XdsClient(ch, make_node("ewr-1", "ewr")).start()
        await first_response(before)

        # 1. a new server certificate (same CA): the next connection shows it
        certs.make_server(authority, ["127.0.0.1"], 1)
        new_serial = Issued(certs.server.cert.read_bytes(), b"").cert.serial_number
        # the very next connection shows it: no polling interval to wait out
        seen = await asyncio.to_thread(server_serial, server.port, node, ca_pem)
        assert seen == new_serial != old_serial
        assert server.tls is not None and server.tls.reloads == 1

        # 2. a half-done rotation (a key that is not the certificate's) keeps the last good set
        other = issue_server(authority, ["127.0.0.1"])
        certs.server.key.write_bytes(other.key_pem)
        seen = await asyncio.to_thread(server_serial, server.port, node, ca_pem)
        assert seen == new_serial
        assert "is not the key of" in (server.tls.last_error or "")
        write_pair(certs.server, other)  # completed: used
        seen = await asyncio.to_thread(server_serial, server.port, node, ca_pem)
        assert seen == other.cert.serial_number
        assert server.tls.last_error is None

        # 3. a new client CA: nodes of the old CA are refused from the next connection on,
        # nodes of the new one accepted; the stream opened before keeps running
        new_ca = make_ca("ballast CA 2")
        new_dir = CertDir(certs.root / "next")
        write_pair(new_dir.ca, new_ca)
        new_node = new_dir.make_node(new_ca, "ewr", "ewr-2", 1)
        certs.ca.cert.write_bytes(new_ca.cert_pem)
        with pytest.raises(ssl.SSLError):
            await asyncio.to_thread(server_serial, server.port, node, ca_pem)
        seen = await asyncio.to_thread(server_serial, server.port, new_node, ca_pem)
        assert seen == other.cert.serial_number
        assert before.error is None and not before.done.is_set()
        await before.close()


async def test_a_connection_that_never_handshakes_is_closed(certs: CertDir) -> None:
    server = BallastServer(
        desired(listener_port=free_port(), primary_port=free_port(), secondary_port=free_port()),
        xds_address="127.0.0.1:0", limits=AdsLimits(handshake_ms=300),
        tls=ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert)),
    )
    await server.start()

    def idle() -> tuple[float, bytes]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
            started = time.monotonic()
            data = raw.recv(16)  # we send no ClientHello
            return time.monotonic() - started, data

    try:
        waited, data = await asyncio.to_thread(idle)
    finally:
        await server.stop(0)
    assert data == b""  # closed by the server
    assert 0.2 < waited < 5.0  # its handshake bound, not gRPC's default 120 s


async def test_status_lists_a_reconnected_node_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's observation: a second stream reusing a connected node's id (here, its NACKs
    differing) made `ballast status` list the node twice, one row NACKED."""
    stack = await start_stack(example_desired(), tmp_path)
    try:
        first, first_channel = await connect_node(stack, "edge-9", "ewr")
        second, second_channel = await connect_node(
            stack, "edge-9", "ewr", reject=lambda type_url, names: "impostor says no")
        await asyncio.wait_for(first.done.wait(), 5)
        code = await asyncio.to_thread(main, ["status", "--server", stack.url])
        out = capsys.readouterr().out
        assert code == 0
        rows = [line for line in out.splitlines() if line.split()[:2] == ["edge-9", "ewr"]]
        assert len(rows) == 1 and rows[0].split()[-1] == "NACKED"  # the newer stream's view
        for client, channel in ((first, first_channel), (second, second_channel)):
            await client.close()
            await channel.close()
    finally:
        await stack.stop()
