"""One edge Envoy 1.40 of PoP `ewr` running Ballast's translation of group `shop` (primary,
standby) at fixed weights, streaming its stats (metrics_service and OTLP host stats) and every
request's access-log entry to Ballast's own sinks, in front of two origins that record each
attempt they serve (attempt number from `x-envoy-attempt-count`, tier, status, and their own
service time), each in its own process. For the per-origin attribution, retry and pool-wait
tests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import AccessLog, Desired, Origin
from control_plane.observe.access_log import AccessLogStore, add_access_log_service
from control_plane.observe.sink import SinkStore, add_metrics_service
from control_plane.observe.source import wall_ms
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port, stop_group
from harness.eventually import eventually
from harness.models import example_desired, shop_group

REPO = Path(__file__).resolve().parents[2]
# A request's path and headers per tier, as the example classification sorts them.
TIER_REQUESTS: dict[str, tuple[str, dict[str, str]]] = {
    "critical": ("/api/checkout", {}),
    "normal": ("/item", {"x-purpose": "prefetch"}),
    "background": ("/_next/image", {}),
}


@dataclass(frozen=True)
class Attempt:
    """One attempt as the origin saw it."""

    origin: str
    tier: str
    number: int  # x-envoy-attempt-count: 1 the first attempt, 2+ a retry or hedge
    status: int
    served_ms: float  # the origin's own time: request handed to it -> answer ready


@dataclass
class AttemptOrigin:
    """An origin in its own process (`python -m tests.support.attempt_origin`), so that its own
    measurements are not delayed by the test's event loop (Ballast's sinks, the clients): it
    answers 503 to a share `fail_rate` of its requests (exactly every 1/rate-th) after
    `fail_ms`, the others 200 after the next of `answer_ms` (cycled), and writes each attempt
    to a JSON-lines file."""

    name: str
    fail_rate: float = 0.0
    fail_ms: float = 0.0
    answer_ms: Sequence[float] = (1.0,)
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

    async def start(self, folder: Path) -> AttemptOrigin:
        self.port = free_port()
        self._log = folder / f"{self.name}.jsonl"
        config = {"name": self.name, "port": self.port, "fail_rate": self.fail_rate,
                  "fail_ms": self.fail_ms, "answer_ms": list(self.answer_ms),
                  "log": str(self._log)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.attempt_origin", json.dumps(config)],
            cwd=REPO, start_new_session=True)
        await eventually(self._listening, 20, f"origin {self.name} listening")
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def attempts(self) -> list[Attempt]:
        if self._log is None or not self._log.exists():
            return []
        lines = self._log.read_text().splitlines()
        return [Attempt(**json.loads(line)) for line in lines if line.endswith("}")]

    def stop(self) -> None:
        if self._proc is not None:
            stop_group(self._proc, 5)


@dataclass
class AttemptFleet:
    desired: Desired
    listen_port: int
    envoy: EnvoyProcess
    primary: AttemptOrigin
    standby: AttemptOrigin
    sink: SinkStore
    access_logs: AccessLogStore

    @property
    def attempts(self) -> list[Attempt]:
        """Every attempt either origin has written down so far."""
        return self.primary.attempts() + self.standby.attempts()

    async def send(self, tier: str, requests: int, concurrency: int = 1) -> list[int]:
        """`requests` GETs classified into `tier`, at most `concurrency` at a time: statuses."""
        path, headers = TIER_REQUESTS[tier]
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(i: int) -> int:
                async with gate, session.get(f"http://127.0.0.1:{self.listen_port}{path}/{i}",
                                             headers=headers) as response:
                    await response.read()
                    return response.status

            return list(await asyncio.gather(*(one(i) for i in range(requests))))


def fleet_desired(primary: int, standby: int) -> Desired:
    group = shop_group(Origin("primary", "127.0.0.1", primary),
                       Origin("standby", "127.0.0.1", standby))
    group = replace(group, preference={"ewr": ("primary", "standby"),
                                       "sjc": ("primary", "standby")})
    desired = replace(example_desired(group), access_log=AccessLog(sample_rate=1.0))
    listener = replace(desired.listeners[0], port=free_port())
    return replace(desired, listeners=(listener,))


def fleet_bootstrap(desired: Desired, weights: dict[str, int], admin_port: int,
                    sink_port: int) -> dict[str, Any]:
    """Ballast's bootstrap with both stats sinks and access logs (`--metrics-sink`), flushing
    every second, with the PoP's translation inlined statically."""
    bootstrap = ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=sink_port,
                              admin_port=admin_port, stats_flush_interval_ms=1000,
                              metrics_sink=True)
    del bootstrap["dynamic_resources"]
    del bootstrap["layered_runtime"]  # its RTDS layer needs the ADS config
    static = static_bootstrap(translate_pop(desired, "ewr", Capabilities(access_log=True),
                                            PopIntent(weights={"shop": weights})))
    bootstrap["static_resources"]["clusters"].extend(static["static_resources"]["clusters"])
    bootstrap["static_resources"]["listeners"] = static["static_resources"]["listeners"]
    return bootstrap


@asynccontextmanager
async def attempt_fleet(weights: dict[str, int], primary: AttemptOrigin,
                        standby: AttemptOrigin) -> AsyncIterator[AttemptFleet]:
    """Envoy (ready) at `weights` in front of both origins (started here, stopped on exit)."""
    find_envoy()
    folder = Path(tempfile.mkdtemp(prefix="ballast-attempts-"))
    await primary.start(folder)
    await standby.start(folder)
    desired = fleet_desired(primary.port, standby.port)
    sink, access_logs = SinkStore(desired=desired), AccessLogStore(desired=desired)
    server = grpc.aio.server()
    add_metrics_service(server, sink)
    add_access_log_service(server, access_logs)
    sink_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    admin_port = free_port()
    envoy = EnvoyProcess(fleet_bootstrap(desired, weights, admin_port, sink_port), admin_port)
    try:
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready)
        # the first host-stats export is every counter's baseline: traffic starts after it
        await eventually(lambda: bool(sink.host_windows(0, wall_ms())), 20, "a host-stats export")
        yield AttemptFleet(desired, desired.listeners[0].port, envoy, primary, standby, sink,
                           access_logs)
    finally:
        envoy.stop()
        await server.stop(None)
        primary.stop()
        standby.stop()
        shutil.rmtree(folder, ignore_errors=True)
