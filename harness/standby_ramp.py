"""The cold-standby ramp against the failover source's incident, through a real Envoy 1.40.

A primary origin starts failing (half its answers 503); the standby sits behind a cold cache
(`ColdCache`: the first fetch of each object is slow, repeats are fast, a capacity cap refuses
what it cannot take). The same run twice, in compressed time (2 s intervals and windows):

- **ramp on** (the default): the standby's share grows 5 -> 10 -> 20 -> 40 % while it stays
  healthy, backs off when it breaches, and the cache-warming mirror primes it meanwhile;
- **ramp off** (`standby_ramp.enabled: false`): the controller alone moves up to 15 points a
  tick towards the standby.

Reported per run, from the standby's own answers to real (not mirrored) requests during the
shift: error rate over the whole shift (503 over capacity) and p95 latency against the failover
thresholds (2 %, 800 ms), the peak error rate of any 2 s window (the compressed failover
window), whether and when the shift completed (the standby at >= 90 %), and what clients saw.
`python -m bench.standby_ramp` prints both side by side; `tests/test_standby_ramp_e2e.py`
asserts the direction only. The scenario lives in the harness because both use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import CacheAnswer, ColdCache, DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.fleet import write_fast_desired

ERROR_THRESHOLD = 0.02  # the failover source: 2 % 5xx
P95_THRESHOLD_MS = 800.0  # the failover source
DONE_SHARE = 90  # the shift is complete when the standby carries this much


@dataclass(frozen=True)
class Scenario:
    rps: float = 100.0  # client requests a second, open loop
    # distinct cacheable objects, picked uniformly: cold, the standby sustains ~20 rps of misses
    # (capacity / miss latency), warm it takes everything
    objects: int = 300
    miss_latency_ms: int = 400  # the standby's first fetch of an object
    capacity: int = 8  # requests the standby can have in flight; more are refused
    primary_error_rate: float = 0.5
    warmup_s: float = 2.0  # before the primary fails
    # one reconcile tick per interval, over a window as long: a ramp stage's load is what the
    # next tick judges (the failover source: 20 s and 30 s; compressed)
    interval_s: int = 2
    max_shift_s: float = 60.0  # give up after this long
    seed: int = 1


@dataclass(frozen=True)
class RunResult:
    ramp: bool
    standby_requests: int  # real (not mirrored) requests the standby answered during the shift
    standby_error_rate: float
    standby_p95_ms: float
    worst_window_error_rate: float  # highest 5xx share of any 2 s window
    mirrored: int  # mirrored copies the standby got
    shift_completed: bool
    shift_seconds: float | None  # primary fault -> standby at DONE_SHARE
    client_requests: int
    client_errors: int  # non-2xx or failed, as clients saw them
    ramp_records: dict[str, int]

    @property
    def within_thresholds(self) -> bool:
        return (self.standby_error_rate <= ERROR_THRESHOLD
                and self.standby_p95_ms <= P95_THRESHOLD_MS)


def _desired_text(text: str, ramp: bool, interval_s: int) -> str:
    """The fleet's desired state at this scenario's interval and window. Every request is
    access-logged: a window's latency evidence is the attempts logged in it (decide/evidence.py),
    and at the default 10 % a standby at 5-10 % of 100 requests/s logs 1-2 attempts in a 2 s
    window, leaving only the 4 probes (1 s rounds, two paths), under `min_samples` 5: every
    window of the ramping standby would be inconclusive. All logged, it holds 10-20."""
    text = text.replace("  interval: 1s\n", f"  interval: {interval_s}s\n").replace(
        "  window: 3s\n", f"  window: {interval_s}s\n")
    return (text + "access_log: {sample_rate: 1.0}\n"
            + f"standby_ramp:\n  enabled: {'true' if ramp else 'false'}\n")


async def _traffic(port: int, scenario: Scenario, stop: asyncio.Event,
                   statuses: Counter[int]) -> None:
    rng = random.Random(scenario.seed)
    limit = asyncio.Semaphore(400)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async def one(path: str) -> None:
            async with limit:
                try:
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        await response.read()
                        statuses[response.status] += 1
                except (aiohttp.ClientError, TimeoutError):
                    statuses[0] += 1

        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        sent = 0
        while not stop.is_set():
            due = started + sent / scenario.rps
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            task = asyncio.create_task(one(f"/obj/{rng.randrange(scenario.objects)}"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        for task in list(tasks):
            with contextlib.suppress(Exception):
                await task


def _window_peak(answers: list[CacheAnswer], width_s: float = 2.0) -> float:
    if not answers:
        return 0.0
    start = answers[0].at
    buckets: dict[int, list[int]] = {}
    for answer in answers:
        buckets.setdefault(int((answer.at - start) / width_s), []).append(answer.status)
    return max(sum(s >= 500 for s in b) / len(b) for b in buckets.values() if len(b) >= 10) \
        if any(len(b) >= 10 for b in buckets.values()) else 0.0


async def run(ramp: bool, scenario: Scenario = Scenario(), state_dir: Path | None = None
              ) -> RunResult:
    """One run; `state_dir` (default: a temporary one) holds the decision log."""
    with tempfile.TemporaryDirectory(prefix="ballast-ramp-") as tmp:
        return await _run(ramp, scenario, state_dir or Path(tmp))


async def _run(ramp: bool, scenario: Scenario, base: Path) -> RunResult:
    origins = {
        "primary": await DemoOrigin("primary", free_port()).start(),
        "secondary": await DemoOrigin(
            "secondary", free_port(),
            cache=ColdCache(scenario.miss_latency_ms, scenario.capacity)).start(),
    }
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(base / "desired.yaml", origins, listener, sjc_listener)
    desired.write_text(_desired_text(desired.read_text(), ramp, scenario.interval_s))
    xds_port, admin = free_port(), free_port()
    state = base / "state"
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state, xds_address=f"127.0.0.1:{xds_port}",
        admin_address=None, probe_interval_ms=1000, reload_poll_s=0.5, seed=scenario.seed,
    ))
    envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=xds_port,
                                       admin_port=admin, metrics_sink=True,
                                       needed_stats_only=True, stats_flush_interval_ms=1000),
                         admin)
    stop = asyncio.Event()
    statuses: Counter[int] = Counter()
    traffic: asyncio.Task[None] | None = None
    try:
        await service.start()
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready, 20)
        traffic = asyncio.create_task(_traffic(listener, scenario, stop, statuses))
        await asyncio.sleep(scenario.warmup_s)
        standby = origins["secondary"]
        seen_before = len(standby.answers)
        client_before = sum(statuses.values()), sum(n for s, n in statuses.items() if s != 200)
        origins["primary"].set_fault(Fault(error_rate=scenario.primary_error_rate))
        failed_at = time.monotonic()
        done_at: float | None = None
        with contextlib.suppress(AssertionError):  # not within the time: reported as such
            done_at = await eventually(
                lambda: service.server.intent.weights("ewr", "shop")["secondary"] >= DONE_SHARE
                and time.monotonic(), scenario.max_shift_s, "the shift done", interval=0.1)
        answers = [a for a in standby.answers[seen_before:] if not a.shadow]
        shift = [a for a in answers if done_at is None or a.at <= done_at]
        latencies = sorted(a.ms for a in shift if a.status == 200) or [0.0]
        kinds = Counter(r["kind"] for r in iter_records(state)
                        if str(r["kind"]).startswith("ramp_") and r.get("pop") == "ewr")
        client_total = sum(statuses.values()) - client_before[0]
        client_errors = sum(n for s, n in statuses.items() if s != 200) - client_before[1]
        return RunResult(
            ramp=ramp,
            standby_requests=len(shift),
            standby_error_rate=sum(a.status >= 500 for a in shift) / max(1, len(shift)),
            standby_p95_ms=statistics.quantiles(latencies, n=20)[18]
            if len(latencies) >= 20 else max(latencies),
            worst_window_error_rate=_window_peak(shift),
            mirrored=sum(a.shadow for a in standby.answers),
            shift_completed=done_at is not None,
            shift_seconds=None if done_at is None else round(done_at - failed_at, 1),
            client_requests=client_total,
            client_errors=client_errors,
            ramp_records=dict(kinds),
        )
    finally:
        stop.set()
        if traffic is not None:
            with contextlib.suppress(Exception):
                await traffic
        envoy.stop()
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()


def report(results: list[RunResult]) -> str:
    rows = [
        ("", *("ramp on" if r.ramp else "ramp off" for r in results)),
        ("standby 5xx, whole shift (threshold 2 %)",
         *(f"{r.standby_error_rate:.1%}" for r in results)),
        ("worst 2 s window 5xx", *(f"{r.worst_window_error_rate:.1%}" for r in results)),
        ("standby p95 (threshold 800 ms)", *(f"{r.standby_p95_ms:.0f} ms" for r in results)),
        ("whole shift within thresholds", *(str(r.within_thresholds) for r in results)),
        ("shift completed (standby >= 90 %)",
         *(f"yes, {r.shift_seconds} s" if r.shift_completed else "no" for r in results)),
        ("standby requests (not mirrored)", *(str(r.standby_requests) for r in results)),
        ("mirrored copies to the standby", *(str(r.mirrored) for r in results)),
        ("client non-200 / requests",
         *(f"{r.client_errors} / {r.client_requests}" for r in results)),
        ("ramp records", *(", ".join(f"{k} {v}" for k, v in sorted(r.ramp_records.items()))
                           or "-" for r in results)),
    ]
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, width, strict=True)).rstrip()
                     for row in rows)
