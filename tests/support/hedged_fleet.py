"""The hedged-tier matrix's fleet (issue 33): two PoPs, two origin groups, real Envoys.

Group `hedged` gets checkout traffic only (the critical tier, which hedges after 50 ms); group
`mixed` gets checkout, normal and background traffic (`/n/...`, `/b/...`). Each group has its own
primary and standby (`<group>-primary`, `<group>-secondary`: demo origins that log every attempt)
and its own listener, in both PoPs. Failover ticks every second over 3 s windows; the standby
ramp and its hedge guard are the product's defaults. Modes (the metric source x deployment):

- `sink`: one Ballast in-process, its metrics sink fed by one Envoy per PoP;
- `prometheus`: the same, Ballast reading a real Prometheus that scrapes the Envoys;
- `replicas`: three `ballast serve` replicas on a real etcd, reading Prometheus (replicas need
  it: `--store` requires `--metrics-source prometheus`), two Envoys in ewr and one in sjc
  spread over them.

Steady traffic runs through every (PoP, group) from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.etcd import EtcdServer
from harness.traffic import steady_traffic, stop_tasks
from tests.support.prometheus import PrometheusServer
from tests.support.replicas import Replica, get_json, serve_replica, until

GROUPS = ("hedged", "mixed")
PATHS = {"hedged": ("/api/checkout/cart", "/"),
         "mixed": ("/api/checkout/cart", "/n/list", "/", "/b/image")}  # half critical
CLIENTS = {"ewr": 4, "sjc": 2}  # sequential clients per (PoP, group): ewr's are measured
MODES = ("sink", "prometheus", "replicas")

DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: {offset}}}
tiers:
  critical: {{hedge_delay: 50ms}}
  normal: {{}}
  background: {{}}
failover:
  interval: 1s
  window: 3s
  stale_after: 10s
  min_samples: 5  # a 3 s window holds 6 probes (1 s rounds, two paths)
origin_groups:
{groups}rollout: {{strategy: immediate}}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
    - {{name: normal, path_prefix: /n/, tier: normal}}
    - {{name: background, path_prefix: /b/, tier: background}}
listeners:
{listeners}"""

GROUP = """\
  {name}:
    origins:
      primary: {{address: 127.0.0.1, port: {primary}}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
    preference:
      ewr: [primary, secondary]
      sjc: [primary, secondary]
    health_check: {{interval: 1s, connect_timeout: 500ms, read_timeout: 1s}}
"""

LISTENER = """\
  - name: {name}
    port: {port}
    virtual_hosts:
      - {{name: {name}, domains: ["*"], origin_group: {name}}}
"""


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listener_ports() -> tuple[dict[str, int], int]:
    """ewr's listener port per group and sjc's offset: every port free."""
    while True:
        ports = {group: free_port() for group in GROUPS}
        for offset in range(1, 200):
            if all(_port_free(p + offset) and p + offset not in ports.values()
                   for p in ports.values()):
                return ports, offset


def desired_yaml(origins: dict[str, DemoOrigin], ports: dict[str, int], offset: int) -> str:
    return DESIRED.format(
        offset=offset,
        groups="".join(GROUP.format(name=g, primary=origins[f"{g}-primary"].port,
                                    secondary=origins[f"{g}-secondary"].port) for g in GROUPS),
        listeners="".join(LISTENER.format(name=g, port=ports[g]) for g in GROUPS))


@dataclass
class HedgedFleet:
    mode: str
    origins: dict[str, DemoOrigin]
    listeners: dict[tuple[str, str], int]  # (PoP, group) -> port
    service: BallastService | None = None
    replicas: list[Replica] = field(default_factory=list)
    state_dir: Path | None = None
    statuses: list[tuple[float, str, str, int]] = field(default_factory=list)

    def leader_state(self) -> Path | None:
        for replica in self.replicas:
            if replica.alive() and replica.status().get("replication", {}).get("leading"):
                return replica.state
        return None

    def records(self, *kinds: str, pop: str | None = None, group: str | None = None
                ) -> list[dict[str, Any]]:
        """The decision records (the leader's log with replicas), filtered."""
        state = self.state_dir if not self.replicas else self.leader_state()
        if state is None:
            return []
        return [r for r in iter_records(state)
                if (not kinds or r["kind"] in kinds) and (pop is None or r.get("pop") == pop)
                and (group is None or r.get("group") == group)]

    def count(self, pop: str, group: str) -> Callable[[int], None]:
        return lambda status: self.statuses.append((time.monotonic(), pop, group, status))


def _bootstrap(node: str, pop: str, xds: int, admin: int, mode: str,
               others: list[tuple[str, int]]) -> dict[str, Any]:
    return ads_bootstrap(node_id=node, pop=pop, xds_port=xds, admin_port=admin,
                         metrics_sink=mode == "sink", needed_stats_only=True,
                         stats_flush_interval_ms=1000, xds_replicas=others)


@contextlib.asynccontextmanager
async def hedged_fleet(tmp_path: Path, mode: str, rps: float = 8.0
                       ) -> AsyncIterator[HedgedFleet]:
    """The fleet of `mode` (module docstring), traffic flowing: `CLIENTS` per (PoP, group),
    `rps` each."""
    origins = {f"{g}-{role}": await DemoOrigin(f"{g}-{role}", free_port()).start()
               for g in GROUPS for role in ("primary", "secondary")}
    ports, offset = listener_ports()
    desired = tmp_path / "desired.yaml"
    desired.write_text(desired_yaml(origins, ports, offset))
    listeners = {(pop, g): ports[g] + (offset if pop == "sjc" else 0)
                 for pop in ("ewr", "sjc") for g in GROUPS}
    fleet = HedgedFleet(mode, origins, listeners)
    envoys: list[EnvoyProcess] = []
    prometheus: PrometheusServer | None = None
    etcd: EtcdServer | None = None
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        if mode == "replicas":
            etcd = EtcdServer().start()
            fleet.replicas = [Replica(f"r{i}", free_port(), free_port(), tmp_path / f"r{i}")
                              for i in range(3)]
            nodes = [("ewr-0", "ewr", fleet.replicas[0]), ("ewr-1", "ewr", fleet.replicas[1]),
                     ("sjc-0", "sjc", fleet.replicas[2])]
        else:
            xds = free_port()
            nodes = [("ewr-1", "ewr", None), ("sjc-1", "sjc", None)]
        for node, pop, preferred in nodes:
            admin = free_port()
            if preferred is None:
                bootstrap = _bootstrap(node, pop, xds, admin, mode, [])
            else:
                others = [("127.0.0.1", r.xds) for r in fleet.replicas if r is not preferred]
                bootstrap = _bootstrap(node, pop, preferred.xds, admin, mode, others)
            envoys.append(EnvoyProcess(bootstrap, admin))
        if mode != "sink":
            prometheus = await asyncio.to_thread(
                PrometheusServer([e.admin_port for e in envoys]).start)
        if mode == "replicas":
            assert etcd is not None and prometheus is not None
            for replica in fleet.replicas:
                serve_replica(replica, desired, etcd, prometheus.url)
            for replica in fleet.replicas:
                await until(lambda r=replica: get_json(f"{r.url}/readyz")[0] == 200, 30,
                            f"{replica.name} ready")
            await until(lambda: fleet.leader_state() is not None, 15, "a leader")
        else:
            fleet.state_dir = tmp_path / "state"
            fleet.service = BallastService(ServiceConfig(
                desired_path=desired, state_dir=fleet.state_dir,
                xds_address=f"127.0.0.1:{xds}", admin_address="127.0.0.1:0",
                metrics_source="sink" if mode == "sink" else "prometheus",
                prometheus_url=None if prometheus is None else prometheus.url,
                probe_interval_ms=1000, reload_poll_s=0.1))
            await fleet.service.start()
        for envoy in envoys:
            envoy.start()
        for envoy in envoys:
            await asyncio.to_thread(envoy.wait_ready, 30)
        tasks = [asyncio.create_task(steady_traffic(
            f"http://127.0.0.1:{port}", PATHS[group], rps, stop, fleet.count(pop, group)))
            for (pop, group), port in listeners.items() for _ in range(CLIENTS[pop])]
        yield fleet
    finally:
        await stop_tasks(stop, tasks)
        for envoy in envoys:
            envoy.stop()
        if fleet.service is not None and fleet.service.ready:
            await fleet.service.stop(0.5)
        for replica in fleet.replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(replica.proc.pid, signal.SIGKILL)
                replica.proc.wait()
        if prometheus is not None:
            await asyncio.to_thread(prometheus.stop)
        if etcd is not None:
            etcd.cleanup()
        for origin in origins.values():
            await origin.stop()
