"""Real Envoy 1.40 terminating TLS with certificates Ballast serves over SDS.

A `BallastService` (SotW over plaintext xDS on loopback with `allow_plaintext_secrets`, or delta
over mTLS) serves an HTTPS listener in PoP ewr with two certificates (shop.test, media.test),
read from files. A TLS client with SNI checks the chain, the SAN and ALPN (h2 and http/1.1,
and a real HTTP/2 request).
Replacing shop's files makes Envoy serve the new certificate within `ROTATION_BOUND_S` (the
watcher's poll and settle, the reload, the push) with no restart, no failed request from a
client running meanwhile and no connection dropped (an HTTP/2 connection made before keeps
serving); a certificate whose key does not match is refused and the old one
keeps serving.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.connection
import h2.events
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from control_plane.cli.envoy_validate import validate_bootstrap
from control_plane.cli.main import main
from control_plane.cli.validate import stand_in_pair
from control_plane.decisions.log import log_files, parse_line
from control_plane.desired import parse_desired
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir
from control_plane.security.tls import TlsFiles
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.bootstrap import XdsClientTls, ads_bootstrap
from control_plane.translate.resources import LISTENER_TYPE, Capabilities
from harness.background_loop import BackgroundLoop
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from tests.support.certs import Issued
from tests.support.tls_listeners import HOSTNAMES, TlsSite, tls_desired_yaml

pytestmark = pytest.mark.envoy

# poll 0.1 s + settle 0.3 s, the reload (parse, translate), the push: well under this
ROTATION_BOUND_S = 5.0
ORIGINS = ("primary", "secondary")


@dataclass
class Stack:
    bg: BackgroundLoop
    service: BallastService
    site: TlsSite
    envoy: EnvoyProcess
    https_port: int
    redirect_port: int
    mtls_port: int

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The decision log's records of `kind`, as written."""
        return [record for path in log_files(self.service.config.state_dir)
                for line in path.read_bytes().splitlines()
                if (record := parse_line(line)) is not None and record.get("kind") == kind]


def handshake(port: int, sni: str, ca: Issued, alpn: list[str]) -> tuple[x509.Certificate, str]:
    """The leaf certificate a TLS client with SNI `sni` gets (verified against `ca`, hostname
    checked), and the protocol ALPN chose."""
    context = ssl.create_default_context(cadata=ca.cert.public_bytes(
        serialization.Encoding.PEM).decode())
    context.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=sni) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der), tls.selected_alpn_protocol() or ""


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class H2Connection:
    """One HTTP/2 connection over TLS (ALPN h2), kept open for several GETs."""

    def __init__(self, port: int, sni: str, ca: Issued) -> None:
        context = ssl.create_default_context(cadata=ca.cert.public_bytes(
            serialization.Encoding.PEM).decode())
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.tls = context.wrap_socket(raw, server_hostname=sni)
        assert self.tls.selected_alpn_protocol() == "h2"
        der = self.tls.getpeercert(binary_form=True)
        assert der is not None
        self.fingerprint = hashlib.sha256(der).hexdigest()
        self.sni = sni
        self.conn = h2.connection.H2Connection()
        self.conn.initiate_connection()
        self.tls.sendall(self.conn.data_to_send())

    def get(self, path: str = "/catalog") -> tuple[int, str]:
        """Status and the origin that answered."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "GET"), (":path", path),
                                        (":scheme", "https"), (":authority", self.sni)],
                               end_stream=True)
        self.tls.sendall(self.conn.data_to_send())
        status, origin = 0, ""
        while True:
            data = self.tls.recv(65536)
            if not data:
                raise AssertionError("connection closed before the response ended")
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                    status, origin = int(headers[":status"]), headers.get("x-origin", "")
                if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    self.tls.sendall(self.conn.data_to_send())
                    return status, origin
            self.tls.sendall(self.conn.data_to_send())

    def close(self) -> None:
        self.tls.close()


def h2_get(port: int, sni: str, ca: Issued, path: str = "/catalog") -> tuple[int, str]:
    """One HTTP/2 GET on a new TLS connection: status and the origin that answered."""
    connection = H2Connection(port, sni, ca)
    try:
        return connection.get(path)
    finally:
        connection.close()


def stat(envoy: EnvoyProcess, name: str) -> int:
    for line in envoy.admin(f"/stats?filter=^{re.escape(name)}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def https_get(port: int, sni: str, ca: Issued) -> tuple[int, str]:
    """One HTTP/1.1 GET on a new TLS connection: status and the served leaf's fingerprint."""
    context = ssl.create_default_context(cadata=ca.cert.public_bytes(
        serialization.Encoding.PEM).decode())
    context.set_alpn_protocols(["http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=sni) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(f"GET /catalog HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"
                    .encode())
        head = b""
        while b"\r\n" not in head:
            chunk = tls.recv(4096)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
        return status, hashlib.sha256(der).hexdigest()


def more_listeners(site: TlsSite, redirect_port: int, mtls_port: int) -> str:
    """A plain listener redirecting to https, and one requiring client certificates."""
    site.write("client-ca-leaf", "client.test")  # a client certificate the CA issued
    return f"""\
  - name: redirect
    port: {redirect_port}
    pops: [ewr]
    redirect_to_https: true
    virtual_hosts:
      - {{name: all, domains: ["*"], origin_group: shop}}
  - name: mtls
    port: {mtls_port}
    pops: [ewr]
    tls:
      certificates:
        - {{name: shop, hostnames: [shop.test], cert_file: {site.cert_file("shop")},
            key_file: {site.key_file("shop")}}}
      client_ca_file: {site.ca_file()}
    virtual_hosts:
      - {{name: all, domains: ["*"], origin_group: shop}}
"""


@pytest.fixture(scope="module", params=["sotw-plaintext-loopback", "delta-mtls"])
def stack(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Stack]:
    """SotW over plaintext on loopback (`allow_plaintext_secrets`), or delta over mTLS (the
    node's certificate from `ballast certs`'s helper): the two ways secrets may go out."""
    mode, transport = request.param.split("-", 1)
    tmp = tmp_path_factory.mktemp("tls")
    site = TlsSite(tmp / "certs")
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    https_port, redirect_port, mtls_port = free_port(), free_port(), free_port()
    ports = {"primary": free_port(), "secondary": free_port()}
    path = tmp / "desired.yaml"
    path.write_text(tls_desired_yaml(site, https_port=https_port, listener_port=free_port(),
                                     primary_port=ports["primary"],
                                     secondary_port=ports["secondary"])
                    + more_listeners(site, redirect_port, mtls_port))
    xds_tls: TlsFiles | None = None
    node_tls: XdsClientTls | None = None
    if transport == "mtls":
        certs = CertDir(tmp / "xds-certs")
        authority, _ = certs.load_or_make_ca(1)
        certs.make_server(authority, ["127.0.0.1"], 1)
        node = certs.make_node(authority, "ewr", "ewr-1", 1)
        xds_tls = TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert)
        node_tls = XdsClientTls(cert=str(node.cert), key=str(node.key), ca=str(certs.ca.cert))
    bg = BackgroundLoop()
    service = BallastService(ServiceConfig(
        desired_path=path, state_dir=tmp / "state", xds_address=f"127.0.0.1:{free_port()}",
        admin_address=None, probes=False, reload_poll_s=0.1, tls=xds_tls,
        allow_plaintext_secrets=transport == "plaintext-loopback"))
    origins = [DemoOrigin(name, port) for name, port in ports.items()]
    envoy: EnvoyProcess | None = None
    try:
        bg.run(service.start())
        for origin in origins:
            bg.run(origin.start())
        admin = free_port()
        envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr",
                                           xds_port=service.server.port, admin_port=admin,
                                           delta=mode == "delta", tls=node_tls),
                             admin).start()
        envoy.wait_ready()
        proxy = envoy
        eventually_blocking(lambda: _serves(https_port, site), 10, "the HTTPS listener answers")
        yield Stack(bg, service, site, proxy, https_port, redirect_port, mtls_port)
    finally:
        if envoy is not None:
            envoy.stop()
        for origin in origins:
            bg.run(origin.stop())
        bg.run(service.stop())
        bg.close()


def _serves(port: int, site: TlsSite) -> bool:
    try:
        return https_get(port, "shop.test", site.ca)[0] == 200
    except OSError:
        return False


def test_two_hostnames_two_certificates_sni_chain_san_and_alpn(stack: Stack) -> None:
    for name, hostname in HOSTNAMES.items():
        for offered, chosen in ((["h2", "http/1.1"], "h2"), (["http/1.1"], "http/1.1")):
            leaf, protocol = handshake(stack.https_port, hostname, stack.site.ca, offered)
            assert fingerprint(leaf) == fingerprint(stack.site.issued[name].cert)
            sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            assert sans.value.get_values_for_type(x509.DNSName) == [hostname]
            assert protocol == chosen
        status, origin = h2_get(stack.https_port, hostname, stack.site.ca)
        assert status == 200 and origin in ORIGINS  # (the standby keeps a 5% warm pool)
        assert https_get(stack.https_port, hostname, stack.site.ca)[0] == 200


def test_renewed_files_are_served_without_restart_or_failed_request(stack: Stack) -> None:
    pid = stack.envoy.proc.pid if stack.envoy.proc else None
    failures: list[str] = []
    served: list[tuple[float, str]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                status, seen = https_get(stack.https_port, "shop.test", stack.site.ca)
            except (OSError, ValueError) as err:
                failures.append(repr(err))
                continue
            if status != 200:
                failures.append(f"status {status}")
            served.append((time.monotonic(), seen))

    runner = threading.Thread(target=client, daemon=True)
    runner.start()
    took: list[float] = []
    # a connection made before the renewals: it keeps its certificate and is never dropped
    kept = H2Connection(stack.https_port, "shop.test", stack.site.ca)
    first = kept.fingerprint
    assert kept.get()[0] == 200
    try:
        for _ in range(3):
            renewed = stack.site.write("shop", HOSTNAMES["shop"])
            written = time.monotonic()
            new = fingerprint(renewed.cert)
            eventually_blocking(lambda new=new: bool(served) and served[-1][1] == new,
                                ROTATION_BOUND_S, "the renewed certificate served")
            took.append(next(t for t, seen in served if t >= written and seen == new) - written)
        assert kept.get()[0] == 200  # the same connection, after three renewals
        assert kept.fingerprint == first
    finally:
        stop.set()
        runner.join(10)
        kept.close()
    assert failures == []
    assert len(served) > 10
    assert stack.envoy.proc is not None and stack.envoy.proc.pid == pid
    assert stack.envoy.proc.poll() is None  # never restarted: the same process serves
    print(f"rotation: median {statistics.median(took):.2f}s, range {min(took):.2f}-"
          f"{max(took):.2f}s over {len(took)} renewals")
    # media's certificate was not touched
    leaf, _ = handshake(stack.https_port, "media.test", stack.site.ca, ["http/1.1"])
    assert fingerprint(leaf) == fingerprint(stack.site.issued["media"].cert)


def test_a_key_that_does_not_match_is_refused_and_the_old_certificate_serves(
    stack: Stack, tmp_path: Path,
) -> None:
    before = fingerprint(stack.site.issued["media"].cert)
    rejected = len(stack.records("config_rejected"))
    other = stack.site.issued["shop"]  # a real key, of another certificate
    stack.site.key_file("media").write_bytes(other.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    eventually_blocking(lambda: len(stack.records("config_rejected")) > rejected, ROTATION_BOUND_S,
               "the half-written renewal rejected")
    problems = stack.records("config_rejected")[-1]["detail"]["problems"]
    assert any("does not match the certificate" in p and "media-key.pem" in p
               for p in problems), problems
    leaf, _ = handshake(stack.https_port, "media.test", stack.site.ca, ["http/1.1"])
    assert fingerprint(leaf) == before
    # the matching key arrives: the pair (the same certificate) is good again
    stack.site.issued["media"].write(tmp_path, "media")
    (tmp_path / "media-key.pem").replace(stack.site.key_file("media"))
    leaf, _ = handshake(stack.https_port, "media.test", stack.site.ca, ["http/1.1"])
    assert fingerprint(leaf) == before


def test_a_plain_listener_redirects_to_https(stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", stack.redirect_port), timeout=5) as plain:
        plain.sendall(b"GET /catalog?x=1 HTTP/1.1\r\nHost: shop.test\r\nConnection: close"
                      b"\r\n\r\n")
        head = b""
        while chunk := plain.recv(4096):
            head += chunk
    status_line, _, rest = head.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 301"), head
    assert b"location: https://shop.test/catalog?x=1" in rest.lower()


def test_client_certificates_are_required_where_a_client_ca_is_set(stack: Stack) -> None:
    ca = stack.site.ca.cert.public_bytes(serialization.Encoding.PEM).decode()

    def connect(with_certificate: bool) -> bytes:
        context = ssl.create_default_context(cadata=ca)
        if with_certificate:
            context.load_cert_chain(stack.site.cert_file("client-ca-leaf"),
                                    stack.site.key_file("client-ca-leaf"))
        with socket.create_connection(("127.0.0.1", stack.mtls_port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="shop.test") as tls:
            tls.sendall(b"GET /catalog HTTP/1.1\r\nHost: shop.test\r\nConnection: close"
                        b"\r\n\r\n")
            return tls.recv(4096)

    assert connect(True).startswith(b"HTTP/1.1 200")
    # without one: the handshake fails (TLS 1.3: the alert may arrive after the client's side
    # of it, as the read fails or finds the connection closed); no HTTP answer either way
    try:
        answer = connect(False)
    except (ssl.SSLError, ConnectionError) as err:
        answer = repr(err).encode()
    assert not answer.startswith(b"HTTP/"), answer
    assert stat(stack.envoy, f"listener.127.0.0.1_{stack.mtls_port}.ssl.fail_verify_no_cert") >= 1


def test_ballast_validate_checks_tls_listeners_with_envoy(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(stack.service.config.desired_path)]) == 0
    out = capsys.readouterr().out
    assert "pop ewr: OK (envoy 1.40" in out and "pop sjc: OK (envoy 1.40" in out


def test_tls_listener_with_trusted_priority_sources_validates(tmp_path: Path) -> None:
    """Trusted sources double every certificate's filter chain (and the default one)."""
    site = TlsSite(tmp_path)
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    text = tls_desired_yaml(site, https_port=8443, listener_port=8080, primary_port=1,
                            secondary_port=2).replace(
        "classification:\n", "classification:\n  trusted_priority_sources: [10.0.0.0/8]\n")
    desired = parse_desired(text, "<trusted>")
    resources = translate_pop(desired, "ewr", Capabilities())
    listener = resources.of_type(LISTENER_TYPE)["https"].message
    assert [list(c.filter_chain_match.server_names) for c in listener.filter_chains] == [
        ["shop.test"], [], ["media.test"], ["shop.test"], ["media.test"]]
    ok, output = validate_bootstrap(static_bootstrap(resources, stand_in_pair()))
    assert ok, output
