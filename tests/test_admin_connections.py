"""Admin connections (issue 26): a `Host` check in every mode (DNS rebinding), IPv6 binds,
header and idle timeouts, and a cap at which a new connection closes the oldest idle one."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from control_plane.admin.connections import AdminLimits
from control_plane.admin.host_check import host_name
from control_plane.lifecycle.service import BallastService, ServiceConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"
LIMITS = AdminLimits(header_timeout_s=1.0, idle_timeout_s=2.0, max_connections=16)


async def start(tmp_path: Path, address: str = "127.0.0.1:0", **extra: object) -> BallastService:
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address=address, probes=False, admin_limits=LIMITS, **extra,  # type: ignore[arg-type]
    ))
    await service.start()
    return service


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[BallastService]:
    service = await start(tmp_path, admin_host_names=("ballast.example.net",))
    yield service
    await service.stop(0)


async def get(service: BallastService, path: str, host: str | None = None) -> int:
    assert service.admin is not None
    headers = {"Host": host} if host is not None else {}
    async with aiohttp.ClientSession() as http, http.get(
            f"{service.admin.url}{path}", headers=headers) as response:
        return response.status


@pytest.mark.parametrize(("header", "name"), [
    ("127.0.0.1:18001", "127.0.0.1"), ("[::1]:18001", "::1"), ("LocalHost", "localhost"),
    ("evil.example:80", "evil.example"), ("x", "x")])
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


async def test_only_requests_naming_the_admin_api_are_answered(served: BallastService) -> None:
    """Open mode (no token, loopback): a browser page of another site whose DNS name resolves
    to 127.0.0.1 sends its own name as Host and gets 421, on every route."""
    port = served.admin.port if served.admin else 0
    for path in ("/intent", "/status", "/healthz"):
        assert await get(served, path, f"rebind.attacker.example:{port}") == 421, path
        assert await get(served, path, f"127.0.0.1:{port}") == 200, path
        assert await get(served, path, f"localhost:{port}") == 200, path
        assert await get(served, path, f"ballast.example.net:{port}") == 200, path  # --admin-host


async def test_an_ipv6_admin_address_binds(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    service = await start(tmp_path, "[::1]:0")
    try:
        assert service.admin is not None and service.admin.url.startswith("http://[::1]:")
        assert await get(service, "/healthz") == 200
        assert await get(service, "/status") == 200
    finally:
        await service.stop(0)


async def _closed(reader: asyncio.StreamReader, timeout: float) -> float:
    """Seconds until the server closes the connection (EOF or reset)."""
    started = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(1024), timeout):
            pass
    except ConnectionError:
        pass
    return time.monotonic() - started


async def test_silent_slow_and_idle_connections_are_closed(served: BallastService) -> None:
    assert served.admin is not None
    port = served.admin.port
    silent = await asyncio.open_connection("127.0.0.1", port)
    slow = await asyncio.open_connection("127.0.0.1", port)
    slow[1].write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its head
    idle = await asyncio.open_connection("127.0.0.1", port)
    idle[1].write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # one request, then idle
    waits = await asyncio.gather(_closed(silent[0], 10), _closed(slow[0], 10),
                                 _closed(idle[0], 10))
    assert waits[0] < LIMITS.header_timeout_s + 1 and waits[1] < LIMITS.header_timeout_s + 1
    assert LIMITS.idle_timeout_s - 0.5 < waits[2] < LIMITS.idle_timeout_s + 2
    for _, writer in (silent, slow, idle):
        writer.close()


async def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one(
    served: BallastService,
) -> None:
    assert served.admin is not None
    port, cap = served.admin.port, served.admin.guard.cap
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap * 2)]
    # every connection over the cap closed one: the last of them was admitted
    await asyncio.gather(*(_closed(reader, 5) for reader, _ in held[:cap]))
    assert len(served.admin.guard) == cap
    assert await get(served, "/healthz") == 200  # an operator still gets in
    assert await _closed(held[0][0], 1) < 1  # the oldest went first
    for _, writer in held:
        writer.close()
