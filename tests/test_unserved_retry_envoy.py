"""The background tier (`retries: 0`) through a real Envoy 1.40: an attempt no origin served is
retried once on the other origin; one an origin worked on stays final (`translate/routes.py`,
"Retries"; `translate/clusters.py` `unserved_retry`).

Two loopback origins at 50/50; image revalidations (`/_next/image`, the background rule of the
example). The other origin answers 200. One origin in turn:
- answers 503 with `connection: close` (a connection cap, as nginx `limit_conn`): every request
  is answered 200, each of its attempts there is a first one, and Envoy counts one retry for each;
- has nothing listening (connection refused): every request is answered 200;
- answers 500 (it worked on the request and failed): those requests get the 500, no retry.
"""

from __future__ import annotations

import dataclasses
import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import Desired, Origin
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.loopback_http import LoopbackHttp
from harness.models import example_desired, shop_group

pytestmark = pytest.mark.envoy

REQUESTS = 40


class FixedOrigin(LoopbackHttp):
    """Answers every request with `status`; counts attempts by `x-envoy-attempt-count`."""

    def __init__(self, status: int) -> None:
        self.attempts: Counter[int] = Counter()
        lock = threading.Lock()
        seen = self.attempts

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with lock:
                    seen[int(self.headers.get("x-envoy-attempt-count") or 1)] += 1
                self.send_response(status)
                self.send_header("content-length", "0")
                if status == 503:  # declined: the connection goes too
                    self.send_header("connection", "close")
                    self.close_connection = True
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        super().__init__(Handler, Server)


def _desired(primary: int, secondary: int) -> Desired:
    desired = example_desired(shop_group(Origin("primary", "127.0.0.1", primary),
                                         Origin("secondary", "127.0.0.1", secondary)))
    listener = dataclasses.replace(desired.listeners[0], port=free_port())
    return dataclasses.replace(desired, listeners=(listener,))


@contextmanager
def _edge(primary: int, secondary: int) -> Iterator[tuple[EnvoyProcess, int]]:
    find_envoy()
    desired = _desired(primary, secondary)
    weights = {"shop": {"primary": 50, "secondary": 50}}
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(),
                                               PopIntent(weights=weights)))
    admin = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    with EnvoyProcess(bootstrap, admin) as envoy:
        envoy.wait_ready()
        yield envoy, desired.listeners[0].port


def _get(port: int, n: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", f"/_next/image?url=/{n}.png")
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _background(envoy: EnvoyProcess) -> dict[str, int]:
    found: Any = envoy.admin_json("/stats?format=json&filter=^cluster[.]shop[.]background[.]")
    return {item["name"].removeprefix("cluster.shop.background."): int(item["value"])
            for item in found["stats"] if "value" in item}


Run = tuple[Counter[int], "FixedOrigin", "FixedOrigin | None", dict[str, int]]


def _run(declining: int | None) -> Run:
    """REQUESTS image revalidations; the secondary answers `declining` (None: not listening)."""
    primary = FixedOrigin(200)
    secondary = FixedOrigin(declining) if declining is not None else None
    try:
        port = secondary.port if secondary is not None else free_port()
        with _edge(primary.port, port) as (envoy, listener):
            statuses = Counter(_get(listener, n) for n in range(REQUESTS))
            stats = _background(envoy)
    finally:
        primary.close()
        if secondary is not None:
            secondary.close()
    return statuses, primary, secondary, stats


def test_a_503_is_retried_once_on_the_other_origin() -> None:
    statuses, primary, secondary, stats = _run(503)
    assert secondary is not None
    assert statuses == {200: REQUESTS}
    declined = sum(secondary.attempts.values())
    assert declined > 0 and set(secondary.attempts) == {1}  # a retry never goes back
    assert primary.attempts[2] == declined == stats.get("upstream_rq_retry", 0), stats
    assert max(primary.attempts) <= 2
    assert stats.get("upstream_rq_retry_overflow", 0) == 0


def test_a_refused_connection_is_retried_on_the_other_origin() -> None:
    statuses, primary, _, stats = _run(None)
    assert statuses == {200: REQUESTS}
    assert primary.attempts[2] > 0 and primary.attempts[2] == stats.get("upstream_rq_retry", 0)


def test_a_500_stays_final() -> None:
    statuses, primary, secondary, stats = _run(500)
    assert secondary is not None
    failed = sum(secondary.attempts.values())
    assert failed > 0
    assert statuses == {200: REQUESTS - failed, 500: failed}
    assert set(primary.attempts) == {1} and set(secondary.attempts) == {1}
    assert stats.get("upstream_rq_retry", 0) == 0
