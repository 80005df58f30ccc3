"""What serves the edge in a run: Ballast (a `ballast serve` subprocess) with one real Envoy per
PoP, or a baseline — one real Envoy per PoP from the static config a competent operator would
write (`failover_bootstrap`, `priority_bootstrap`, printed in full in the reports). Each stops
exactly the processes it started, by PID."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.scenarios.origin import POP_HEADER
from bench.scenarios.timers import compressed, duration, envoy_duration
from control_plane.translate.bootstrap import ads_bootstrap
from harness.envoy_process import EnvoyProcess, free_port, stop_group
from harness.eventually import eventually_blocking

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "shop.critical"  # Ballast's weights are the same in every tier cluster of the group
UNCACHEABLE = "/api/"  # the checkout API: never cacheable, never mirrored


def _until(check: Callable[[], object], timeout: float, what: str,
           ignore: tuple[type[BaseException], ...] = ()) -> None:
    """`eventually_blocking`, failing with TimeoutError (a failed run, not a bench error)."""
    try:
        eventually_blocking(check, timeout, what, interval=0.1, ignore=ignore)
    except AssertionError as err:
        raise TimeoutError(str(err)) from None


class Edge(Protocol):
    listener_ports: dict[str, int]

    def observe(self, pop: str) -> tuple[dict[str, int], list[str]]: ...

    def stats(self, pop: str) -> dict[str, int]: ...

    def stop(self) -> None: ...


def ballast_desired(
    pops: list[str], listener: dict[str, int], origins: dict[str, int], extra: str = "",
    concurrency: int = 120, hedge_delay_ms: int = 0,
) -> str:
    """The desired state of a run: the defaults (seed 002 / seed 000) with every control timer
    compressed by `timers.COMPRESSION`, and every request in the access-log signal;
    `hedge_delay_ms`: the critical tier hedges after that long, as in examples/desired.yaml
    (the group's override of the default tier)."""
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
        f"tier_actions: {{interval: {duration(c(5))}, for: {duration(c(30))}, "
        f"recover_after: {duration(c(60))}, "
        f"stale_after: {duration(c(45))}}}\n"
        "access_log: {sample_rate: 1.0}\n"
        f"{extra}"
        f"origin_groups:\n  shop:\n    max_origin_concurrency: {concurrency}\n    origins:\n"
        f"{origin_lines}    preference:\n{preference}"
        + (f"    tiers:\n      critical: {{hedge_delay: {hedge_delay_ms}ms}}\n"
           if hedge_delay_ms else "") +
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
                 extra_desired: str = "", concurrency: int = 120, hedge_delay_ms: int = 0
                 ) -> None:
        self.workdir = workdir
        self.state_dir = workdir / "state"
        ports = sorted(free_port() for _ in pops)
        self.listener_ports = dict(zip(pops, ports, strict=True))
        self.desired = workdir / "desired.yaml"
        self.desired.write_text(ballast_desired(pops, self.listener_ports, origins,
                                                extra_desired, concurrency, hedge_delay_ms))
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

    def observe(self, pop: str) -> tuple[dict[str, int], list[str]]:
        """The locality weights this PoP's Envoy really applied; Ballast's Envoys run no health
        checks or outlier detection of their own (Ballast's probes and signals decide)."""
        return self.weights(pop), []

    def stats(self, pop: str) -> dict[str, int]:
        return evidence_stats(self.envoys[pop])

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
# seed 002: back only after "three consecutive healthy windows (90 seconds total)": 18 passing
# checks at its 5 s interval
RETURN_AFTER_S = 90
OVERPROVISIONING = 140  # Envoy's default factor 1.4, stated
DEEP_PATH = "/healthz/cacheable"  # the cacheable path Ballast's probes read (HealthCheck)
SHALLOW_PATH = "/healthz"
PROBE_READ_TIMEOUT_S = 4  # Ballast's probe read timeout (HealthCheck.read_timeout_ms)
READ_TIMEOUT_S = 4  # seed 002's 4 s read timeout: a failover baseline's route timeout
OUTLIER_INTERVAL_S = 10  # Envoy's default, compressed like every control timer
# failure-percentage ejection: a host failing this share of its requests in an interval is
# ejected. Seed 002 starts moving at a 2 % passive 5xx rate; with a dozen requests per host and
# interval (`outlier_volume`) a threshold that low ejects on one error. Tried on `failover`
# (one run each, seed 900, load 3-8): 50 / 20 / 10 % gave priority-spill 88.9 / 87.3 / 88.6 %
# of requests within their deadline, and 50 / 20 % gave binary-deep 92.9 / 94.4 % — no
# difference beyond one run's noise; 20 is kept, nearer the seed's rule
FAILURE_PERCENT = 20
WARM_PERCENT = 5  # seed 002 "keep 5-10% of cacheable traffic pinned to the secondary"; Ballast's
MIRROR_CLUSTER = "shop.mirror"


@dataclass(frozen=True)
class FailoverBaseline:
    """A static Envoy failover for seed 002's scenarios: primary hosts at priority 0, standby at
    priority 1 (Envoy's priority failover), health checks, outlier detection, retries."""

    why: str  # one sentence: why a competent operator runs it this way
    hosts: int = 1  # ports per origin Envoy sees as hosts (the same origin process)
    deep: bool = False  # health-check Ballast's probe path, not the shallow /healthz
    warm: bool = False  # 95/5 locality weights and a 5 % mirror to the standby


FAILOVER_BASELINES: dict[str, FailoverBaseline] = {
    "binary-naive": FailoverBaseline(why=(
        "seed 002's own binary active-passive failover with its shallow `/healthz` check (the "
        "seed's naive variant, kept as such: the check stays green through the whole bleed), "
        "plus what any Envoy operator turns on — outlier detection and retries that avoid the "
        "host and priority already tried — which is all that moves its traffic")),
    "binary-deep": FailoverBaseline(deep=True, why=(
        "the same, with the check seed 002 itself tells an operator to use once the shallow "
        "one stayed green (\"use synthetic transaction checks\"): a deep check of the path "
        "Ballast probes (`/healthz/cacheable`, with Ballast's probe timeout), and a return only "
        f"after {RETURN_AFTER_S} s of passing checks (seed 002: \"three consecutive healthy "
        "windows (90 seconds total)\")")),
    "binary-warm": FailoverBaseline(deep=True, warm=True, why=(
        "binary-deep with the standby kept warm as seed 002 recommends (\"keep 5-10% of "
        "cacheable traffic pinned to the secondary at all times\"): locality weights 95/5 at "
        f"priority 0 and {WARM_PERCENT} % of cacheable requests mirrored to it — Ballast's own "
        "warm pool and mirror, without its gradual shift")),
    "priority-spill": FailoverBaseline(hosts=4, deep=True, why=(
        "Envoy's own gradual failover: four hosts per origin, so each primary host ejected by "
        "outlier detection or failed by the deep check moves traffic to the standby in steps "
        "(overprovisioning factor 1.4); its failure-percentage detection's request volume is "
        "set from the scenario's rate so that it runs (half of what a primary host receives "
        "in one interval)")),
}


@dataclass(frozen=True)
class TierSize:
    """One tier of a static-tiers baseline."""

    name: str
    slots: int  # max_connections = max_requests
    pending: int  # max_pending_requests
    queue_ms: int  # seed 000 queue_timeout
    read_ms: int  # per try
    retries: int
    prefix: str
    timeout_s: float  # the route's, every attempt and the queue included


# Ballast's default tier set (seed 000): name, share of the origin's concurrency, max_pending,
# queue_timeout ms, read_timeout ms, retries, path prefix
TIER_SET = (
    ("critical", 70, 2000, 800, 2000, 2, "/"),
    ("normal", 25, 8000, 1500, 4000, 1, "/p/"),
    ("background", 5, 2000, 3000, 8000, 0, "/_next/image"),
)
TARGET_UTILIZATION = 0.8  # a pool sized for its normal demand runs at most this busy
# seed 000's classifier: each tier's timeout per attempt and its retry budget ("tier: 0, weight:
# 100, timeoutMs: 800, retryBudget: 2", ...): the seed's edge gives up on a request of the
# tier after timeoutMs x (1 + retryBudget)
CLASSIFIER = {"critical": (800, 2), "normal": (1500, 1), "background": (3000, 0)}


def give_up_s(tier: str) -> float:
    """When seed 000's edge gives up on a request of `tier`, every attempt included: the
    deadline the reports judge goodput by, and `static-tiers`' route timeouts."""
    timeout_ms, budget = CLASSIFIER[tier]
    return timeout_ms * (1 + budget) / 1000


@dataclass(frozen=True)
class PriorityBaseline:
    why: str
    tiers: bool = True  # False: one FIFO pool
    sized: bool = False  # tiers sized by the seed's rules (`sized_tiers`), else as the seed gives


PRIORITY_BASELINES: dict[str, PriorityBaseline] = {
    "fifo-naive": PriorityBaseline(tiers=False, why=(
        "seed 000's FIFO, kept as its naive variant: one pool with the origin's slots, ten "
        "times as many pending, seed 002's 4 s timeout, one retry under a 15 % budget")),
    "static-tiers-naive": PriorityBaseline(why=(
        "seed 000's scheduler config as the seed gives it, written as fixed Envoy walls (the "
        "naive variant, kept as such): 70/25/5 % of the origin's slots, queue depths in "
        "requests (2000/8000/2000; seed 000 itself calls limits in counts \"the most common "
        "misconfiguration\"), route timeouts of queue + read timeout x attempts (the "
        "background's 11 s outlasts the client's 10 s)")),
    "static-tiers": PriorityBaseline(sized=True, why=(
        "static tiers sized by the seed's own rules, as a competent operator would: each "
        "pending limit is what its slots drain within the tier's `queue_timeout` at the "
        "origin's normal latency (seed 000: limits in time, not counts); each route timeout is "
        "when seed 000's classifier gives up on the tier (timeoutMs x (1 + retryBudget): "
        "2.4 / 3 / 3 s, well before the client's 10 s), so a request past it stops waiting "
        "and costs the origin nothing more; and the background pool gets the slots its normal "
        f"load needs at {TARGET_UTILIZATION:.0%} utilization (one slot, 5 %, failed 21 % of "
        "images while the origin was healthy); critical keeps seed 000's 70 %, normal the "
        "rest")),
}


def sized_tiers(concurrency: int, rps: float, healthy_p50_ms: float, healthy_mean_ms: float,
                shares: dict[str, float]) -> list[TierSize]:
    """`static-tiers`: critical keeps its share of `concurrency`; background gets the fewest
    slots that carry its normal demand (`rps` x its share of requests x the origin's mean
    service time) at `TARGET_UTILIZATION`, at least its share; normal the rest, which must
    carry its own normal demand the same way. Pending = slots x queue_timeout / the origin's
    normal p50. Route timeouts: `give_up_s`."""
    by_name = {t[0]: t for t in TIER_SET}

    def needed(tier: str) -> int:
        return math.ceil(rps * shares[tier] * healthy_mean_ms / 1000 / TARGET_UTILIZATION)

    slots = {"critical": concurrency * by_name["critical"][1] // 100,
             "background": max(concurrency * by_name["background"][1] // 100,
                               needed("background"))}
    slots["normal"] = concurrency - slots["critical"] - slots["background"]
    if slots["normal"] < needed("normal"):
        raise ValueError(f"{concurrency} slots cannot carry the tiers' normal load")
    out = []
    for name, _, _, queue_ms, read_ms, retries, prefix in TIER_SET:
        pending = int(slots[name] * queue_ms / healthy_p50_ms)
        out.append(TierSize(name, slots[name], pending, queue_ms, read_ms, retries, prefix,
                            give_up_s(name)))
    return out


def seed_tiers(concurrency: int) -> list[TierSize]:
    """`static-tiers-naive`: the seed's tier set as it stands."""
    return [TierSize(name, max(1, concurrency * share // 100), pending, queue_ms, read_ms,
                     retries, prefix, (queue_ms + read_ms * (retries + 1)) / 1000)
            for name, share, pending, queue_ms, read_ms, retries, prefix in TIER_SET]


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _envoy(pop: str, listener: int, admin: int, routes: list[dict[str, Any]],
           clusters: list[dict[str, Any]]) -> dict[str, Any]:
    hcm = {
        "@type": HCM_TYPE, "stat_prefix": "edge",
        "route_config": {"virtual_hosts": [{
            "name": "shop", "domains": ["*"],
            "request_headers_to_add": [{"header": {"key": POP_HEADER, "value": pop}}],
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


@dataclass(frozen=True)
class Locality:
    """One locality of a baseline's cluster: an origin's hosts at a priority, with a weight."""

    priority: int
    origin: str
    ports: tuple[int, ...]
    weight: int = 1


def failover_layout(baseline: FailoverBaseline, origins: dict[str, list[int]]
                    ) -> list[Locality]:
    """Primary at priority 0, standby at priority 1; warm: the standby's second port joins
    priority 0 at `WARM_PERCENT` beside the primary's 100 - `WARM_PERCENT`."""
    (primary, primary_ports), (standby, standby_ports) = origins.items()
    if not baseline.warm:
        return [Locality(0, primary, tuple(primary_ports[:baseline.hosts])),
                Locality(1, standby, tuple(standby_ports[:baseline.hosts]))]
    return [Locality(0, primary, tuple(primary_ports[:baseline.hosts]), 100 - WARM_PERCENT),
            Locality(0, standby, (standby_ports[baseline.hosts],), WARM_PERCENT),
            Locality(1, standby, tuple(standby_ports[:baseline.hosts]))]


def outlier_volume(baseline: FailoverBaseline, rps_per_pop: float) -> int:
    """Requests a host needs in one interval for failure-percentage and success-rate detection
    to judge it: half of what a primary host receives in an interval at the scenario's rate
    (Envoy's default, 100 per 10 s, assumes a rate this bench's compressed 1 s interval
    does not give)."""
    share = (100 - WARM_PERCENT) / 100 if baseline.warm else 1.0
    per_interval = rps_per_pop * share / baseline.hosts * compressed(OUTLIER_INTERVAL_S)
    return max(2, int(per_interval / 2))


def failover_bootstrap(variant: str, pop: str, listener: int, admin: int,
                       origins: dict[str, list[int]], concurrency: int, rps_per_pop: float,
                       hedge_delay_ms: int = 0) -> dict[str, Any]:
    """A failover baseline (`FAILOVER_BASELINES`): seed 002's binary active-passive plus what
    Envoy offers on top — a health check every 5 s (compressed) that takes a host out after 3
    failures; outlier detection on consecutive 5xx, failure percentage and success rate, its
    request volume set from the scenario's rate; up to 2 retries on 5xx / reset / connect
    failure that avoid the hosts and the priority already tried (previous_hosts,
    previous_priorities), under a 15 % retry budget; seed 002's 2 s connect and 4 s read
    timeouts. `hedge_delay_ms`: the checkout API's route hedges as Ballast's critical tier does
    (`hedged_route`)."""
    baseline = FAILOVER_BASELINES[variant]
    c = compressed
    endpoints = [
        {"priority": loc.priority, "locality": {"zone": loc.origin},
         "load_balancing_weight": loc.weight,
         "lb_endpoints": [{"endpoint": {"address": _address(port)}} for port in loc.ports]}
        for loc in failover_layout(baseline, origins)
    ]
    volume = outlier_volume(baseline, rps_per_pop)
    # the checks go the PoP's own way to the origin, as its requests do (a regional fault on
    # the path from one PoP fails that PoP's checks only)
    via_pop = [{"header": {"key": POP_HEADER, "value": pop}}]
    check: dict[str, Any] = {
        "timeout": envoy_duration(c(2)), "interval": envoy_duration(c(5)),
        "no_traffic_interval": envoy_duration(c(5)), "unhealthy_threshold": UNHEALTHY_THRESHOLD,
        "healthy_threshold": HEALTHY_THRESHOLD,
        "http_health_check": {"path": SHALLOW_PATH, "request_headers_to_add": via_pop}}
    if baseline.deep:
        check.update({"timeout": envoy_duration(c(PROBE_READ_TIMEOUT_S)),
                      "healthy_threshold": RETURN_AFTER_S // 5,
                      "http_health_check": {"path": DEEP_PATH,
                                            "request_headers_to_add": via_pop}})
    cluster: dict[str, Any] = {
        "name": "shop", "type": "STATIC", "connect_timeout": "2s",
        "circuit_breakers": _breakers(concurrency, concurrency),
        "load_assignment": {"cluster_name": "shop", "endpoints": endpoints,
                            "policy": {"overprovisioning_factor": OVERPROVISIONING}},
        "health_checks": [check],
        "outlier_detection": {
            "interval": envoy_duration(c(OUTLIER_INTERVAL_S)),
            "base_ejection_time": envoy_duration(c(30)),
            "max_ejection_time": envoy_duration(c(300)), "max_ejection_percent": 100,
            "consecutive_5xx": 5, "enforcing_consecutive_5xx": 100,
            "success_rate_minimum_hosts": 2, "success_rate_request_volume": volume,
            "enforcing_success_rate": 100,
            "failure_percentage_threshold": FAILURE_PERCENT, "enforcing_failure_percentage": 100,
            "failure_percentage_minimum_hosts": 1, "failure_percentage_request_volume": volume,
        },
    }
    clusters = [cluster]
    if baseline.warm:
        cluster["common_lb_config"] = {"locality_weighted_lb_config": {}}
        standby_port = list(origins.values())[1][0]
        clusters.append({
            "name": MIRROR_CLUSTER, "type": "STATIC", "connect_timeout": "2s",
            "circuit_breakers": _breakers(max(1, concurrency * WARM_PERCENT // 100),
                                          max(1, concurrency * WARM_PERCENT // 100)),
            "load_assignment": {"cluster_name": MIRROR_CLUSTER, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(standby_port)}}]}]}})
    retry = {
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
    }
    route = {"cluster": "shop", "timeout": envoy_duration(READ_TIMEOUT_S), "retry_policy": retry}
    routes: list[dict[str, Any]] = []
    if hedge_delay_ms:
        routes.append({"match": {"prefix": UNCACHEABLE},
                       "route": hedged_route(route, hedge_delay_ms)})
    elif baseline.warm:  # the uncacheable API is not mirrored
        routes.append({"match": {"prefix": UNCACHEABLE}, "route": route})
        route = {**route, "request_mirror_policies": [{
            "cluster": MIRROR_CLUSTER, "runtime_fraction": {"default_value": {
                "numerator": WARM_PERCENT, "denominator": "HUNDRED"}}}]}
    routes.append({"match": {"prefix": "/"}, "route": route})
    return _envoy(pop, listener, admin, routes, clusters)


def hedged_route(route: dict[str, Any], hedge_delay_ms: int) -> dict[str, Any]:
    """`route` hedging as Ballast translates a tier's `hedge_delay` (translate/routes.py):
    Envoy's `hedge_on_per_try_timeout` with the delay as `per_try_timeout`, the read timeout
    as `per_try_idle_timeout`; a hedge is one of the route's retries, so it goes where a retry
    goes (another host, the other priority) under the same budget."""
    retry = {**route["retry_policy"], "per_try_timeout": envoy_duration(hedge_delay_ms / 1000),
             "per_try_idle_timeout": envoy_duration(READ_TIMEOUT_S)}
    return {**route, "retry_policy": retry,
            "hedge_policy": {"hedge_on_per_try_timeout": True}}


def _tier_route(tier: TierSize) -> dict[str, Any]:
    """As Ballast translates a tier: per-try timeout = read timeout."""
    policy: dict[str, Any] = {"retry_on": "5xx,reset,connect-failure", "num_retries": tier.retries,
                              "retry_back_off": BACK_OFF,
                              "per_try_timeout": envoy_duration(tier.read_ms / 1000)}
    return {"match": {"prefix": tier.prefix}, "route": {
        "cluster": f"shop.{tier.name}", "timeout": envoy_duration(tier.timeout_s),
        "retry_policy": policy}}


def priority_tiers(variant: str, concurrency: int, rps: float, healthy_p50_ms: float,
                   healthy_mean_ms: float, shares: dict[str, float]) -> list[TierSize]:
    if PRIORITY_BASELINES[variant].sized:
        return sized_tiers(concurrency, rps, healthy_p50_ms, healthy_mean_ms, shares)
    return seed_tiers(concurrency)


def priority_bootstrap(variant: str, pop: str, listener: int, admin: int, origin: int,
                       concurrency: int, tiers: list[TierSize]) -> dict[str, Any]:
    """Seed 000's baselines in front of one origin capped at `concurrency`
    (`PRIORITY_BASELINES`): one FIFO cluster, or one cluster per tier (`tiers`) with its
    slots as fixed walls, its pending limit, retries under a 15 % budget."""

    def cluster(name: str, limit: int, pending: int) -> dict[str, Any]:
        return {"name": name, "type": "STATIC", "connect_timeout": "0.3s",
                "circuit_breakers": _breakers(limit, pending),
                "load_assignment": {"cluster_name": name, "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": _address(origin)}}]}]}}

    if not PRIORITY_BASELINES[variant].tiers:
        route = {"match": {"prefix": "/"}, "route": {"cluster": "shop", "timeout": "4s",
                 "retry_policy": {"retry_on": "5xx,reset,connect-failure", "num_retries": 1,
                                  "retry_back_off": BACK_OFF}}}
        return _envoy(pop, listener, admin, [route],
                      [cluster("shop", concurrency, concurrency * 10)])
    routes = [_tier_route(t) for t in tiers]
    clusters = [cluster(f"shop.{t.name}", t.slots, t.pending) for t in tiers]
    routes.append(routes.pop(0))  # the catch-all `/` (critical, fail safe) last
    return _envoy(pop, listener, admin, routes, clusters)


def envoy_shares(layout: list[Locality], healthy: dict[int, bool]) -> dict[str, int]:
    """The share of requests each origin gets, as Envoy computes it from host health: each
    priority's health is its healthy hosts' fraction x the overprovisioning factor (at most
    100 %); priority 0 takes its health's worth, the next the rest up to its own, and so on
    (normalized when all together fall short); within a priority, each locality its weight x
    its own health. With no healthy host anywhere Envoy panics and uses priority 0 anyway."""
    factor = OVERPROVISIONING / 100

    def health(ports: tuple[int, ...]) -> float:
        return min(1.0, factor * sum(healthy.get(p, False) for p in ports) / len(ports))

    priorities = sorted({loc.priority for loc in layout})
    of = {p: [loc for loc in layout if loc.priority == p] for p in priorities}
    level = {p: 100 * health(tuple(port for loc in of[p] for port in loc.ports))
             for p in priorities}
    total = sum(level.values())
    load: dict[int, float] = {}
    if total >= 100:
        left = 100.0
        for p in priorities:
            load[p] = min(left, level[p])
            left -= load[p]
    elif total > 0:
        load = {p: 100 * level[p] / total for p in priorities}
    else:
        load = {priorities[0]: 100.0}
    out: dict[str, float] = {loc.origin: 0.0 for loc in layout}
    for p, share in load.items():
        weights = [loc.weight * health(loc.ports) for loc in of[p]]
        if not sum(weights):
            weights = [float(loc.weight) for loc in of[p]]
        for loc, w in zip(of[p], weights, strict=True):
            out[loc.origin] += share * w / sum(weights)
    return {name: round(v) for name, v in out.items()}


# Envoy's counters that show a baseline's (or Ballast's Envoys') mechanisms acting, per cluster
EVIDENCE_STATS = (
    "outlier_detection.ejections_enforced_total",
    "outlier_detection.ejections_enforced_consecutive_5xx",
    "outlier_detection.ejections_enforced_failure_percentage",
    "outlier_detection.ejections_enforced_success_rate",
    "outlier_detection.ejections_detected_failure_percentage",
    "outlier_detection.ejections_detected_success_rate",
    "outlier_detection.ejections_overflow",
    "health_check.attempt", "health_check.failure",
    "upstream_rq_total", "upstream_rq_retry", "upstream_rq_retry_success",
    "upstream_rq_retry_overflow", "upstream_rq_pending_overflow", "upstream_rq_timeout",
    "upstream_rq_per_try_timeout", "upstream_cx_overflow",
)


def evidence_stats(envoy: EnvoyProcess) -> dict[str, int]:
    """`EVIDENCE_STATS` of every cluster but the xDS one, by full name; zeros left out."""
    out = {}
    for stat in envoy.admin_json("/stats?format=json")["stats"]:
        name, value = stat.get("name", ""), stat.get("value")
        if (not name.startswith("cluster.") or ".zone." in name or ".endpoint." in name
                or not isinstance(value, int) or not value or name.startswith("cluster.xds")):
            continue
        if any(name.endswith("." + suffix) for suffix in EVIDENCE_STATS):
            out[name] = value
    return dict(sorted(out.items()))


class StaticEdge:
    """One Envoy per PoP from a static config; `observe` reads what its health checks and
    outlier detection make of the priorities (Envoy's own spill arithmetic)."""

    def __init__(self, workdir: Path, pops: list[str], layout: list[Locality],
                 bootstrap: Callable[[str, int, int], dict[str, Any]]) -> None:
        self.layout = layout
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
        first = self.layout[0].origin
        _until(lambda: all(self.observe(pop)[0].get(first) for pop in self.envoys), timeout,
               "the baseline's health checks passing the primary")

    def observe(self, pop: str) -> tuple[dict[str, int], list[str]]:
        """The share each origin gets (`envoy_shares`) and the hosts out, as
        `origin:p<priority>h<host>:hc` (failed its active health check) or `...:od` (ejected
        by outlier detection)."""
        healthy: dict[int, bool] = {}
        out: list[str] = []
        where = {port: f"{loc.origin}:p{loc.priority}h{i}" for loc in self.layout
                 for i, port in enumerate(loc.ports)}
        for cluster in self.envoys[pop].admin_json("/clusters?format=json").get(
                "cluster_statuses", []):
            if cluster.get("name") == MIRROR_CLUSTER:
                continue
            for host in cluster.get("host_statuses", []):
                flags = host.get("health_status", {})
                port = int(host["address"]["socket_address"]["port_value"])
                hc, od = (bool(flags.get("failed_active_health_check")),
                          bool(flags.get("failed_outlier_check")))
                healthy[port] = not (hc or od)
                out += [f"{where.get(port, port)}:{why}"
                        for why, bad in (("hc", hc), ("od", od)) if bad]
        return envoy_shares(self.layout, healthy), sorted(out)

    def stats(self, pop: str) -> dict[str, int]:
        return evidence_stats(self.envoys[pop])

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
