"""Issue 36, break 4: nobody who reaches a port can grow the server's log by MB/s.

The probes that filed it, against `ballast serve` (mTLS on the xDS port, the admin token on):
an unauthenticated `GET /healthz?a…` (8,300 characters) logged a 740-byte traceback per request
(2.27 MB/s); a chunked multipart `POST /login` answered 500 and logged a traceback (1.42 MB/s);
a node reconnecting and NACKing logged 480 KB/s, outside the decision log's rate limit.

Now: a malformed request is answered 400 and logged in one line without a traceback, and the
loggers whose lines clients cause pass a rate limit in bytes (`lifecycle/log_rate_limit.py`). Shown
here with the server's own log file (what operators read) at the default level: 200 hostile
admin requests grow it by less than 50 KB, and a node reconnecting and NACKing for 10 s stays
within its rate limit; a hypothesis property test throws generated malformed requests at the
admin parser and bounds the log bytes of each one (none is a 500, none logs a traceback).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.lifecycle.log_rate_limit import CLIENT_LOGGERS
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir
from control_plane.translate.resources import CLUSTER_TYPE
from harness.background_loop import BackgroundLoop
from harness.envoy_process import free_port
from harness.local_server import start_server
from harness.xds_client import XdsClient, make_node

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "desired.yaml"
TOKEN = "log-flood-test-token-0123456789"
HOSTILE_REQUESTS = 200
LOG_BOUND = 50 * 1024
NACK_FLOOD_S = 10.0
NACK_TEXT = "x" * 2000  # what a NACK may hold: 2,048 characters


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    xds: int
    admin: int
    certs: CertDir
    log: Path

    def log_size(self) -> int:
        return self.log.stat().st_size


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """`ballast serve` as operators run it: mTLS, the admin token, the default log level."""
    certs = CertDir(tmp_path / "certs")
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    certs.make_node(authority, "ewr", "ewr-nacker", 1)
    desired = tmp_path / "desired.yaml"
    shutil.copy(EXAMPLE, desired)
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    xds, admin = free_port(), free_port()
    log = tmp_path / "serve.log"
    proc = start_server(
        "ballast serve",
        [sys.executable, "-m", "control_plane.cli.main", "serve", str(desired),
         "--xds-address", f"127.0.0.1:{xds}", "--admin-address", f"127.0.0.1:{admin}",
         "--state-dir", str(tmp_path / "state"), "--no-probes",
         "--admin-token-file", str(token),
         "--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key),
         "--client-ca", str(certs.ca.cert)],
        log, f"http://127.0.0.1:{admin}/readyz", timeout=30)
    try:
        yield Serve(proc, xds, admin, certs, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def raw(port: int, data: bytes) -> bytes:
    """Send `data` on a new connection; the first line of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n" not in answer:
            try:
                chunk = sock.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def hostile_requests(port: int) -> list[tuple[bytes, bytes]]:
    """(request, the status codes it may get): what the probes sent, and more."""
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    multipart = (b"POST /login HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n"
                 b"Content-Type: multipart/form-data; boundary=xx\r\nConnection: close\r\n\r\n")
    kinds = [
        (b"GET /healthz?" + b"a" * 8300 + b" HTTP/1.1\r\n" + host + b"\r\n", b"400"),
        # /login: 429 once the address guessed 10 tokens (its throttle comes first)
        (multipart + chunked(b"abcde"), b"400 429"),
        (multipart + chunked(b'--xx\r\nContent-Disposition: form-data; name="token"\r\n\r\n'
                             b"abc\r\n--xx--\r\n"), b"400 429"),
        (b"POST /login HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n"
         b"Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n\r\n"
         b"zz\r\ntoken=\r\n0\r\n\r\n", b"400 429"),
        (b"GET / HTTP/1.1\r\n" + host + b"X: " + b"a" * 9000 + b"\r\n\r\n", b"400"),
        (b"G\x1bT /\x1b[2J HTTP/1.1\r\n" + host + b"\r\n", b"400"),
        (b"POST /rollout/abort HTTP/1.1\r\n" + host + b"Origin: http://evil\r\n"
         b"Content-Length: 0\r\nConnection: close\r\n\r\n", b"403"),
        (b"GET /status\x1b]0;x\x07 HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n", b"400"),
        (b"GET /status HTTP/1.1\r\n" + host + b"Authorization: Bearer guess-" + b"y" * 40 + b"\r\n"
         b"Connection: close\r\n\r\n", b"401 429"),  # 429 once the address guessed 10 times
    ]
    return [kinds[i % len(kinds)] for i in range(HOSTILE_REQUESTS)]


def test_200_hostile_admin_requests_grow_the_log_by_under_50_kb(serve: Serve) -> None:
    before = serve.log_size()
    started = time.monotonic()
    for request, status in hostile_requests(serve.admin):
        line = raw(serve.admin, request)
        assert line.split(b" ")[1] in status.split(), (request[:80], line)
    grown = serve.log_size() - before
    # the control: the server is well and answers at once
    with urllib.request.urlopen(f"http://127.0.0.1:{serve.admin}/healthz", timeout=5) as r:
        assert r.status == 200
    log = serve.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "\x1b" not in log  # what a client sent is escaped in the log too
    assert grown < LOG_BOUND, f"{grown:,} bytes in {time.monotonic() - started:.1f} s"
    assert "bad request from 127.0.0.1" in log  # one line per kind at least, not silence


async def test_a_node_reconnecting_and_nacking_stays_within_its_log_rate_limit(
    serve: Serve,
) -> None:
    limit = CLIENT_LOGGERS["control_plane.ads.server"]
    node = serve.certs.node("ewr", "ewr-nacker")
    credentials = grpc.ssl_channel_credentials(
        serve.certs.ca.cert.read_bytes(), node.key.read_bytes(), node.cert.read_bytes())
    before = serve.log_size()
    started = time.monotonic()
    streams = 0
    while time.monotonic() - started < NACK_FLOOD_S:
        async with grpc.aio.secure_channel(f"127.0.0.1:{serve.xds}", credentials) as channel:
            client = await XdsClient(channel, make_node("ewr-nacker", "ewr"),
                                     reject=lambda _type, _names: NACK_TEXT).start()
            await client.subscribe(CLUSTER_TYPE)
            await client.wait_for(lambda c: len(c.responses(CLUSTER_TYPE)) >= 1, 10)
            await client.close()
            streams += 1
    elapsed = time.monotonic() - started
    grown = serve.log_size() - before
    allowed = limit.burst_bytes + limit.bytes_per_s * elapsed + 4096  # other lines
    assert streams >= 20, f"only {streams} reconnects in {elapsed:.1f} s"
    # the control: unlimited, each reconnect logs its NACK (2 KB) and two lines more
    assert streams * len(NACK_TEXT) > allowed, "the flood was too slow to prove anything"
    assert grown <= allowed, f"{grown:,} bytes for {streams} reconnects in {elapsed:.1f} s"
    log = serve.log.read_text(errors="replace")
    assert "[log rate limit:" in log or grown < limit.burst_bytes


# -- the admin parser, fuzzed ---------------------------------------------------------------

class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.tracebacks = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        self.bytes += len(text.encode()) + 1
        self.tracebacks += "Traceback" in text


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Captured]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    token = tmp / "admin.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    bg = BackgroundLoop()
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, admin_token_file=token))
    bg.run(service.start(), 30)
    captured = Captured()
    logging.getLogger().addHandler(captured)
    # one request's lines, unlimited: the limit would only hide a long one
    limited = [(logging.getLogger(name), list(logging.getLogger(name).filters))
               for name in CLIENT_LOGGERS]
    for logger, filters in limited:
        for kept in filters:
            logger.removeFilter(kept)
    try:
        assert service.admin is not None
        yield service.admin.port, captured
    finally:
        for logger, filters in limited:
            for kept in filters:
                logger.addFilter(kept)
        logging.getLogger().removeHandler(captured)
        bg.run(service.stop(0), 30)
        bg.close()


PER_REQUEST_BYTES = 400
PATHS = ("/healthz", "/login", "/logout", "/session", "/rollout/abort", "/status", "/metrics",
         "/dashboard/api/decisions", "/decisions")
text = st.binary(max_size=64) | st.binary(min_size=8100, max_size=9000)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE"]) | st.binary(max_size=12))
    path = draw(st.sampled_from(PATHS)).encode() + draw(st.sampled_from([b"", b"?"])) + draw(text)
    headers = draw(st.lists(st.tuples(st.binary(min_size=1, max_size=20), text), max_size=3))
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "bad-chunked", "none"]))
    content_type = draw(st.sampled_from([
        b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=xx",
        b"multipart/form-data", b"text/plain"]))
    head = method + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += b"Content-Type: " + content_type + b"\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    if framing == "length":
        return head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    if framing == "chunked":
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body)
    if framing == "bad-chunked":
        return head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n"
    return head + b"\r\n" + body


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=requests())
def test_no_request_to_the_admin_port_is_a_500_or_logs_more_than_one_line(
    in_process: tuple[int, Captured], request: bytes,
) -> None:
    port, captured = in_process
    before, tracebacks = captured.bytes, captured.tracebacks
    line = raw(port, request)
    assert not line.startswith(b"HTTP/1.1 500") and not line.startswith(b"HTTP/1.0 500"), line
    assert captured.tracebacks == tracebacks
    assert captured.bytes - before <= PER_REQUEST_BYTES, (request[:200], captured.bytes - before)
