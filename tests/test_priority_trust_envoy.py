"""Priority that survives sub-requests, through a real Envoy 1.40.

The origin serves `/page` by fetching `/_next/image/hero` (a background path) through the same
edge, copying the parent request's `x-ballast-tier` the way an application would. From a trusted
source (127.0.0.2 here) the sub-request keeps the parent's tier; the same header sent by an
untrusted client (127.0.0.1) cannot raise its own request's tier.
"""

from __future__ import annotations

import dataclasses
import http.client
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import Desired, Origin
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.loopback_http import LoopbackHttp
from harness.models import example_desired, shop_group

pytestmark = pytest.mark.envoy

TRUSTED = "127.0.0.2"
UNTRUSTED = "127.0.0.1"


def get(port: int, path: str, source: str, headers: dict[str, str] | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                            source_address=(source, 0))
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


class AppOrigin(LoopbackHttp):
    """Records (path, x-ballast-tier) of every request; `/page` makes a sub-request through
    the edge from `sub_source`, carrying the parent's tier header."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.edge_port = 0
        self.sub_source = TRUSTED
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                tier = self.headers.get("x-ballast-tier", "")
                origin.seen.append((self.path, tier))
                status = 200
                if self.path == "/page":
                    status = get(origin.edge_port, "/_next/image/hero", origin.sub_source,
                                 {"x-ballast-tier": tier})
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        super().__init__(Handler)


@pytest.fixture
def app() -> Iterator[AppOrigin]:
    running = AppOrigin()
    yield running
    running.close()


def desired_for(app: AppOrigin, trusted: tuple[str, ...]) -> Desired:
    origin = Origin(name="primary", address="127.0.0.1", port=app.port)
    other = Origin(name="secondary", address="127.0.0.1", port=app.port)
    desired = example_desired(shop_group(origin, other))
    listener = dataclasses.replace(desired.listeners[0], port=free_port())
    return dataclasses.replace(desired, listeners=(listener,), trusted_priority_sources=trusted)


def test_trusted_sub_requests_keep_the_parent_tier_untrusted_clients_cannot_raise_theirs(
        app: AppOrigin) -> None:
    find_envoy()
    desired = desired_for(app, (f"{TRUSTED}/32",))
    port = app.edge_port = desired.listeners[0].port
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities()))
    admin_port = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
    with EnvoyProcess(bootstrap, admin_port) as envoy:
        envoy.wait_ready()
        # a critical parent (the default tier) whose sub-request would be background by path
        assert get(port, "/page", UNTRUSTED) == 200
        assert app.seen == [("/page", "critical"), ("/_next/image/hero", "critical")]

        app.seen.clear()  # a normal parent (x-purpose: prefetch) passes normal down
        assert get(port, "/page", UNTRUSTED, {"x-purpose": "prefetch"}) == 200
        assert app.seen == [("/page", "normal"), ("/_next/image/hero", "normal")]

        app.seen.clear()  # untrusted client: its own header is ignored and overwritten
        assert get(port, "/_next/image/x", UNTRUSTED, {"x-ballast-tier": "critical"}) == 200
        assert get(port, "/home", UNTRUSTED, {"x-ballast-tier": "background"}) == 200
        assert app.seen == [("/_next/image/x", "background"), ("/home", "critical")]

        app.seen.clear()  # trusted source: an unknown tier name falls back to classification
        assert get(port, "/_next/image/y", TRUSTED, {"x-ballast-tier": "urgent"}) == 200
        assert get(port, "/_next/image/z", TRUSTED) == 200
        assert app.seen == [("/_next/image/y", "background"), ("/_next/image/z", "background")]

        app.sub_source = UNTRUSTED  # the same sub-request from an untrusted address
        app.seen.clear()
        assert get(port, "/page", UNTRUSTED) == 200
        assert app.seen == [("/page", "critical"), ("/_next/image/hero", "background")]
        stats = envoy.admin_json("/stats?format=json&filter=^cluster[.]shop[.].*upstream_rq_total$")
    totals = {item["name"].split(".")[2]: int(item["value"]) for item in stats["stats"]}
    assert totals["critical"] >= 4 and totals["background"] >= 4, totals
