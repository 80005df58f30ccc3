"""One edge Envoy of PoP `ewr` in front of two demo origins, plus bounded traffic through it.

`edge_fleet`: a hand-written static cluster (no retries). `translated_fleet`: Ballast's own
translation of group `shop` (routes retry 5xx and connect failures on another host), with a third
origin `dead` whose port nothing listens on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from control_plane.desired.model import Desired, Origin
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.models import example_desired, shop_group
from tests.support.observe_envoy import edge_bootstrap, translated_edge_bootstrap


@dataclass
class Fleet:
    envoy: EnvoyProcess
    listen_port: int
    primary: DemoOrigin
    secondary: DemoOrigin
    desired: Desired | None = field(default=None)

    def restart_envoy(self) -> None:
        self.envoy.stop()
        self.envoy = EnvoyProcess(self.envoy.bootstrap, self.envoy.admin_port).start()
        self.envoy.wait_ready()

    async def traffic(self, requests: int, concurrency: int = 10) -> list[int]:
        """Send `requests` GETs through Envoy, at most `concurrency` at a time; the statuses."""
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=15)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def one(i: int) -> int:
                async with gate, session.get(
                    f"http://127.0.0.1:{self.listen_port}/item/{i}"
                ) as response:
                    await response.read()
                    return response.status

            return list(await asyncio.gather(*(one(i) for i in range(requests))))


@asynccontextmanager
async def _serving(
    bootstrap: dict[str, Any],
    admin_port: int,
    listen_port: int,
    primary: DemoOrigin,
    secondary: DemoOrigin,
    desired: Desired | None = None,
) -> AsyncIterator[Fleet]:
    """Envoy started on `bootstrap` in front of the running origins, until it is ready; on exit
    Envoy and both origins stop."""
    envoy = EnvoyProcess(bootstrap, admin_port).start()
    fleet = Fleet(envoy, listen_port, primary, secondary, desired)
    try:
        await asyncio.to_thread(envoy.wait_ready)
        yield fleet
    finally:
        fleet.envoy.stop()
        await primary.stop()
        await secondary.stop()


@asynccontextmanager
async def edge_fleet(
    sink_port: int, *, max_connections: int = 1024, max_pending_requests: int = 1024
) -> AsyncIterator[Fleet]:
    primary = await DemoOrigin("primary", free_port()).start()
    secondary = await DemoOrigin("secondary", free_port()).start()
    admin_port, listen_port = free_port(), free_port()
    bootstrap = edge_bootstrap(
        pop="ewr",
        node_id="edge-ewr-1",
        admin_port=admin_port,
        listen_port=listen_port,
        sink_port=sink_port,
        origins={"primary": primary.port, "secondary": secondary.port},
        max_connections=max_connections,
        max_pending_requests=max_pending_requests,
    )
    async with _serving(bootstrap, admin_port, listen_port, primary, secondary) as fleet:
        yield fleet


@asynccontextmanager
async def translated_fleet(sink_port: int, weights: dict[str, int], *, hedge_delay_ms: int = 0
                           ) -> AsyncIterator[Fleet]:
    """Envoy of PoP `ewr` running the translation of `shop` = primary, secondary, dead (with
    `hedge_delay_ms`, the critical tier hedges, unguarded)."""
    primary = await DemoOrigin("primary", free_port()).start()
    secondary = await DemoOrigin("secondary", free_port()).start()
    origins = (
        Origin("primary", "127.0.0.1", primary.port),
        Origin("secondary", "127.0.0.1", secondary.port),
        Origin("dead", "127.0.0.1", free_port()),  # nothing listens: connect failures
    )
    order = tuple(o.name for o in origins)
    group = replace(
        shop_group(*origins[:2]),
        origins=origins,
        preference={"ewr": order, "sjc": order},
    )
    if hedge_delay_ms:
        group = replace(group, tiers=tuple(
            replace(t, hedge_delay_ms=hedge_delay_ms) if t.name == "critical" else t
            for t in group.tiers))
    desired = example_desired(group)
    admin_port, listen_port = free_port(), free_port()
    bootstrap = translated_edge_bootstrap(
        desired,
        {"shop": weights},
        pop="ewr",
        node_id="edge-ewr-1",
        admin_port=admin_port,
        listen_port=listen_port,
        sink_port=sink_port,
    )
    async with _serving(bootstrap, admin_port, listen_port, primary, secondary, desired) as fleet:
        yield fleet
