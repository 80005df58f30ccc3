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

# one PoP, one group of one origin (max_origin_concurrency 20: guarantees critical 14, normal 5,
# background 1; floors 1 / 1 / 1), checkout / page / image classified critical / normal /
# background; `{tier_actions}` is the test's own tier_actions mapping
DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1}}
failover: {{interval: 1s, window: 3s, stale_after: 10s}}
tier_actions: {tier_actions}
origin_groups:
  shop:
    max_origin_concurrency: 20
    origins:
      primary: {{address: 127.0.0.1, port: {origin}}}
    health_check: {{interval: 1s, connect_timeout: 500ms, read_timeout: 1s}}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
    - {{name: page, path_prefix: /page, tier: normal}}
    - {{name: image, path_prefix: /_next/image, tier: background}}
listeners:
  - name: edge
    port: {listener}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


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
async def tier_fleet(tmp_path: Path, tier_actions: str, origin_ms: float, flush_s: float
                     ) -> AsyncIterator[tuple[EnvoyProcess, int]]:
    """(the Envoy, its listener port) serving `DESIRED` with `tier_actions` (a YAML flow
    mapping)."""
    origin = await DemoOrigin("primary", free_port()).start()
    origin.set_fault(Fault(latency_ms=origin_ms))
    listener, xds, admin = free_port(), free_port(), free_port()
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(origin=origin.port, listener=listener,
                                      tier_actions=tier_actions))
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
