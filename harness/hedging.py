"""A hedging scenario through a real Envoy 1.40: a critical origin that stalls on some first
attempts, a fast standby, and clients measuring latency. Used by the hedging test (direction
only) and by `bench/hedging.py` (the numbers in docs/benchmarks.md).

The primary stalls every `stall_every`-th first attempt (`x-envoy-attempt-count: 1`) for
`stall_ms`; hedges and the standby answer after `answer_ms`. Both origins count the attempts
they see by attempt number, and the most retry attempts (attempt number 2 or more) ever in
progress at once across both: from its arrival to its answer, or to Envoy's reset of it (Envoy
took another attempt's answer), which is when Envoy's retry budget counts it no longer.
"""

from __future__ import annotations

import dataclasses
import http.client
import itertools
import select
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import Desired, Origin
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.loopback_http import LoopbackHttp
from harness.models import example_desired, shop_group


@dataclass
class Attempts:
    by_number: Counter[int] = field(default_factory=Counter)
    by_origin: Counter[str] = field(default_factory=Counter)
    retries_in_flight: int = 0
    max_retries_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, origin: str, number: int) -> None:
        with self.lock:
            self.by_number[number] += 1
            self.by_origin[origin] += 1
            if number > 1:
                self.retries_in_flight += 1
                self.max_retries_in_flight = max(self.max_retries_in_flight,
                                                 self.retries_in_flight)

    def end(self, number: int) -> None:
        if number > 1:
            with self.lock:
                self.retries_in_flight -= 1


def _closed_within(connection: socket.socket, ms: int) -> bool:
    """Wait `ms` for the answer, or until Envoy resets the attempt (it took another attempt's
    answer: an HTTP/1.1 reset closes the connection). An attempt Envoy gave up counts no
    longer in flight: Envoy's retry budget is freed at the reset, not when the answer would
    have been ready."""
    deadline = time.monotonic() + ms / 1000
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([connection], [], [], left)
        if not readable:
            return False
        try:
            if connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        except OSError:
            return True
        time.sleep(max(0.0, deadline - time.monotonic()))  # data, not a close: wait it out
    return False


class StallingOrigin(LoopbackHttp):
    def __init__(self, name: str, attempts: Attempts, *, stall_every: int, stall_ms: int,
                 answer_ms: int) -> None:
        self.name = name
        firsts = itertools.count()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                number = int(self.headers.get("x-envoy-attempt-count") or 1)
                attempts.begin(name, number)
                try:
                    stall = number == 1 and stall_every and next(firsts) % stall_every == 0
                    abandoned = _closed_within(self.connection, stall_ms if stall else answer_ms)
                finally:
                    attempts.end(number)  # as Envoy sees it: answered, or reset
                if abandoned:
                    return
                try:
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    return  # Envoy took another attempt's answer and reset this one

            def log_message(self, *args: object) -> None:
                return

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # a burst of Envoy connections must not hit the backlog

            def handle_error(self, request: object, client_address: object) -> None:
                return  # Envoy resets the attempt it abandons: expected, not worth a traceback

        super().__init__(Handler, Server)


@dataclass(frozen=True)
class HedgeRun:
    hedge_delay_ms: int
    latencies_ms: list[float]
    statuses: Counter[int]
    stats: dict[str, int]
    attempts: Attempts
    # origin -> its host's counters in the critical tier (rq_total, rq_success, rq_error)
    hosts: dict[str, dict[str, int]] = field(default_factory=dict)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def hedging_desired(primary: int, standby: int, hedge_delay_ms: int) -> Desired:
    group = shop_group(Origin("primary", "127.0.0.1", primary),
                       Origin("standby", "127.0.0.1", standby))
    tiers = tuple(dataclasses.replace(t, hedge_delay_ms=hedge_delay_ms)
                  if t.name == "critical" else t for t in group.tiers)
    group = dataclasses.replace(group, tiers=tiers,
                                preference={"ewr": ("primary", "standby"),
                                            "sjc": ("primary", "standby")})
    desired = example_desired(group)
    listener = dataclasses.replace(desired.listeners[0], port=free_port())
    return dataclasses.replace(desired, listeners=(listener,))


STATS = ("upstream_rq_total", "upstream_rq_retry", "upstream_rq_retry_overflow",
         "upstream_rq_retry_success", "upstream_rq_retry_limit_exceeded", "upstream_cx_total",
         "upstream_cx_destroy_local_with_active_rq")


def run_hedging(hedge_delay_ms: int, *, requests: int, concurrency: int, stall_every: int,
                stall_ms: int, answer_ms: int = 2) -> HedgeRun:
    """`requests` critical GETs by `concurrency` clients through a fresh Envoy (95/5)."""
    find_envoy()
    attempts = Attempts()
    origins = [StallingOrigin(name, attempts, stall_every=every, stall_ms=stall_ms,
                              answer_ms=answer_ms)
               for name, every in (("primary", stall_every), ("standby", 0))]
    try:
        desired = hedging_desired(origins[0].port, origins[1].port, hedge_delay_ms)
        weights = {"shop": {"primary": 95, "standby": 5}}
        bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(),
                                                   PopIntent(weights=weights)))
        admin_port = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
        port = desired.listeners[0].port
        with EnvoyProcess(bootstrap, admin_port) as envoy:
            envoy.wait_ready()
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda _: _get(port), range(requests)))
            stats = _stats(envoy)
            hosts = {origin.name: _host_stats(envoy, origin.port) for origin in origins}
    finally:
        for origin in origins:
            origin.close()
    return HedgeRun(hedge_delay_ms, [ms for ms, _ in results],
                    Counter(status for _, status in results), stats, attempts, hosts)


def _get(port: int) -> tuple[float, int]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/home")
        response = connection.getresponse()
        response.read()
        status = response.status
    finally:
        connection.close()
    return (time.perf_counter() - started) * 1000, status


def _host_stats(envoy: EnvoyProcess, port: int) -> dict[str, int]:
    """One origin's per-host counters in the critical tier (`per_endpoint_stats`)."""
    prefix = f"cluster.shop.critical.endpoint.127.0.0.1_{port}."
    found: Any = envoy.admin_json(f"/stats?format=json&filter=^{prefix.replace('.', '[.]')}")
    return {item["name"].removeprefix(prefix): int(item["value"]) for item in found["stats"]
            if "value" in item}


def _stats(envoy: EnvoyProcess) -> dict[str, int]:
    found: Any = envoy.admin_json("/stats?format=json&filter=^cluster[.]shop[.]critical[.]")
    values = {item["name"].removeprefix("cluster.shop.critical."): int(item["value"])
              for item in found["stats"] if "value" in item}
    return {name: values.get(name, 0) for name in STATS}
