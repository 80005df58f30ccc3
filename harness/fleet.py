"""A whole fleet on loopback for end-to-end tests: Ballast in-process, real Envoys, demo origins,
and a bounded traffic generator."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.traffic import steady_traffic, stop_tasks

_FAST_FAILOVER = """\
pops:
  ewr: {{listen_address: {listen_address}, port_offset: 0}}
  sjc: {{listen_address: {listen_address}, port_offset: {sjc_offset}}}
failover:
  interval: 1s
  window: 3s
  stale_after: 10s
  min_samples: 5  # a 3 s window holds 6 probes (1 s rounds, two paths), not the source's 12
origin_groups:
  shop:
    origins:
      primary: {{address: {origin_address}, port: {primary}}}
      secondary: {{address: {origin_address}, port: {secondary}}}
    preference:
      ewr: [primary, secondary]
      sjc: [primary, secondary]
    health_check: {{interval: 1s, connect_timeout: 500ms, read_timeout: 1s}}
# a reload reaches both PoPs at once: what these tests look at (rollouts in waves are
# tests/test_rollout_e2e.py's)
rollout: {{strategy: immediate}}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
    - {{name: prefetch, headers: [{{name: purpose, exact: prefetch}}], tier: background}}
listeners:
  - name: edge
    port: {listener}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def fast_desired(
    *, listener: int, primary: int, secondary: int, sjc_offset: int = 1,
    listen_address: str = "127.0.0.1", origin_address: str = "127.0.0.1",
) -> str:
    """The end-to-end tests' desired state: PoPs ewr and sjc (sjc's listeners `sjc_offset`
    ports up: 0 where each PoP has its own host), group `shop` of origins primary and
    secondary (at `origin_address`), failover ticking every second over 3 s windows."""
    return _FAST_FAILOVER.format(
        listener=listener, primary=primary, secondary=secondary, sjc_offset=sjc_offset,
        listen_address=listen_address, origin_address=origin_address)


def write_fast_desired(
    path: Path, origins: dict[str, DemoOrigin], listener: int, sjc_listener: int
) -> Path:
    """`fast_desired` on loopback, for `origins`, written to `path`."""
    path.write_text(fast_desired(listener=listener, primary=origins["primary"].port,
                                 secondary=origins["secondary"].port,
                                 sjc_offset=sjc_listener - listener))
    return path


@dataclass
class Fleet:
    service: BallastService
    origins: dict[str, DemoOrigin]
    envoys: dict[str, EnvoyProcess]
    listener_ports: dict[str, int]
    state_dir: Path
    statuses: Counter[int] = field(default_factory=Counter)
    stop_traffic: Callable[[], None] = lambda: None

    def count_status(self, status: int) -> None:
        """One answer of the steady traffic (0: the request failed)."""
        self.statuses[status] += 1

    def records(self, *kinds: str, pop: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in iter_records(self.state_dir)
            if (not kinds or r["kind"] in kinds) and (pop is None or r.get("pop") == pop)
        ]

    def weights(self, pop: str) -> dict[str, int]:
        return self.service.server.intent.weights(pop, "shop")

    def envoy_weights(self, pop: str, cluster: str = "shop.critical") -> dict[str, int]:
        return envoy_locality_weights(self.envoys[pop], cluster)


def envoy_locality_weights(envoy: EnvoyProcess, cluster: str = "shop.critical") -> dict[str, int]:
    """Locality weights an Envoy really applied (config_dump with EDS), by zone = origin."""
    dump = envoy.admin_json("/config_dump?include_eds")
    for config in dump["configs"]:
        if not config["@type"].endswith("EndpointsConfigDump"):
            continue
        for entry in config.get("dynamic_endpoint_configs", []):
            assignment = entry["endpoint_config"]
            if assignment["cluster_name"] != cluster:
                continue
            return {
                locality["locality"]["zone"]: int(locality.get("load_balancing_weight", 0))
                for locality in assignment.get("endpoints", [])
            }
    return {}


@dataclass
class Edge:
    """One PoP's edge: Ballast, its origins and one Envoy of ewr listening on `listener`."""

    service: BallastService
    envoy: EnvoyProcess
    origins: dict[str, DemoOrigin]
    listener: int


@contextlib.asynccontextmanager
async def ewr_edge(tmp_path: Path, edit: Callable[[str], str] = str) -> AsyncIterator[Edge]:
    """Ballast serving the fast desired state (`write_fast_desired`, its text passed through
    `edit`) with origins primary/secondary and one real Envoy of ewr (node `ewr-1`). The
    reconcile loop ticks once at start-up and then not for an hour, with no probes and no admin
    API: for tests that set the running intent themselves (`harness/intent_changes.py`) and
    look at what the Envoy does with it."""
    origins = {
        "primary": await DemoOrigin("primary", free_port()).start(),
        "secondary": await DemoOrigin("secondary", free_port()).start(),
    }
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(tmp_path / "desired.yaml", origins, listener, sjc_listener)
    desired.write_text(edit(desired.read_text()))
    xds_port, admin = free_port(), free_port()
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{xds_port}",
        admin_address=None, probes=False, reconcile_interval_ms=3_600_000,
    ))
    envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=xds_port,
                                       admin_port=admin), admin)
    try:
        await service.start()
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready, 20)
        yield Edge(service, envoy, origins, listener)
    finally:
        envoy.stop()
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()


TRAFFIC_PATHS = ("/api/checkout/cart", "/", "/img/a.png")


@contextlib.asynccontextmanager
async def running_fleet(
    tmp_path: Path,
    *,
    metrics_source: str = "sink",
    prometheus_url: Callable[[dict[str, EnvoyProcess]], Any] | None = None,
    rps: float = 25.0,
    admin_token: str | None = None,
    lrs_endpoint_granularity: bool = False,
) -> AsyncIterator[Fleet]:
    """Ballast + origins primary/secondary + one Envoy per PoP (ewr, sjc) + steady traffic.

    `metrics_source` `sink` (stats sinks), `lrs` (load reports: the Envoys report load and send
    no stats) or `sink+lrs` (both). `fleet.stop_traffic()` ends the steady traffic.

    With `prometheus_url`, it is called with the started Envoys and returns (an awaitable of)
    the Prometheus URL to read from, so a test can start Prometheus scraping those Envoys.
    With `admin_token`, the admin API requires it (written to a token file, mode 0600).
    """
    token_file = _token_file(tmp_path, admin_token)
    origins = {
        "primary": await DemoOrigin("primary", free_port()).start(),
        "secondary": await DemoOrigin("secondary", free_port()).start(),
    }
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(
        tmp_path / "desired.yaml", origins, listener, sjc_listener
    )
    state_dir = tmp_path / "state"
    envoys: dict[str, EnvoyProcess] = {}
    service: BallastService | None = None
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        xds_port = free_port()
        _start_edges(envoys, xds_port, metrics_source)
        url = None
        if prometheus_url is not None:
            url = prometheus_url(envoys)
            if asyncio.iscoroutine(url):
                url = await url
        service = BallastService(ServiceConfig(
            desired_path=desired,
            state_dir=state_dir,
            xds_address=f"127.0.0.1:{xds_port}",
            admin_address="127.0.0.1:0",
            metrics_source="prometheus" if url else metrics_source,  # type: ignore[arg-type]
            lrs_interval_ms=1000,
            lrs_endpoint_granularity=lrs_endpoint_granularity,
            prometheus_url=url,
            probe_interval_ms=1000,
            reload_poll_s=0.1,
            admin_token_file=token_file,
        ))
        await service.start()
        for envoy in envoys.values():
            await asyncio.to_thread(envoy.wait_ready, 20)
        if metrics_source.endswith("lrs"):  # Envoy's load reports count from their first
            await eventually(lambda: len([r for r in service.load_reports.reporters()
                                          if r["clusters"]]) == len(envoys), 20,
                             "every Envoy's load reports to name its clusters")
        fleet = Fleet(service, origins, envoys, {"ewr": listener, "sjc": sjc_listener},
                      state_dir, stop_traffic=stop.set)
        tasks = [asyncio.create_task(steady_traffic(f"http://127.0.0.1:{port}", TRAFFIC_PATHS,
                                                    rps, stop, fleet.count_status))
                 for port in fleet.listener_ports.values()]
        yield fleet
    finally:
        await stop_tasks(stop, tasks)
        for envoy in envoys.values():
            envoy.stop()
        if service is not None and service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()


def _token_file(tmp_path: Path, admin_token: str | None) -> Path | None:
    """The admin token written to a file only its owner reads (None: no token)."""
    if admin_token is None:
        return None
    token_file = tmp_path / "admin.token"
    token_file.write_text(admin_token + "\n")
    token_file.chmod(0o600)
    return token_file


def _start_edges(envoys: dict[str, EnvoyProcess], xds_port: int, metrics_source: str) -> None:
    """One Envoy per PoP (ewr, sjc), each into `envoys` as it starts (the caller stops them)."""
    for pop in ("ewr", "sjc"):
        admin = free_port()
        bootstrap = ads_bootstrap(
            node_id=f"{pop}-edge-1",
            pop=pop,
            xds_port=xds_port,
            admin_port=admin,
            metrics_sink=metrics_source.startswith("sink"),
            load_reports=metrics_source.endswith("lrs"),
            needed_stats_only=True,
            stats_flush_interval_ms=1000,
        )
        envoys[pop] = EnvoyProcess(bootstrap, admin).start()


def dump_records(records: list[dict[str, Any]]) -> str:
    """For assertion messages: the decision records, one per line."""
    return "\n".join(
        json.dumps({k: r.get(k) for k in ("seq", "kind", "pop", "weights_after", "rule")})
        for r in records
    )
