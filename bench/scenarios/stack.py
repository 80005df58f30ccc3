"""What serves the edge in a run: Ballast (a `ballast serve` subprocess) with one real Envoy per
PoP, or a baseline — one real Envoy per PoP from the static config a competent operator would
write (`baseline_bootstrap`, printed in full in the reports). Each stops exactly the processes
it started, by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.scenarios.timers import compressed, duration, envoy_duration
from control_plane.translate.bootstrap import ads_bootstrap
from harness.envoy_process import EnvoyProcess, free_port, stop_group
from harness.eventually import eventually_blocking

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "shop.critical"  # Ballast's weights are the same in every tier cluster of the group


def _until(check: Callable[[], object], timeout: float, what: str,
           ignore: tuple[type[BaseException], ...] = ()) -> None:
    """`eventually_blocking`, failing with TimeoutError (a failed run, not a bench error)."""
    try:
        eventually_blocking(check, timeout, what, interval=0.1, ignore=ignore)
    except AssertionError as err:
        raise TimeoutError(str(err)) from None


class Edge(Protocol):
    listener_ports: dict[str, int]

    def weights(self, pop: str) -> dict[str, int]: ...

    def stop(self) -> None: ...


def ballast_desired(
    pops: list[str], listener: dict[str, int], origins: dict[str, int], extra: str = "",
    concurrency: int = 120,
) -> str:
    """The desired state of a run: the defaults (seed 002 / seed 000) with every control timer
    compressed by `timers.COMPRESSION`, and every request in the access-log signal."""
    first = listener[pops[0]]
    pop_lines = "".join(
        f"  {p}: {{listen_address: 127.0.0.1, port_offset: {listener[p] - first}}}\n" for p in pops
    )
    origin_lines = "".join(
        f"      {name}: {{address: 127.0.0.1, port: {port}}}\n" for name, port in origins.items()
    )
    preference = "".join(f"      {p}: [{', '.join(origins)}]\n" for p in pops)
    c = compressed
    return (
        f"pops:\n{pop_lines}"
        f"failover: {{interval: {duration(c(20))}, window: {duration(c(30))}, "
        f"stale_after: {duration(c(45))}, damping_half_life: {duration(c(900))}}}\n"
        f"standby_ramp: {{cold_after: {duration(c(90))}}}\n"
        f"tier_actions: {{for: {duration(c(30))}, recover_after: {duration(c(60))}, "
        f"stale_after: {duration(c(45))}}}\n"
        "access_log: {sample_rate: 1.0}\n"
        f"{extra}"
        f"origin_groups:\n  shop:\n    max_origin_concurrency: {concurrency}\n    origins:\n"
        f"{origin_lines}    preference:\n{preference}"
        f"    health_check: {{interval: {duration(c(5))}, connect_timeout: {duration(c(2))}, "
        f"read_timeout: {duration(c(4))}}}\n"
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
        def listening() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ballast serve exited with {self.proc.returncode}, see "
                                   f"{self.workdir / 'ballast.log'}")
            socket.create_connection(("127.0.0.1", self.xds_port), timeout=1).close()
            return True

        _until(listening, timeout, "ballast serve listening", ignore=(OSError,))

    def start(self, timeout: float = 30.0) -> None:
        self.start_ballast()
        self.wait_serving(timeout)
        for envoy in self.envoys.values():
            envoy.start()
        for envoy in self.envoys.values():
            envoy.wait_ready(timeout)
        _until(lambda: all(self.weights(pop) for pop in self.envoys), timeout,
               "the Envoys getting endpoints from Ballast")

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


# --- the baselines: static Envoy configs a competent operator would run -------------------------

HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager")
ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
RETRY_BUDGET = {"budget_percent": {"value": 15.0}, "min_retry_concurrency": 3}  # seed 002: 15 %
BACK_OFF = {"base_interval": "0.025s", "max_interval": "0.25s"}
UNHEALTHY_THRESHOLD = 3  # seed 002: "If health checks fail N times in a row"
HEALTHY_THRESHOLD = 3
OVERPROVISIONING = 140  # Envoy's default factor 1.4, stated
# the failover scenarios' baselines: hosts per origin (the same origin process on that many ports)
FAILOVER_BASELINES = {"binary": 1, "priority-spill": 4}
PRIORITY_BASELINES = ("fifo", "static-tiers")
# the tier set both Ballast (its defaults) and `static-tiers` use: name, share of the origin's
# concurrency, max_pending, queue_timeout ms, read_timeout ms, retries, path prefix
TIER_SET = (
    ("critical", 70, 2000, 800, 2000, 2, "/"),
    ("normal", 25, 8000, 1500, 4000, 1, "/p/"),
    ("background", 5, 2000, 3000, 8000, 0, "/_next/image"),
)


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _envoy(pop: str, listener: int, admin: int, routes: list[dict[str, Any]],
           clusters: list[dict[str, Any]]) -> dict[str, Any]:
    hcm = {
        "@type": HCM_TYPE, "stat_prefix": "edge",
        "route_config": {"virtual_hosts": [{
            "name": "shop", "domains": ["*"],
            "request_headers_to_add": [{"header": {"key": "x-ballast-pop", "value": pop}}],
            "routes": routes}]},
        "http_filters": [ROUTER],
    }
    return {
        "node": {"id": f"{pop}-baseline", "cluster": "baseline"},
        "admin": {"address": _address(admin)},
        "static_resources": {
            "listeners": [{"name": "edge", "address": _address(listener), "filter_chains": [{
                "filters": [{"name": "envoy.filters.network.http_connection_manager",
                             "typed_config": hcm}]}]}],
            "clusters": clusters,
        },
    }


def _breakers(concurrency: int, pending: int) -> dict[str, Any]:
    return {"thresholds": [{
        "max_connections": concurrency, "max_pending_requests": pending,
        "max_requests": concurrency, "max_retries": max(3, concurrency * 15 // 100),
        "retry_budget": RETRY_BUDGET}]}


def failover_bootstrap(pop: str, listener: int, admin: int, origins: dict[str, list[int]],
                       concurrency: int = 120) -> dict[str, Any]:
    """The strongest static Envoy failover we can write (seed 002's binary active-passive plus
    what Envoy offers on top): primary hosts at priority 0, standby at priority 1 (Envoy's
    priority failover, overprovisioning factor 1.4: a priority with fewer than 1/1.4 of its
    hosts healthy spills the rest to the next); a shallow `/healthz` check every 5 s (compressed)
    with seed 002's 2 s timeout that takes a host out after 3 failures; outlier detection on
    consecutive 5xx and on failure percentage (and success rate, which needs 2 hosts with
    traffic to compare); up to 2 retries on 5xx / reset / connect failure that avoid the hosts
    and the priority already tried (previous_hosts, previous_priorities), under a 15 % retry
    budget; seed 002's 2 s connect and 4 s read timeouts."""
    endpoints = [
        {"priority": priority, "locality": {"zone": name},
         "lb_endpoints": [{"endpoint": {"address": _address(port)}} for port in ports]}
        for priority, (name, ports) in enumerate(origins.items())
    ]
    c = compressed
    cluster = {
        "name": "shop", "type": "STATIC", "connect_timeout": "2s",
        "circuit_breakers": _breakers(concurrency, concurrency),
        "load_assignment": {"cluster_name": "shop", "endpoints": endpoints,
                            "policy": {"overprovisioning_factor": OVERPROVISIONING}},
        "health_checks": [{
            "timeout": envoy_duration(c(2)), "interval": envoy_duration(c(5)),
            "no_traffic_interval": envoy_duration(c(5)), "unhealthy_threshold": UNHEALTHY_THRESHOLD,
            "healthy_threshold": HEALTHY_THRESHOLD,
            "http_health_check": {"path": "/healthz"}}],
        "outlier_detection": {
            "interval": envoy_duration(c(10)), "base_ejection_time": envoy_duration(c(30)),
            "max_ejection_time": envoy_duration(c(300)), "max_ejection_percent": 100,
            "consecutive_5xx": 5, "enforcing_consecutive_5xx": 100,
            "success_rate_minimum_hosts": 2, "success_rate_request_volume": 20,
            "enforcing_success_rate": 100,
            "failure_percentage_threshold": 50, "enforcing_failure_percentage": 100,
            "failure_percentage_minimum_hosts": 1, "failure_percentage_request_volume": 20,
        },
    }
    route = {"cluster": "shop", "timeout": "4s", "retry_policy": {
        "retry_on": "5xx,reset,connect-failure,refused-stream", "num_retries": 2,
        "retry_back_off": BACK_OFF, "host_selection_retry_max_attempts": 3,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3."
                         "PreviousHostsPredicate"}}],
        "retry_priority": {
            "name": "envoy.retry_priorities.previous_priorities", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority."
                         "previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 2}},
    }}
    return _envoy(pop, listener, admin, [{"match": {"prefix": "/"}, "route": route}], [cluster])


def _tier_route(prefix: str, cluster: str, queue_ms: int, read_ms: int, retries: int
                ) -> dict[str, Any]:
    """As Ballast translates a tier: per-try timeout = read timeout, the whole request's =
    queue timeout + read timeout x attempts."""
    policy: dict[str, Any] = {"retry_on": "5xx,reset,connect-failure", "num_retries": retries,
                              "retry_back_off": BACK_OFF,
                              "per_try_timeout": envoy_duration(read_ms / 1000)}
    return {"match": {"prefix": prefix}, "route": {
        "cluster": cluster, "timeout": envoy_duration((queue_ms + read_ms * (retries + 1)) / 1000),
        "retry_policy": policy}}


def priority_bootstrap(variant: str, pop: str, listener: int, admin: int, origin: int,
                       concurrency: int) -> dict[str, Any]:
    """Seed 000's baselines in front of one origin capped at `concurrency`:

    - `fifo`: one cluster, one FIFO pool of `concurrency` requests (the origin's cap) with
      `concurrency` x 10 pending, seed 002's 4 s timeout, one retry under a 15 % budget;
    - `static-tiers`: one cluster per tier with Ballast's default tier set as fixed walls
      (70 / 25 / 5 % of the cap, seed 000's queue depths and timeouts, retries 2 / 1 / 0 under
      a 15 % budget): what Ballast translates with the tier controller off, written by hand."""

    def cluster(name: str, limit: int, pending: int) -> dict[str, Any]:
        return {"name": name, "type": "STATIC", "connect_timeout": "0.3s",
                "circuit_breakers": _breakers(limit, pending),
                "load_assignment": {"cluster_name": name, "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": _address(origin)}}]}]}}

    if variant == "fifo":
        route = {"match": {"prefix": "/"}, "route": {"cluster": "shop", "timeout": "4s",
                 "retry_policy": {"retry_on": "5xx,reset,connect-failure", "num_retries": 1,
                                  "retry_back_off": BACK_OFF}}}
        return _envoy(pop, listener, admin, [route],
                      [cluster("shop", concurrency, concurrency * 10)])
    routes, clusters = [], []
    for name, share, pending, queue_ms, read_ms, retries, prefix in TIER_SET:
        clusters.append(cluster(f"shop.{name}", max(1, concurrency * share // 100), pending))
        routes.append(_tier_route(prefix, f"shop.{name}", queue_ms, read_ms, retries))
    routes.append(routes.pop(0))  # the catch-all `/` (critical, fail safe) last
    return _envoy(pop, listener, admin, routes, clusters)


class StaticEdge:
    """One Envoy per PoP from a static config; `weights` reads what its health checks and
    outlier detection make of the priorities (Envoy's own spill arithmetic)."""

    def __init__(self, workdir: Path, pops: list[str], origins: dict[str, list[int]],
                 bootstrap: Callable[[str, int, int], dict[str, Any]]) -> None:
        self.origins = origins
        self.listener_ports = {pop: free_port() for pop in pops}
        self.envoys: dict[str, EnvoyProcess] = {}
        for pop in pops:
            admin = free_port()
            self.envoys[pop] = EnvoyProcess(bootstrap(pop, self.listener_ports[pop], admin),
                                            admin, log_path=workdir / f"baseline-{pop}.log")

    def start(self, timeout: float = 30.0) -> None:
        for envoy in self.envoys.values():
            envoy.start()
        for envoy in self.envoys.values():
            envoy.wait_ready(timeout)
        first = next(iter(self.origins))
        _until(lambda: all(self.weights(pop).get(first) for pop in self.envoys), timeout,
               "the baseline's health checks passing the primary")

    def weights(self, pop: str) -> dict[str, int]:
        """The share each origin gets: Envoy's priority load from the healthy hosts
        (health checks and outlier ejections), overprovisioning factor 1.4."""
        healthy: dict[int, bool] = {}
        for cluster in self.envoys[pop].admin_json("/clusters?format=json").get(
                "cluster_statuses", []):
            for host in cluster.get("host_statuses", []):
                flags = host.get("health_status", {})
                port = int(host["address"]["socket_address"]["port_value"])
                healthy[port] = not (flags.get("failed_active_health_check")
                                     or flags.get("failed_outlier_check"))
        if len(self.origins) == 1:
            return {next(iter(self.origins)): 100}
        left, out = 100.0, {}
        for name, ports in self.origins.items():
            up = sum(healthy.get(p, False) for p in ports) / len(ports)
            share = min(left, 100.0 * min(1.0, up * OVERPROVISIONING / 100))
            out[name] = share
            left -= share
        if left > 0:  # no priority healthy enough: Envoy spreads what is left (panic)
            out[next(iter(self.origins))] += left
        return {name: round(v) for name, v in out.items()}

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
