"""What serves the edge in a run: Ballast (a `ballast serve` subprocess) with one real Envoy per
PoP, or the baseline — one real Envoy per PoP from a static config doing binary active-passive
failover. Each stops exactly the processes it started, by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from control_plane.translate.bootstrap import ads_bootstrap
from harness.envoy_process import EnvoyProcess, free_port, stop_group

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "shop.critical"  # Ballast's weights are the same in every tier cluster of the group


class Edge(Protocol):
    listener_ports: dict[str, int]

    def weights(self, pop: str) -> dict[str, int]: ...

    def stop(self) -> None: ...


def ballast_desired(
    pops: list[str], listener: dict[str, int], origins: dict[str, int], extra: str = "",
    concurrency: int = 120,
) -> str:
    """The desired state of a run: the example's shape in compressed time (a failover tick each
    second over 3 s windows; seed 002 says 20 s over 30 s)."""
    first = listener[pops[0]]
    pop_lines = "".join(
        f"  {p}: {{listen_address: 127.0.0.1, port_offset: {listener[p] - first}}}\n" for p in pops
    )
    origin_lines = "".join(
        f"      {name}: {{address: 127.0.0.1, port: {port}}}\n" for name, port in origins.items()
    )
    preference = "".join(f"      {p}: [{', '.join(origins)}]\n" for p in pops)
    return (
        f"pops:\n{pop_lines}"
        "failover: {interval: 1s, window: 3s, stale_after: 10s}\n"
        "standby_ramp: {cold_after: 10s}\n"
        "tier_actions: {for: 3s, recover_after: 6s, stale_after: 10s}\n"
        f"{extra}"
        f"origin_groups:\n  shop:\n    max_origin_concurrency: {concurrency}\n    origins:\n"
        f"{origin_lines}    preference:\n{preference}"
        "    health_check: {interval: 1s, connect_timeout: 500ms, read_timeout: 1s}\n"
        "classification:\n  default_tier: critical\n  rules:\n"
        "    - {name: checkout, path_prefix: /api/checkout, tier: critical}\n"
        "    - {name: html, path_prefix: /p/, tier: normal}\n"
        "    - {name: images, path_prefix: /_next/image, tier: background}\n"
        "listeners:\n  - name: edge\n"
        f"    port: {first}\n"
        "    virtual_hosts:\n      - {name: shop, domains: [\"*\"], origin_group: shop}\n"
    )


class BallastEdge:
    """`ballast serve` as a subprocess (so it can be killed -9 and restarted) and its Envoys."""

    def __init__(self, workdir: Path, pops: list[str], origins: dict[str, int], seed: int,
                 extra_desired: str = "", concurrency: int = 120) -> None:
        self.workdir = workdir
        self.state_dir = workdir / "state"
        ports = sorted(free_port() for _ in pops)
        self.listener_ports = dict(zip(pops, ports, strict=True))
        self.desired = workdir / "desired.yaml"
        self.desired.write_text(ballast_desired(pops, self.listener_ports, origins,
                                                extra_desired, concurrency))
        self.xds_port = free_port()
        self.seed = seed
        self.proc: subprocess.Popen[bytes] | None = None
        self.envoys: dict[str, EnvoyProcess] = {}
        for pop in pops:
            admin = free_port()
            bootstrap = ads_bootstrap(node_id=f"{pop}-edge-1", pop=pop, xds_port=self.xds_port,
                                      admin_port=admin, metrics_sink=True,
                                      needed_stats_only=True, stats_flush_interval_ms=1000)
            self.envoys[pop] = EnvoyProcess(bootstrap, admin,
                                            log_path=workdir / f"envoy-{pop}.log")

    def start_ballast(self) -> None:
        log = open(self.workdir / "ballast.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane", "serve", str(self.desired),
             "--xds-address", f"127.0.0.1:{self.xds_port}", "--admin-address",
             f"127.0.0.1:{free_port()}", "--state-dir", str(self.state_dir),
             "--seed", str(self.seed), "--log-level", "warning"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
        )
        log.close()

    def wait_serving(self, timeout: float) -> None:
        """Until Ballast accepts connections on its xDS port (an Envoy that finds it closed
        backs off before trying again)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ballast serve exited with {self.proc.returncode}, see "
                                   f"{self.workdir / 'ballast.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.xds_port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("ballast serve does not listen") from None
                time.sleep(0.05)

    def start(self, timeout: float = 30.0) -> None:
        self.start_ballast()
        self.wait_serving(timeout)
        for envoy in self.envoys.values():
            envoy.start()
        for envoy in self.envoys.values():
            envoy.wait_ready(timeout)
        deadline = time.monotonic() + timeout
        while not all(self.weights(pop) for pop in self.envoys):
            if time.monotonic() > deadline:
                raise TimeoutError("Envoys got no endpoints from Ballast")
            time.sleep(0.1)

    def kill_ballast(self) -> None:
        """kill -9, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def weights(self, pop: str) -> dict[str, int]:
        """The locality weights this PoP's Envoy really applied."""
        dump = self.envoys[pop].admin_json("/config_dump?include_eds")
        for config in dump["configs"]:
            if not config["@type"].endswith("EndpointsConfigDump"):
                continue
            for entry in config.get("dynamic_endpoint_configs", []):
                assignment = entry["endpoint_config"]
                if assignment["cluster_name"] == CLUSTER:
                    return {loc["locality"]["zone"]: int(loc.get("load_balancing_weight", 0))
                            for loc in assignment.get("endpoints", [])}
        return {}

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
        if self.proc is not None:
            stop_group(self.proc, 10)


UNHEALTHY_THRESHOLD = 3
HEALTHY_THRESHOLD = 3


def baseline_bootstrap(pop: str, listener: int, admin: int, origins: dict[str, int],
                       concurrency: int = 120) -> dict[str, Any]:
    """Binary active-passive: one cluster, the primary at priority 0, the standby at priority 1,
    an active health check every second that takes the primary out after UNHEALTHY_THRESHOLD
    failed checks (100/0 → 0/100) and back after HEALTHY_THRESHOLD good ones. One FIFO pool for
    every request; one retry on 5xx/reset/connect failure."""
    pop_header = [{"header": {"key": "x-ballast-pop", "value": pop}}]
    endpoints = [
        {"priority": priority, "locality": {"zone": name}, "lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}
        for priority, (name, port) in enumerate(origins.items())
    ]
    route = {"cluster": "shop", "timeout": "4s",
             "retry_policy": {"retry_on": "5xx,connect-failure,reset", "num_retries": 1}}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
                 "v3.HttpConnectionManager",
        "stat_prefix": "edge",
        "route_config": {"virtual_hosts": [{
            "name": "shop", "domains": ["*"], "request_headers_to_add": pop_header,
            "routes": [{"match": {"prefix": "/"}, "route": route}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    limits = {"max_connections": concurrency, "max_pending_requests": 10000,
              "max_requests": concurrency}
    return {
        "node": {"id": f"{pop}-baseline", "cluster": "baseline"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "edge",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}],
            }],
            "clusters": [{
                "name": "shop", "type": "STATIC", "connect_timeout": "0.5s",
                "circuit_breakers": {"thresholds": [limits]},
                "load_assignment": {"cluster_name": "shop", "endpoints": endpoints},
                "health_checks": [{
                    "timeout": "1s", "interval": "1s", "no_traffic_interval": "1s",
                    "no_traffic_healthy_interval": "1s",
                    "unhealthy_threshold": UNHEALTHY_THRESHOLD,
                    "healthy_threshold": HEALTHY_THRESHOLD,
                    "http_health_check": {"path": "/healthz",
                                          "request_headers_to_add": pop_header},
                }],
            }],
        },
    }


class BaselineEdge:
    def __init__(self, workdir: Path, pops: list[str], origins: dict[str, int],
                 concurrency: int = 120) -> None:
        self.origin_names = list(origins)
        self.listener_ports = {pop: free_port() for pop in pops}
        self.envoys = {}
        for pop in pops:
            admin = free_port()
            self.envoys[pop] = EnvoyProcess(
                baseline_bootstrap(pop, self.listener_ports[pop], admin, origins, concurrency),
                admin,
                log_path=workdir / f"baseline-envoy-{pop}.log")

    def start(self, timeout: float = 30.0) -> None:
        for envoy in self.envoys.values():
            envoy.start()
        for envoy in self.envoys.values():
            envoy.wait_ready(timeout)
        deadline = time.monotonic() + timeout
        while not all(self.weights(pop).get(self.origin_names[0]) for pop in self.envoys):
            if time.monotonic() > deadline:
                raise TimeoutError("the baseline's health checks never passed the primary")
            time.sleep(0.1)

    def weights(self, pop: str) -> dict[str, int]:
        """The effective split: everything to the highest priority with a healthy host."""
        clusters = self.envoys[pop].admin_json("/clusters?format=json")
        healthy: dict[str, bool] = {}
        for cluster in clusters.get("cluster_statuses", []):
            if cluster["name"] != "shop":
                continue
            for host in cluster.get("host_statuses", []):
                port = host["address"]["socket_address"]["port_value"]
                flags = host.get("health_status", {})
                healthy[str(port)] = not (flags.get("failed_active_health_check")
                                          or flags.get("failed_outlier_check"))
        ports = [str(e["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"])
                 for e in self._endpoints(pop)]
        chosen = next((i for i, p in enumerate(ports) if healthy.get(p)), 0)
        return {name: 100 if i == chosen else 0 for i, name in enumerate(self.origin_names)}

    def _endpoints(self, pop: str) -> list[dict[str, Any]]:
        cluster = self.envoys[pop].bootstrap["static_resources"]["clusters"][0]
        return list(cluster["load_assignment"]["endpoints"])

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
