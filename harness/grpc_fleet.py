"""A proxyless gRPC fleet on loopback: Ballast in-process, plain gRPC origins, and one real grpcio
xDS client process per PoP dialling `xds:///shop-api`, each with the bootstrap `ballast
bootstrap --grpc` writes.

The clients run in processes of their own (`grpc_client.py`): grpcio's xDS client is one per
process, so two PoPs' clients in one process would be one node. The fast failover of the
end-to-end tests (1 s ticks over 3 s windows), the origins probed through their health service
every 500 ms (two a round: twelve a window), load reports every second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.grpc_bootstrap import grpc_bootstrap
from harness.envoy_process import free_port
from harness.grpc_client import GrpcClientProcess
from harness.grpc_origin import GrpcOrigin

SERVICE = "shop-api"
POPS = ("ewr", "sjc")

_GRPC_FLEET = """\
pops:
  ewr: {{}}
  sjc: {{}}
failover:
  interval: 1s
  window: 3s
  stale_after: 10s
  min_samples: 5
grpc_services:
  shop-api:
    port: {primary}
    origins:
      primary: {{address: 127.0.0.1}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
    preference:
      ewr: [primary, secondary]
      sjc: [primary, secondary]
    health_check: {{interval: 500ms, connect_timeout: 500ms, read_timeout: 1s}}
rollout: {{strategy: immediate}}
"""


def grpc_desired(primary: int, secondary: int) -> str:
    return _GRPC_FLEET.format(primary=primary, secondary=secondary)


@dataclass
class GrpcFleet:
    service: BallastService
    origins: dict[str, GrpcOrigin]
    clients: dict[str, GrpcClientProcess]
    state_dir: Path

    @property
    def admin_url(self) -> str:
        assert self.service.admin is not None
        return f"http://127.0.0.1:{self.service.admin.port}"

    def weights(self, pop: str) -> dict[str, int]:
        return self.service.server.intent.weights(pop, SERVICE)

    def records(self, *kinds: str, pop: str | None = None) -> list[dict[str, Any]]:
        return [r for r in iter_records(self.state_dir)
                if (not kinds or r["kind"] in kinds) and (pop is None or r.get("pop") == pop)]

    def calls(self, pop: str) -> dict[str, int]:
        """What each origin answered for the clients of `pop` so far."""
        return {name: origin.calls[pop] for name, origin in self.origins.items()}

    async def ask(self, pop: str, command: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.clients[pop].ask, command)


@contextlib.asynccontextmanager
async def grpc_fleet(
    tmp_path: Path, *, metrics_source: str = "lrs", rate: float = 40.0,
    pops: Sequence[str] = POPS, probes: bool = True, reconcile_interval_ms: int | None = None,
    edit: Callable[[str], str] = str,
) -> AsyncIterator[GrpcFleet]:
    """Ballast serving `shop-api` (origins primary and secondary; the desired state's text
    passed through `edit`) to one client per PoP of `pops`, each calling it `rate` times a
    second from the start."""
    origins = {name: await GrpcOrigin(name, free_port()).start()
               for name in ("primary", "secondary")}
    desired = tmp_path / "desired.yaml"
    desired.write_text(edit(grpc_desired(origins["primary"].port, origins["secondary"].port)))
    xds_port = free_port()
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{xds_port}",
        admin_address="127.0.0.1:0", metrics_source=metrics_source,  # type: ignore[arg-type]
        probes=probes, probe_interval_ms=500, lrs_interval_ms=1000, reload_poll_s=0.1,
        reconcile_interval_ms=reconcile_interval_ms,
    ))
    clients: dict[str, GrpcClientProcess] = {}
    try:
        await service.start()
        for pop in pops:
            bootstrap = grpc_bootstrap(node_id=f"{pop}-grpc-1", pop=pop,
                                       servers=[("127.0.0.1", xds_port)])
            clients[pop] = await asyncio.to_thread(
                GrpcClientProcess, bootstrap, f"xds:///{SERVICE}", pop, tmp_path)
            if rate:
                await asyncio.to_thread(clients[pop].ask, f"rate {rate}")
        yield GrpcFleet(service, origins, clients, tmp_path / "state")
    finally:
        for client in clients.values():
            await asyncio.to_thread(client.stop)
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()
