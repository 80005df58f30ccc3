"""The tiers source's scenario, time compressed: an origin with a hard concurrency cap whose latency
rises from 110 ms to 480 ms and back, under a mixed load (many background image requests in closed
loops, a steady open-loop stream of checkout requests), through a real Envoy 1.40 fed by an
in-process Ballast. Three set-ups:

- `fifo`: one tier for everything (a single FIFO cluster with the origin's whole concurrency);
- `static`: Ballast's tiers 70/25/5 % with the tier controller off (walls, no lending);
- `controller`: the same tiers with the tier controller on (measured wait trigger, shedding,
  lending), reconciling every second.

Used by `tests/test_tier_scenario.py` (short phases, direction only); the measurement is the
incident bench's `priority` scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.background_loop import BackgroundLoop
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port

CAP = 20  # the origin's hard concurrency cap = max_origin_concurrency
FAST, SLOW = 110, 480  # origin latency, ms (the tiers source)
TIERS = """\
tiers:
  critical: {priority: 0, share: 70, max_queue_depth: 2000, queue_timeout: 3s,
             connect_timeout: 300ms, read_timeout: 2s, retries: 0}
  normal: {priority: 1, share: 25, max_queue_depth: 2000, queue_timeout: 3s,
           connect_timeout: 300ms, read_timeout: 2s, retries: 0}
  background: {priority: 2, share: 5, max_queue_depth: 2000, queue_timeout: 3s,
               connect_timeout: 300ms, read_timeout: 2s, retries: 0, sheddable: true}
"""
ONE_TIER = """\
tiers:
  critical: {priority: 0, share: 100, max_queue_depth: 4000, queue_timeout: 3s,
             connect_timeout: 300ms, read_timeout: 2s, retries: 0}
"""
DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1}}
{tiers}
failover: {{interval: 1s, window: 3s, stale_after: 10s}}
tier_actions:
  enabled: {enabled}
  trigger: wait
  trigger_wait: 35ms
  for: 1s
  recover_after: {recover}
access_log: {{sample_rate: 1.0}}
origin_groups:
  shop:
    max_origin_concurrency: {cap}
    origins:
      primary: {{address: 127.0.0.1, port: {origin}}}
    health_check: {{interval: 1s, connect_timeout: 500ms, read_timeout: 1s}}
classification:
  default_tier: critical
  rules:
{rules}
listeners:
  - name: edge
    port: {listener}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""
RULES = """\
    - {name: checkout, path_prefix: /api/checkout, tier: critical}
    - {name: image, path_prefix: /_next/image, tier: background}"""


@dataclass(frozen=True)
class Phases:
    """Seconds of each phase: origin fast, slow (the degradation), fast again."""

    before: float = 5.0
    slow: float = 30.0
    after: float = 15.0
    settle: float = 5.0  # of the slow phase, not measured (the controller's reaction time)
    checkout_rps: float = 34.0  # x 480 ms = 16.3 at once: more than critical's 14
    background_clients: int = 40


@dataclass
class RunResult:
    setup: str
    checkout_ms: list[float] = field(default_factory=list)  # slow phase, after `settle`
    checkout_sent: int = 0  # sent in that span (the offered load the harness achieved)
    checkout_failed: int = 0
    background_ok: int = 0  # background 200s in the slow phase
    background_shed: int = 0  # background answered at the edge in the slow phase
    waits_ms: list[float] = field(default_factory=list)  # measured critical wait, same span
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def checkout_p95(self) -> float:
        return quantile(self.checkout_ms, 0.95)

    def summary(self, origin_ms: float) -> dict[str, Any]:
        extra = [ms - origin_ms for ms in self.checkout_ms]
        return {
            "setup": self.setup,
            "checkout_p50_ms": round(quantile(self.checkout_ms, 0.5), 1),
            "checkout_p95_ms": round(self.checkout_p95, 1),
            "checkout_requests": len(self.checkout_ms),
            "checkout_sent": self.checkout_sent,
            "checkout_failed": self.checkout_failed,
            "background_ok": self.background_ok,
            "background_shed": self.background_shed,
            "client_extra_mean_ms": round(statistics.mean(extra), 1) if extra else None,
            "measured_wait_mean_ms": round(statistics.mean(self.waits_ms), 1)
            if self.waits_ms else None,
            "measured_wait_p95_ms": round(quantile(self.waits_ms, 0.95), 1)
            if self.waits_ms else None,
            "decisions": [(r["kind"], r.get("detail", {}).get("change")) for r in self.records],
        }


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, int(q * len(ordered) + 0.999999) - 1)]


def desired_text(setup: str, origin: int, listener: int, recover: str) -> str:
    return DESIRED.format(
        tiers=ONE_TIER if setup == "fifo" else TIERS,
        enabled="true" if setup == "controller" else "false",
        recover=recover, cap=CAP, origin=origin, listener=listener,
        rules="    []" if setup == "fifo" else RULES,
    ).replace("  rules:\n    []", "  rules: []")


async def run(setup: str, phases: Phases, tmp: Path) -> RunResult:
    """One set-up through the three phases; the numbers of its slow phase."""
    origin = await DemoOrigin("primary", free_port(), max_concurrency=CAP).start()
    origin.set_fault(Fault(latency_ms=FAST))
    listener, xds, admin = free_port(), free_port(), free_port()
    desired = tmp / f"{setup}.yaml"
    recover = f"{max(2000, round(phases.after * 1000 / 3))}ms"
    desired.write_text(desired_text(setup, origin.port, listener, recover))
    envoy = EnvoyProcess(ads_bootstrap(
        node_id="ewr-1", pop="ewr", xds_port=xds, admin_port=admin, metrics_sink=True,
        needed_stats_only=True, stats_flush_interval_ms=1000), admin).start()
    state = tmp / f"{setup}-state"
    # Ballast on its own loop and thread: its fsyncs and pushes never delay the origin or the
    # clients (which share this loop), so the clients measure Envoy and the origin only
    ballast = BackgroundLoop()
    service = ballast.call(lambda: BallastService(ServiceConfig(
        desired_path=desired, state_dir=state, xds_address=f"127.0.0.1:{xds}",
        admin_address=None, probes=False, reload_poll_s=1.0)))
    result = RunResult(setup)
    stop = asyncio.Event()
    base = f"http://127.0.0.1:{listener}"
    marks: dict[str, float] = {}
    try:
        await asyncio.to_thread(ballast.run, service.start(), 30)
        await asyncio.to_thread(envoy.wait_ready, 20)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=10),
        ) as session:
            tasks = [asyncio.create_task(_background(session, base, stop, result, marks))
                     for _ in range(phases.background_clients)]
            tasks.append(asyncio.create_task(
                _checkout(session, base, phases.checkout_rps, stop, result, marks)))
            await asyncio.sleep(phases.before)
            origin.set_fault(Fault(latency_ms=SLOW))
            marks["slow"] = time.monotonic()
            await asyncio.sleep(phases.settle)
            marks["measure"] = time.monotonic()
            wall_start = time.time_ns() // 1_000_000
            await asyncio.sleep(phases.slow - phases.settle)
            marks["fast"] = time.monotonic()
            wall_end = time.time_ns() // 1_000_000
            origin.set_fault(Fault(latency_ms=FAST))
            await asyncio.sleep(phases.after)
            stop.set()
            await asyncio.gather(*tasks)
        found = service.access_logs.samples(wall_end, wall_end - wall_start)
        result.waits_ms = [s.wait_ms for s in found.get(("ewr", "shop.critical"), [])]
    finally:
        envoy.stop()
        if service.ready:
            await asyncio.to_thread(ballast.run, service.stop(0.5), 30)
        ballast.close()
        await origin.stop()
    result.records = [r for r in iter_records(state)
                      if r["kind"] in ("tier_action", "tier_shed", "tier_lend")]
    return result


def _measured(marks: dict[str, float], sent: float) -> bool:
    return "measure" in marks and sent >= marks["measure"] and (
        "fast" not in marks or sent < marks["fast"])


def _slow(marks: dict[str, float], sent: float) -> bool:
    return "slow" in marks and sent >= marks["slow"] and (
        "fast" not in marks or sent < marks["fast"])


async def _checkout(session: aiohttp.ClientSession, base: str, rps: float,
                    stop: asyncio.Event, result: RunResult, marks: dict[str, float]) -> None:
    """Open loop: a checkout request every 1/rps s, whatever the answers take."""
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        sent = time.monotonic()
        result.checkout_sent += _measured(marks, sent)
        try:
            async with session.get(f"{base}/api/checkout/cart") as response:
                await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if _measured(marks, sent):
            if ok:
                result.checkout_ms.append((time.monotonic() - sent) * 1000)
            else:
                result.checkout_failed += 1

    started, sent = time.monotonic(), 0
    while not stop.is_set():
        # on an absolute schedule: a late loop catches up, so every set-up offers the same load
        delay = started + sent / rps - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            continue
        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
    await asyncio.gather(*pending)


async def _background(session: aiohttp.ClientSession, base: str, stop: asyncio.Event,
                      result: RunResult, marks: dict[str, float]) -> None:
    """Closed loop: image requests one after another; a shed answer waits its retry-after
    (capped at 1 s, time compressed) like a polite client."""
    while not stop.is_set():
        sent = time.monotonic()
        shed = False
        try:
            async with session.get(f"{base}/_next/image?url=/a.png") as response:
                await response.read()
                shed = "x-ballast-shed" in response.headers
                if _slow(marks, sent):
                    result.background_ok += response.status == 200
                    result.background_shed += shed
        except (aiohttp.ClientError, TimeoutError):
            pass
        if shed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
