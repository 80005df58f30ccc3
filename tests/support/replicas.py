"""Several `ballast serve` replicas on one etcd, real Envoys spread over them, a real Prometheus
the leader reads, demo origins and steady traffic: the fleet of the high-availability tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.etcd import EtcdServer
from harness.eventually import eventually
from harness.fleet import envoy_locality_weights, write_fast_desired
from harness.traffic import steady_traffic, stop_tasks
from tests.support.prometheus import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
LEADER_TTL_S = 2


def get_json(url: str, timeout: float = 2) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {}
    except (OSError, ValueError):
        return 0, {}


async def until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """The seconds until `condition` (blocking: run in a thread) holds, by `eventually`."""
    started = time.monotonic()
    await eventually(condition, timeout, what, in_thread=True, interval=0.1)
    return time.monotonic() - started


@dataclass
class Replica:
    name: str
    xds: int
    admin: int
    state: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.admin}"

    def status(self) -> dict[str, Any]:
        return get_json(f"{self.url}/status")[1]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signum)


@dataclass
class ReplicaFleet:
    etcd: EtcdServer
    replicas: list[Replica]
    envoys: dict[str, EnvoyProcess]
    origins: dict[str, DemoOrigin]
    listeners: dict[str, int]
    results: list[tuple[float, str, int]] = field(default_factory=list)  # (when, pop, status)
    samples: list[tuple[float, str, dict[str, int]]] = field(default_factory=list)

    def leader(self) -> Replica | None:
        for replica in self.replicas:
            if replica.alive() and replica.status().get("replication", {}).get("leading"):
                return replica
        return None

    def weights(self, pop: str = "ewr") -> dict[str, int]:
        """Weights of shop in `pop` as a live replica serves them."""
        for replica in self.replicas:
            if replica.alive():
                code, body = get_json(f"{replica.url}/weights")
                if code == 200:
                    return body["weights"][pop]["shop"]
        return {}

    def failed(self, since: float = 0.0, until: float = float("inf")
               ) -> list[tuple[float, str, int]]:
        return [r for r in self.results if since <= r[0] <= until and r[2] != 200]


def serve_replica(replica: Replica, desired: Path, etcd: EtcdServer, prometheus: str) -> None:
    """`ballast serve` as `replica` on `etcd`, reading Prometheus at `prometheus`."""
    replica.state.mkdir(parents=True, exist_ok=True)
    with open(replica.state.parent / f"{replica.name}.log", "ab") as log:
        replica.proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli.main", "serve", str(desired),
             "--xds-address", f"127.0.0.1:{replica.xds}",
             "--admin-address", f"127.0.0.1:{replica.admin}",
             "--state-dir", str(replica.state),
             "--store", etcd.url, "--replica-id", replica.name,
             "--leader-ttl", f"{LEADER_TTL_S}s",
             "--metrics-source", "prometheus", "--prometheus-url", prometheus,
             "--probe-interval", "1s", "--log-level", "warning"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
        )


@contextlib.asynccontextmanager
async def replica_fleet(
    tmp_path: Path, *, replicas: int = 3, ewr_envoys: int = 3
) -> AsyncIterator[ReplicaFleet]:
    """Replicas r0.., Envoys ewr-0.. (ewr-i prefers replica i, the others its failover) and
    sjc-0 (prefers the last replica), 25 requests/s through each PoP, EDS weights sampled."""
    etcd = EtcdServer().start()
    origins = {name: await DemoOrigin(name, free_port()).start()
               for name in ("primary", "secondary")}
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(tmp_path / "desired.yaml", origins, listener, sjc_listener)
    members = [Replica(f"r{i}", free_port(), free_port(), tmp_path / f"r{i}")
               for i in range(replicas)]
    envoys: dict[str, EnvoyProcess] = {}
    pops = [(f"ewr-{i}", "ewr", members[i % replicas]) for i in range(ewr_envoys)]
    pops.append(("sjc-0", "sjc", members[-1]))
    for node, pop, preferred in pops:
        admin_port = free_port()
        others = [("127.0.0.1", m.xds) for m in members if m is not preferred]
        envoys[node] = EnvoyProcess(
            ads_bootstrap(node_id=node, pop=pop, xds_port=preferred.xds, admin_port=admin_port,
                          metrics_sink=True, stats_flush_interval_ms=1000,
                          xds_replicas=others),
            admin_port,
        )
    prometheus = PrometheusServer([e.admin_port for e in envoys.values()]).start()
    fleet = ReplicaFleet(etcd, members, envoys, origins, {"ewr": listener, "sjc": sjc_listener})
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for member in members:
            serve_replica(member, desired, etcd, prometheus.url)
        for member in members:
            await until(lambda m=member: get_json(f"{m.url}/readyz")[0] == 200, 30,
                        f"{member.name} ready")
        await until(lambda: fleet.leader() is not None, 15, "a leader")
        for envoy in envoys.values():
            envoy.start()
        for envoy in envoys.values():
            await asyncio.to_thread(envoy.wait_ready, 30)

        def record(pop: str) -> Callable[[int], None]:
            return lambda status: fleet.results.append((time.monotonic(), pop, status))

        tasks = [
            asyncio.create_task(steady_traffic(
                f"http://127.0.0.1:{port}", ("/api/checkout",), 25, stop, record(pop)))
            for pop, port in fleet.listeners.items()
        ]

        async def sample_one(node: str, envoy: EnvoyProcess) -> None:
            with contextlib.suppress(OSError, KeyError, ValueError):
                weights = await asyncio.to_thread(envoy_locality_weights, envoy)
                if weights:
                    fleet.samples.append((time.monotonic(), node, weights))

        async def sample() -> None:  # every Envoy at once: a round is one config_dump long
            while not stop.is_set():
                await asyncio.gather(*(sample_one(n, e) for n, e in envoys.items()))
                await asyncio.sleep(0.1)

        tasks.append(asyncio.create_task(sample()))
        yield fleet
    finally:
        await stop_tasks(stop, tasks)
        for envoy in envoys.values():
            envoy.stop()
        for member in members:
            if member.proc is not None and member.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(member.proc.pid, signal.SIGCONT)
                    os.killpg(member.proc.pid, signal.SIGKILL)
                member.proc.wait()
        prometheus.stop()
        for origin in origins.values():
            await origin.stop()
        etcd.cleanup()
