"""One Envoy 1.40 fed by an in-process Ballast (metrics sink, stats flushed every `flush_s`) in
front of one demo origin answering in `origin_ms`, for the tier controller's end-to-end tests
(lending, preemption); and closed-loop clients that keep a tier's pool busy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port


async def closed_loop(url: str, clients: int, stop: asyncio.Event, done: list[float]) -> None:
    """`clients` loops GETting `url` until `stop`; each 200's arrival time goes to `done`."""
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            while not stop.is_set():
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url) as response:
                        await response.read()
                        if response.status == 200:
                            done.append(time.monotonic())
        await asyncio.gather(*(one() for _ in range(clients)))


@contextlib.asynccontextmanager
async def tier_fleet(tmp_path: Path, desired_template: str, origin_ms: float, flush_s: float
                     ) -> AsyncIterator[tuple[EnvoyProcess, int]]:
    """(the Envoy, its listener port); `desired_template` has `{origin}` and `{listener}`."""
    origin = await DemoOrigin("primary", free_port()).start()
    origin.set_fault(Fault(latency_ms=origin_ms))
    listener, xds, admin = free_port(), free_port(), free_port()
    desired = tmp_path / "desired.yaml"
    desired.write_text(desired_template.format(origin=origin.port, listener=listener))
    envoy = EnvoyProcess(ads_bootstrap(
        node_id="ewr-1", pop="ewr", xds_port=xds, admin_port=admin, metrics_sink=True,
        needed_stats_only=True, stats_flush_interval_ms=int(flush_s * 1000)), admin).start()
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{xds}",
        admin_address=None, probes=False, reload_poll_s=0.2))
    try:
        await service.start()
        await asyncio.to_thread(envoy.wait_ready, 20)
        yield envoy, listener
    finally:
        envoy.stop()
        if service.ready:
            await service.stop(0.5)
        await origin.stop()
