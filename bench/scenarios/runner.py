"""One variant of one scenario, start to finish: origins, the edge (Ballast or the baseline),
the time script, the load, the samplers; then everything it started is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.scenarios.analysis import (
    Record,
    RunResult,
    held_though_better,
    is_nowhere_better,
    is_shed_onset,
    shed_while_idle,
)
from bench.scenarios.load import MIX, Surge, Visit, run_load, schedule
from bench.scenarios.origin import SIGMA, Behaviour, OriginSpec, ScriptedOrigin
from bench.scenarios.stack import (
    FAILOVER_BASELINES,
    BallastEdge,
    Edge,
    Locality,
    StaticEdge,
    TierSize,
    failover_bootstrap,
    failover_layout,
    priority_bootstrap,
    priority_tiers,
)
from control_plane.decisions.read import iter_records, record_time
from control_plane.desired.loader import load_desired
from harness.envoy_process import free_port

# decision records drawn on the time axis (weights, ramps, tier actions); routine ones are not
LOAD_PERIOD_S = 0.1  # origin load sampling; its lateness is the bench process's own lag
MARKED = ("weight_shift", "return", "ramp_", "tier_action", "tier_shed")


@dataclass(frozen=True)
class Scenario:
    name: str
    seed_ref: str  # which seed it reproduces
    summary: str  # one paragraph: what happens
    pops: tuple[str, ...]
    origins: dict[str, OriginSpec]
    duration_s: float
    rps_per_pop: float
    incident: tuple[float, float]  # share of the run the incident spans (the report's window)
    script: Callable[[float], dict[str, Behaviour]]  # run share 0..1 → behaviour per origin
    kill_at: float | None = None  # restart: kill -9 Ballast at this share of the run ...
    restart_after_s: float = 0.0  # ... and start it again this much later
    notes: tuple[str, ...] = field(default_factory=tuple)
    origin_concurrency: int = 120  # the group's max_origin_concurrency; the baseline's breakers
    variants: tuple[str, ...] = ("ballast",)  # Ballast first, then the baselines
    surges: tuple[Surge, ...] = ()  # extra load of one kind during part of the run
    standby: str = "secondary"  # the origin whose warming the report follows
    seed_length: str = ""  # how long the seed's incident lasts and how the bench maps it

    def scaled(self, duration_s: float, rps_per_pop: float,
               script: Callable[[float], dict[str, Behaviour]], incident: tuple[float, float]
               ) -> Scenario:
        return replace(self, duration_s=duration_s, rps_per_pop=rps_per_pop, script=script,
                       incident=incident)


def all_paths() -> list[str]:
    return [k.path.format(n=n) for k in MIX for n in range(1, k.items + 1)]


async def _every(period: float, stop: asyncio.Event, fn: Callable[[], object]) -> None:
    while not stop.is_set():
        fn()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)


def _edge(scenario: Scenario, variant: str, workdir: Path,
          origins: dict[str, ScriptedOrigin], seed: int) -> Edge:
    pops = list(scenario.pops)
    if variant == "ballast":
        return BallastEdge(workdir, pops, {n: o.ports[0] for n, o in origins.items()}, seed,
                           concurrency=scenario.origin_concurrency)
    if variant in FAILOVER_BASELINES:
        ports = {n: o.ports for n, o in origins.items()}
        return StaticEdge(workdir, pops, failover_layout(FAILOVER_BASELINES[variant], ports),
                          lambda pop, listener, admin: failover_bootstrap(
                              variant, pop, listener, admin, ports, scenario.origin_concurrency,
                              scenario.rps_per_pop))
    name, origin = next(iter(origins.items()))
    tiers = scenario_tiers(scenario, variant)
    return StaticEdge(workdir, pops, [Locality(0, name, (origin.ports[0],))],
                      lambda pop, listener, admin: priority_bootstrap(
                          variant, pop, listener, admin, origin.ports[0],
                          scenario.origin_concurrency, tiers))


def scenario_tiers(scenario: Scenario, variant: str) -> list[TierSize]:
    """A priority baseline's tiers, sized from the scenario's origin and load."""
    spec = next(iter(scenario.origins.values()))
    mean_ms = spec.healthy_p50_ms * math.exp(SIGMA**2 / 2)  # the log-normal's mean
    return priority_tiers(variant, scenario.origin_concurrency, scenario.rps_per_pop,
                          spec.healthy_p50_ms, mean_ms, {k.tier: k.share for k in MIX})


def _visits(origins: dict[str, ScriptedOrigin], started: float) -> dict[str, list[Visit]]:
    """Every origin's attempts by request number, on the run's clock, in arrival order."""
    out: dict[str, list[Visit]] = {}

    def t(at: float | None) -> float | None:
        return None if at is None else at - started

    for origin in origins.values():
        for a in origin.attempts:
            out.setdefault(a.rid, []).append(Visit(a.origin, a.host, a.arrive - started,
                                                   t(a.start), t(a.end), a.result, a.mirror))
    for visits in out.values():
        visits.sort(key=lambda v: v.arrive)
    return out


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


async def run_variant(scenario: Scenario, variant: str, workdir: Path, seed: int,
                      run: int = 0) -> RunResult:
    """`variant` is "ballast" or a baseline's name; same seed → same requests, and the same
    draws for each request at each origin."""
    workdir.mkdir(parents=True, exist_ok=True)
    origins = {
        name: ScriptedOrigin(name, [free_port() for _ in range(spec.endpoints)], spec,
                             seed=seed)
        for name, spec in scenario.origins.items()
    }
    for name, spec in scenario.origins.items():
        if spec.warm:
            origins[name].warm(all_paths())
    pops = list(scenario.pops)
    edge = _edge(scenario, variant, workdir, origins, seed)
    result = RunResult(variant, [], seed=seed, run=run, load_before=_load())
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    started = time.monotonic()
    try:
        for origin in origins.values():
            await origin.start()
        await asyncio.to_thread(edge.start)
        requests = schedule(seed, scenario.duration_s,
                            {pop: scenario.rps_per_pop for pop in pops}, surges=scenario.surges)
        started = time.monotonic()
        wall_start = time.time()
        result.started_utc = datetime.datetime.fromtimestamp(
            wall_start, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

        def now() -> float:
            return time.monotonic() - started

        def apply_script() -> None:
            share = min(1.0, now() / scenario.duration_s)
            for name, behaviour in scenario.script(share).items():
                origins[name].behaviour = behaviour

        last_tick = [now()]

        def sample_load() -> None:
            t = now()
            result.loop_lag.append((t, max(0.0, t - last_tick[0] - LOAD_PERIOD_S)))
            last_tick[0] = t
            for name, origin in origins.items():
                result.origin_stats.append((t, name, origin.stats()))

        async def sample_weights() -> None:
            while not stop.is_set():
                for pop in pops:
                    t = now()
                    with contextlib.suppress(OSError, ValueError, KeyError):
                        weights, out = await asyncio.to_thread(edge.observe, pop)
                        result.weights.append((t, pop, weights))
                        result.unhealthy.append((t, pop, tuple(out)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)

        async def restart() -> None:
            assert isinstance(edge, BallastEdge) and scenario.kill_at is not None
            await asyncio.sleep(scenario.kill_at * scenario.duration_s)
            edge.kill_ballast()
            result.events.append((now(), "Ballast killed (-9)"))
            await asyncio.sleep(scenario.restart_after_s)
            edge.start_ballast()
            result.events.append((now(), "Ballast restarted"))

        apply_script()
        tasks = [
            asyncio.create_task(_every(0.25, stop, apply_script)),
            asyncio.create_task(_every(LOAD_PERIOD_S, stop, sample_load)),
            asyncio.create_task(sample_weights()),
        ]
        if scenario.kill_at is not None and isinstance(edge, BallastEdge):
            tasks.append(asyncio.create_task(restart()))
        urls = {pop: f"http://127.0.0.1:{port}" for pop, port in edge.listener_ports.items()}
        samples = await run_load(requests, urls, started)
        stop.set()
        for pop in pops:
            result.envoy_stats[pop] = await asyncio.to_thread(edge.stats, pop)
        visits = _visits(origins, started)
        result.samples = [replace(s, attempts=tuple(visits.get(str(s.n), ()))) for s in samples]
        result.probes = {name: dict(sorted(o.probes.items())) for name, o in origins.items()}
        if isinstance(edge, BallastEdge):
            everything = [(record_time(r).timestamp() - wall_start, r)
                          for r in iter_records(edge.state_dir)]
            result.records = [(t, str(r["kind"]), str(r.get("pop", ""))) for t, r in everything
                              if str(r["kind"]).startswith(MARKED)]
            for _, r in everything:
                kind = str(r["kind"])
                result.decisions[kind] += 1
                result.decision_examples.setdefault(kind, str(r.get("rule", ""))[:300])
            _check_records(result, [r for _, r in everything], edge.desired)
            if len(result.events) >= 2:  # what the restarted Ballast said first, per PoP
                restarted = result.events[1][0]
                result.after_restart = [
                    f"{t:6.1f} s {r['kind']} {r.get('pop', '')}: {str(r.get('rule', ''))[:160]}"
                    for t, r in everything if t > restarted and r.get("pop")
                ][:12]
        result.load_after = _load()
        return result
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        edge.stop()
        for origin in origins.values():
            await origin.stop()


def _check_records(result: RunResult, records: list[Record], desired_path: Path) -> None:
    """Issue 21's checks on every record of the run (`analysis.held_though_better`,
    `analysis.shed_while_idle`), with the run's own desired state's margin and slots."""
    desired = load_desired(desired_path)
    group = desired.group("shop")
    policy = group.failover
    guarantees = {tier.name: group.guarantee(tier) for tier in group.tiers}
    for record in records:
        if is_nowhere_better(record):
            result.nowhere_better += 1
            found = held_though_better(record, policy.compare_margin, policy.breach_windows)
            if found is not None:
                result.held_though_better.append(found)
        if is_shed_onset(record):
            result.shed_onsets += 1
            idle = shed_while_idle(record, guarantees)
            if idle is not None:
                result.shed_with_idle_slots.append(idle)
