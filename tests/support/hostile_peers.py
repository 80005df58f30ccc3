"""Peers of the xDS port for the connection tests, run as processes in network namespaces
(`python -m tests.support.hostile_peers COMMAND ...`, each printing JSON lines):

- `hold`: as many connections as it can open and keep — mTLS with a node certificate and an
  HTTP/2 preface (a client that then sends nothing), or raw TCP (`--raw`: no certificate, no
  byte) — each reopened when the server closes it (`--reopen`), optionally opening a bogus ADS
  stream (headers only, no request) on each every `--bogus-every` seconds, or a valid stream
  (`--sink-stream`: an access-log stream whose first message names the certificate's node,
  held open); `--opening N` paces it (at most N connections dialling or younger than
  `PROOF_WAIT_S` at once, so few are ever without a stream); prints what it holds every 0.25 s
  until stdin closes;
- `first-config`: a fresh node's seconds from dialling to CDS, EDS, LDS and RDS, retrying as
  Envoy does when the connection is refused before its first response;
- `node`: a node that syncs, then holds its stream for `--hold` seconds and says whether the
  stream is still open;
- `get`: an HTTP GET, or (`--until TEXT`) one repeated until a 200 says TEXT.

The attacker runs in a process of its own so that its work (thousands of TLS handshakes) shares
no event loop with the measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import ssl
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
from envoy.service.accesslog.v3 import als_pb2

from harness.eventually import eventually_blocking
from harness.xds_client import XdsClient, connect, make_node

ADS_PATH = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
ALS_PATH = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
PROOF_WAIT_S = 0.25  # with --opening: a connection counts as opening this long after its stream
RETRY_BASE_S = 0.5  # Envoy's ADS retry: jittered exponential back-off from 500 ms


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _node_files(certs: Path, node: str) -> tuple[Path, Path]:
    pop, node_id = node.split("/", 1)
    return certs / "nodes" / pop / f"{node_id}.pem", certs / "nodes" / pop / f"{node_id}.key"


def _tls(certs: Path, node: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(*map(str, _node_files(certs, node)))
    context.set_alpn_protocols(["h2"])
    return context


def _channel(host: str, port: int, certs: Path, node: str) -> grpc.aio.Channel:
    cert, key = _node_files(certs, node)
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes(),
                                               key.read_bytes(), cert.read_bytes())
    return grpc.aio.secure_channel(f"{host}:{port}", credentials,
                                   options=[("grpc.use_local_subchannel_pool", 1)])


def _headers(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "https"), (":path", path),
            (":authority", "ballast"), ("content-type", "application/grpc"), ("te", "trailers")]


# -- hold --------------------------------------------------------------------------------------


class Holder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tls = None if args.raw else _tls(Path(args.certs), args.node)
        self.opened = self.held = self.failed = self.bogus = self.refused = 0
        self.sink_message = b""
        if args.sink_stream:
            pop, node_id = args.node.split("/", 1)
            message = als_pb2.StreamAccessLogsMessage()
            message.identifier.node.id = node_id
            message.identifier.node.locality.zone = pop
            body = message.SerializeToString()
            self.sink_message = b"\0" + len(body).to_bytes(4, "big") + body  # a gRPC message
        self.opening = asyncio.Semaphore(args.opening) if args.opening else None

    async def one(self) -> None:
        args = self.args
        while True:
            if self.opening is not None:
                await self.opening.acquire()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    args.host, args.port, ssl=self.tls,
                    server_hostname=args.host if self.tls is not None else None), 5)
            except (OSError, TimeoutError, ssl.SSLError):
                self.failed += 1
                if self.opening is not None:
                    self.opening.release()
                if not args.reopen:
                    return
                await asyncio.sleep(0.1)
                continue
            if self.opening is not None:
                asyncio.get_running_loop().call_later(PROOF_WAIT_S, self.opening.release)
            self.opened += 1
            self.held += 1
            try:
                await self._hold(reader, writer)
            except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
                pass
            finally:
                self.held -= 1
                writer.close()
            if not args.reopen:
                return

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.args.raw:
            await reader.read()  # until the server closes it
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        bogus = None
        if self.args.bogus_every:
            bogus = asyncio.get_running_loop().create_task(self._bogus(conn, writer))
        if self.sink_message:
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, _headers(ALS_PATH))
            conn.send_data(stream_id, self.sink_message)
            writer.write(conn.data_to_send())
        ended = False  # the sink stream (its trailers may come with a reset: counted once)
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):  # settings and pings are acknowledged
                    if (not ended and self.sink_message
                            and isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)):
                        ended = True
                        self.refused += 1  # the server ended the stream: it was refused
                writer.write(conn.data_to_send())
        finally:
            if bogus is not None:
                bogus.cancel()

    async def _bogus(self, conn: h2.connection.H2Connection,
                     writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self.args.bogus_every)
            conn.send_headers(conn.get_next_available_stream_id(), _headers(ADS_PATH))
            writer.write(conn.data_to_send())
            self.bogus += 1

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.one()) for _ in range(self.args.count)]
        stdin_closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        started = time.monotonic()
        while not stdin_closed.done():
            say(t=round(time.monotonic() - started, 2), opened=self.opened, held=self.held,
                failed=self.failed, bogus=self.bogus, refused=self.refused)
            await asyncio.wait([stdin_closed], timeout=0.25)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- nodes ---------------------------------------------------------------------------------------


async def first_config(args: argparse.Namespace) -> None:
    """Dial, subscribe as Envoy does and wait for all four types; a stream that fails before
    its first response (the port at its cap closed the connection) is retried as Envoy retries
    its ADS stream: after a jittered back-off of up to 0.5 s, doubled at each failure."""
    started = time.monotonic()
    pop, node_id = args.node.split("/", 1)
    retries, backoff = 0, RETRY_BASE_S
    while True:
        async with _channel(args.host, args.port, Path(args.certs), args.node) as channel:
            client = XdsClient(channel, make_node(node_id, pop))
            left = args.timeout - (time.monotonic() - started)
            try:
                await asyncio.wait_for(connect(client, left), left)
                say(seconds=time.monotonic() - started, retries=retries)
                return
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or client.responses():
                    raise
            except (AssertionError, TimeoutError) as err:
                if client.responses() or not isinstance(client.error, grpc.aio.AioRpcError):
                    say(error=f"{type(err).__name__}: {err} ({client.error})",
                        seconds=time.monotonic() - started, retries=retries)
                    return
            finally:
                await client.close()
        retries += 1
        await asyncio.sleep(random.uniform(0, backoff))
        backoff *= 2


async def node(args: argparse.Namespace) -> None:
    async with _channel(args.host, args.port, Path(args.certs), args.node) as channel:
        pop, node_id = args.node.split("/", 1)
        client = XdsClient(channel, make_node(node_id, pop))
        try:
            await connect(client, 10)
            say(synced=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.done.wait(), args.hold)
            say(open=not client.done.is_set(), error=str(client.error or ""))
        finally:
            await client.close()


def get(args: argparse.Namespace) -> None:
    """GET the URL (until its body holds `--until`, polled every 0.1 s, when given); says the
    last attempt's time and answer, or its problem."""
    last: dict[str, object] = {}

    def attempt() -> bool:
        last.clear()
        started = time.monotonic()
        try:
            with urllib.request.urlopen(args.url, timeout=5) as answer:
                body = answer.read().decode()
                if args.until is None or args.until in body:
                    last.update(seconds=time.monotonic() - started, status=answer.status,
                                body=body)
                    return True
                problem = f"no {args.until!r} in {body[:200]!r}"
        except OSError as err:
            problem = str(err)
        last.update(seconds=time.monotonic() - started, error=problem)
        return args.until is None

    with contextlib.suppress(AssertionError):
        eventually_blocking(attempt, args.timeout, f"{args.until!r} at {args.url}", interval=0.1)
    say(**last)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("hold", "first-config", "node"):
        command = sub.add_parser(name)
        command.add_argument("host")
        command.add_argument("port", type=int)
        command.add_argument("--certs", required=name != "hold")
        command.add_argument("--node", default="ewr/attacker")
    hold = sub.choices["hold"]
    hold.add_argument("--count", type=int, default=1)
    hold.add_argument("--raw", action="store_true")
    hold.add_argument("--reopen", action="store_true")
    hold.add_argument("--bogus-every", type=float, default=0.0)
    hold.add_argument("--sink-stream", action="store_true")
    hold.add_argument("--opening", type=int, default=0)
    sub.choices["first-config"].add_argument("--timeout", type=float, default=10.0)
    sub.choices["node"].add_argument("--hold", type=float, default=5.0)
    fetch = sub.add_parser("get")
    fetch.add_argument("url")
    fetch.add_argument("--until", metavar="TEXT",
                       help="repeat until the answer is a 200 whose body contains TEXT")
    fetch.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.command == "hold":
        asyncio.run(Holder(args).run())
    elif args.command == "first-config":
        asyncio.run(first_config(args))
    elif args.command == "node":
        asyncio.run(node(args))
    else:
        get(args)


if __name__ == "__main__":
    main()
