"""The incident bench's accounting, without Envoy: what counts as an error, goodput within a
deadline, percentiles of every request (a miss as infinitely late) beside those of answered
requests, the priority-inversion check, the baselines' sizing and Envoy's priority arithmetic,
the same schedule and the same per-request draws for every variant of a run, verdicts only
where the ranges over runs do not overlap, one time compression and seed-length incidents, an
origin that stops working for a client that left, and a report recomputed byte for byte from
the per-request files."""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench.scenarios.__main__ import report_from
from bench.scenarios.analysis import (
    Inversions,
    RunResult,
    Spread,
    answered,
    causes,
    error_rate,
    every_latency,
    goodput,
    held_though_better,
    inversions,
    is_shed_onset,
    latencies,
    percentile,
    shed_while_idle,
    statuses,
    verdict,
)
from bench.scenarios.catalog import PRIORITY, SCENARIOS, smoke
from bench.scenarios.load import (
    CLIENT_TIMEOUT_S,
    MIX,
    REQUEST_HEADER,
    Sample,
    Surge,
    Visit,
    schedule,
)
from bench.scenarios.origin import Behaviour, OriginSpec, OriginStats, ScriptedOrigin
from bench.scenarios.report import DEADLINES, _during, on_time
from bench.scenarios.stack import (
    FAILOVER_BASELINES,
    ROOT,
    ballast_desired,
    envoy_shares,
    failover_bootstrap,
    failover_layout,
    outlier_volume,
    seed_tiers,
    sized_tiers,
)
from bench.scenarios.store import read_run, write_meta, write_run
from bench.scenarios.timers import COMPRESSION
from control_plane.decide.controller import ControllerState, step
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy
from harness.envoy_process import free_port

HOSTS = {"primary": [8001, 8002, 8003, 8004], "secondary": [8011, 8012, 8013, 8014]}


def _sample(status: int, *, shed: bool = False, timed_out: bool = False, ms: float = 10.0
            ) -> Sample:
    return Sample(1.0, "ewr", "checkout", status, ms, "primary", shed, timed_out)


def test_the_error_rate_counts_sheds_deferrals_timeouts_resets_and_5xx() -> None:
    samples = [
        _sample(200, ms=10), _sample(200, ms=20),  # answered
        _sample(503, shed=True, ms=1),  # shed at the edge
        _sample(202, shed=True, ms=1),  # deferred at the edge
        _sample(0, timed_out=True, ms=10_000),  # no answer in time
        _sample(0, ms=5),  # reset
        _sample(504, ms=4000),  # Envoy's route timeout
        _sample(500, ms=30), _sample(503, ms=2),  # origin 5xx, overloaded origin
    ]
    assert error_rate(samples) == 7 / 9
    assert causes(samples) == {"shed": 1, "deferred": 1, "timeout": 2, "reset": 1, "5xx": 2}
    assert statuses(samples) == {503: 2, 202: 1, 0: 2, 504: 1, 500: 1}
    # latencies only over what was answered; the rest are excluded, not averaged in
    assert latencies(samples) == [10, 20] and len(answered(samples)) == 2


def test_the_same_seed_gives_the_same_schedule_and_a_surge_adds_only_its_kind() -> None:
    rps = {"ewr": 30.0, "sjc": 30.0}
    assert schedule(5, 20.0, rps) == schedule(5, 20.0, rps)
    assert schedule(5, 20.0, rps) != schedule(6, 20.0, rps)
    base = schedule(5, 20.0, {"ewr": 30.0})
    surged = schedule(5, 20.0, {"ewr": 30.0}, surges=(Surge("checkout", 50.0, 0.25, 0.5),))
    extra = len(surged) - len(base)
    assert 150 < extra < 350  # 50/s for 5 s: 250
    inside = [r for r in surged if 5 <= r.at < 10]
    assert sum(r.kind == "checkout" for r in inside) > 0.6 * len(inside)  # (6 + 50) / 80
    assert [r.n for r in surged] == list(range(len(surged)))  # every request numbered


def test_a_request_costs_the_same_at_an_origin_whatever_the_order_of_arrival() -> None:
    spec = OriginSpec(cache_ttl_s=9.0, miss_ms=300.0, api_ms=40.0)
    a, b = (ScriptedOrigin("primary", [0], spec, seed=3) for _ in range(2))
    bad = Behaviour(p50_ms=200.0, error_rate=0.5)

    def cost(origin: ScriptedOrigin, rid: int, attempt: int) -> tuple[float, float]:
        rng = origin.draw(str(rid), attempt)
        return origin.work_s(rng, bad, "/p/1.html", False), rng.random()

    forward = {(i, k): cost(a, i, k) for i in range(50) for k in (1, 2)}
    backward = {(i, k): cost(b, i, k) for i in reversed(range(50)) for k in (2, 1)}
    assert forward == backward
    assert forward[(1, 1)] != forward[(1, 2)]  # a retry is a new draw
    other = ScriptedOrigin("primary", [0], spec, seed=4)
    assert cost(other, 1, 1) != forward[(1, 1)]


def test_verdicts_only_where_the_ranges_do_not_overlap() -> None:
    low, high, wide = Spread((1.0, 2.0, 3.0)), Spread((4.0, 5.0, 9.0)), Spread((2.5, 5.0, 6.0))
    assert low.median == 2.0 and (high.low, high.high) == (4.0, 9.0)
    assert verdict(low, high) == "better" and verdict(high, low) == "worse"
    assert verdict(low, high, smaller_is_better=False) == "worse"
    assert verdict(low, wide) == "no difference shown"
    assert verdict(Spread((1.0,)), high) == "-"  # one run proves nothing


def test_one_compression_for_every_control_timer() -> None:
    desired = ballast_desired(["ewr"], {"ewr": 10000}, {"primary": 8001, "secondary": 8002})
    c = COMPRESSION
    for key, seed_s in (("interval", 20), ("window", 30), ("cold_after", 90), ("for", 30),
                        ("recover_after", 60)):
        assert f"{key}: {round(seed_s / c * 1000)}ms" in desired, key
    assert f"health_check: {{interval: {round(5 / c * 1000)}ms" in desired
    for variant in FAILOVER_BASELINES:
        boot = failover_bootstrap(variant, "ewr", 10000, 9901, HOSTS, 120, 50.0)
        cluster = boot["static_resources"]["clusters"][0]
        assert cluster["health_checks"][0]["interval"] == f"{5 / c:g}s"
        assert cluster["outlier_detection"]["base_ejection_time"] == f"{30 / c:g}s"
        assert cluster["outlier_detection"]["interval"] == f"{10 / c:g}s"
    flap = SCENARIOS["flap"].script
    phases = {flap(share / 1000)["primary"].error_rate > 0 for share in range(150, 250)}
    assert phases == {True, False}
    assert PRIORITY.surges  # checkout's demand exceeds its share while the origin is slow
    # each incident as long as its seed's, compressed by the same factor: seed 000's 8 minutes
    start, end = PRIORITY.incident
    assert round((end - start) * PRIORITY.duration_s * c) == 8 * 60
    for name in ("failover", "regional", "flap", "restart"):
        scenario = SCENARIOS[name]
        start, end = scenario.incident
        assert round((end - start) * scenario.duration_s * c) == 6 * 60, name


async def test_the_origin_stops_working_for_a_client_that_left() -> None:
    origin = await ScriptedOrigin("primary", [free_port()], OriginSpec(
        workers=1, max_waiting=10, healthy_p50_ms=5000.0, abandon_after_s=0.2), seed=1).start()
    url = f"http://127.0.0.1:{origin.ports[0]}/p/1.html"
    try:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(url, headers={REQUEST_HEADER: "1"},
                                       timeout=aiohttp.ClientTimeout(total=0.2)) as response:
                    await response.read()
            except TimeoutError:
                pass
            origin.behaviour = Behaviour(p50_ms=10.0)
            started = time.monotonic()
            async with session.get(url, headers={REQUEST_HEADER: "2"}) as response:
                assert response.status == 200
            waited = time.monotonic() - started
        # the only worker was freed at most abandon_after_s after the first client left,
        # not after the ~5 s of work it had been given
        assert waited < 2.0, waited
        assert origin.abandoned == 1
    finally:
        await origin.stop()
        await asyncio.sleep(0)


def _failing(errors: int, at: int) -> OriginSignals:
    return OriginSignals(1000, errors, 0, 200.0, 300.0, 0.0, 0, 1.0, at)


def test_a_nowhere_better_hold_is_checked_against_its_own_scores() -> None:
    """The check reads the record as the log holds it: a real controller hold with both
    origins failing alike passes; the same record with a secondary scoring better by the
    margin fails, with words naming both scores."""
    policy, pref = FailoverPolicy(), ("primary", "secondary")
    weights, state, record = {"primary": 95, "secondary": 5}, ControllerState(), {}
    for tick in (1, 2, 3):
        result = step(policy, pref, weights, state,
                      {"primary": _failing(600, tick), "secondary": _failing(603, tick)},
                      tick, 0)
        weights, state = result.weights_after, result.state
        record = {"kind": result.kind, "pop": "ewr", **result.record_fields()}
    assert "nowhere better" in record["rule"]
    assert held_though_better(record, policy.compare_margin, policy.breach_windows) is None
    record["inputs"]["scores"]["secondary"]["composite"] = (
        record["inputs"]["scores"]["primary"]["composite"] + policy.compare_margin)
    found = held_though_better(record, policy.compare_margin, policy.breach_windows)
    assert found is not None and found.startswith("ewr: secondary scored")
    steady = {**record, "kind": "steady", "rule": "all origins within thresholds"}
    assert held_though_better(steady, policy.compare_margin, policy.breach_windows) is None


def _shed_record(active: list[list[object]], pending: float, lent: int = 0,
                 overloaded: float | None = None) -> dict[str, object]:
    reading = {"pending_max": pending, "observed_at_ms": 1, "active_by_node": active,
               "overloaded_max": overloaded, "wait": None}
    return {
        "kind": "tier_action", "pop": "ewr", "rule": "p95 wait 40 ms > 35 ms for 30 s",
        "inputs": {"trigger": "wait", "trigger_tier": "critical", "shed_threshold": 0.85,
                   "readings": {"critical": reading},
                   "state_before": {"lent": {"critical": lent} if lent else {}}},
        "detail": {"change": "on", "actions": {"shed_tier": "background", "shed_tiers": []}},
    }


def test_a_shed_onset_with_idle_slots_is_found() -> None:
    """A re-prioritization shed whose trigger tier peaked below its slots with nothing pending
    had idle slots (issue 21: "shed while all 84 critical slots sit idle"); one whose tier was
    full, queued or overloaded did not. Utilization shedding at or below its threshold had
    idle slots too. A record that stops shedding is no onset."""
    slots = {"critical": 84}
    idle = shed_while_idle(_shed_record([["e1", 3.0], ["e2", 1.0]], 0.0), slots)
    assert idle is not None and "3 of its 84 slots" in idle
    assert shed_while_idle(_shed_record([["e1", 84.0]], 5.0), slots) is None  # full and queued
    assert shed_while_idle(_shed_record([["e1", 80.0]], 0.0, overloaded=1.0), slots) is None
    # borrowed slots count: 90 active of 84 + 10 is still idle capacity
    assert shed_while_idle(_shed_record([["e1", 90.0]], 0.0, lent=10), slots) is not None
    off = _shed_record([["e1", 3.0]], 0.0)
    off["detail"] = {"change": "off", "actions": None}
    assert not is_shed_onset(off) and shed_while_idle(off, slots) is None
    utilization = {"kind": "tier_shed", "pop": "ewr", "inputs": {"shed_threshold": 0.85},
                   "detail": {"change": "on", "utilization": 0.9}}
    assert is_shed_onset(utilization) and shed_while_idle(utilization, slots) is None
    utilization["detail"] = {"change": "on", "utilization": 0.5}
    assert shed_while_idle(utilization, slots) is not None


def test_goodput_counts_a_late_answer_as_lost_and_every_request_percentiles_a_miss_as_infinite(
) -> None:
    samples = [_sample(200, ms=100), _sample(200, ms=2000), _sample(200, ms=2500),  # late
               _sample(503, shed=True, ms=1), _sample(0, timed_out=True, ms=10_000)]
    assert goodput(samples, 2.4) == 2 / 5  # the late 200, the shed and the timeout are lost
    assert goodput(samples, 3.0) == 3 / 5
    assert on_time(samples) == 2 / 5  # checkout's own deadline
    assert DEADLINES["critical"].seconds == 2.4
    every = every_latency(samples)
    assert sorted(every) == [100, 2000, 2500, math.inf, math.inf]
    assert percentile(every, 50) == 2500 and percentile(every, 80) == math.inf
    # answered-only percentiles leave the misses out: a variant that fails its slow requests
    # looks fast there, not in the every-request line
    assert percentile(latencies(samples), 95) == 2500
    fast_failer = [_sample(200, ms=100)] * 3 + [_sample(503, shed=True, ms=1)] * 2
    assert percentile(latencies(fast_failer), 95) == 100
    assert percentile(every_latency(fast_failer), 95) == math.inf
    assert math.isnan(goodput([], 2.4)) and math.isnan(percentile([], 95))


def _visit(origin: str, start: float, end: float) -> Visit:
    return Visit(origin, 0, start, start, end, "200")


def test_an_inversion_is_a_critical_loss_beside_a_lower_tier_start_at_the_same_origin() -> None:
    shed = Sample(10.0, "ewr", "checkout", 503, 1.0, "", True, n=1)  # lost at 10.001
    timed_out = Sample(20.0, "ewr", "checkout", 504, 2000.0, "", False, n=2,
                       attempts=(_visit("secondary", 20.0, 22.0),))  # lost at 22.0
    samples = [
        shed, timed_out,
        Sample(9.0, "ewr", "image", 200, 1100.0, "primary", False, n=3,
               attempts=(_visit("primary", 10.03, 10.1),)),  # 29 ms after the shed
        Sample(9.0, "ewr", "html", 200, 1100.0, "primary", False, n=4,
               attempts=(_visit("primary", 10.2, 10.3),)),  # 199 ms after: not counted
        Sample(21.0, "ewr", "html", 200, 1100.0, "primary", False, n=5,
               attempts=(_visit("primary", 22.01, 22.2),)),  # another origin than the loss's
        Sample(21.9, "ewr", "checkout", 200, 100.0, "secondary", False, n=6,
               attempts=(_visit("secondary", 21.99, 22.05),)),  # critical: no inversion
    ]
    assert inversions(RunResult("ballast", samples)) == Inversions(lost=2, inverted=1, starts=1)
    samples.append(Sample(21.0, "ewr", "image", 200, 1100.0, "secondary", False, n=7,
                          attempts=(_visit("secondary", 21.96, 22.1),)))
    assert inversions(RunResult("ballast", samples)) == Inversions(lost=2, inverted=2, starts=2)


def test_the_baselines_priority_arithmetic_follows_envoys() -> None:
    binary = failover_layout(FAILOVER_BASELINES["binary-deep"], HOSTS)
    assert envoy_shares(binary, {8001: True, 8011: True}) == {"primary": 100, "secondary": 0}
    assert envoy_shares(binary, {8001: False, 8011: True}) == {"primary": 0, "secondary": 100}
    warm = failover_layout(FAILOVER_BASELINES["binary-warm"], HOSTS)
    up = dict.fromkeys([8001, 8011, 8012], True)
    assert envoy_shares(warm, up) == {"primary": 95, "secondary": 5}
    assert envoy_shares(warm, {**up, 8001: False}) == {"primary": 0, "secondary": 100}
    spill = failover_layout(FAILOVER_BASELINES["priority-spill"], HOSTS)
    healthy = dict.fromkeys([*HOSTS["primary"], *HOSTS["secondary"]], True)
    assert envoy_shares(spill, {**healthy, 8001: False}) == {"primary": 100, "secondary": 0}
    assert envoy_shares(spill, {**healthy, 8001: False, 8002: False}) == {
        "primary": 70, "secondary": 30}  # 2 of 4 healthy x 1.4
    # outlier detection judges a host on half of what it receives per (compressed) interval
    assert outlier_volume(FAILOVER_BASELINES["priority-spill"], 50.0) == 6  # 12.5 per 1 s
    assert outlier_volume(FAILOVER_BASELINES["binary-deep"], 50.0) == 25
    boot = failover_bootstrap("binary-warm", "ewr", 10000, 9901, HOSTS, 120, 50.0)
    route = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert "request_mirror_policies" not in route[0]["route"]  # the API is never mirrored
    assert route[1]["route"]["request_mirror_policies"][0]["cluster"] == "shop.mirror"
    deep = boot["static_resources"]["clusters"][0]["health_checks"][0]
    assert deep["http_health_check"]["path"] == "/healthz/cacheable"


def test_static_tiers_are_sized_by_the_seeds_rules() -> None:
    shares = {k.tier: k.share for k in MIX}
    tiers = {t.name: t for t in sized_tiers(20, 40.0, 110.0, 117.0, shares)}
    # background carries its normal 12/s x 0.117 s = 1.4 busy at <= 80 %: 2 slots, not 1;
    # normal's 20/s x 0.117 s = 2.3 fit its 4
    assert (tiers["critical"].slots, tiers["normal"].slots, tiers["background"].slots) == (
        14, 4, 2)
    # pending: what the slots drain within queue_timeout at the normal p50
    assert tiers["critical"].pending == int(14 * 800 / 110)
    assert tiers["background"].pending == int(2 * 3000 / 110)
    # route timeouts: when seed 000's classifier gives up (2.4 / 3 / 3 s), before the client
    assert [t.timeout_s for t in tiers.values()] == [2.4, 3.0, 3.0]
    assert all(t.timeout_s < CLIENT_TIMEOUT_S for t in tiers.values())
    naive = {t.name: t for t in seed_tiers(20)}
    assert naive["background"].slots == 1 and naive["normal"].pending == 8000
    assert naive["background"].timeout_s > CLIENT_TIMEOUT_S  # the seed's as it stands


def _synthetic(variant: str, seed: int, duration: float) -> RunResult:
    """A run as `run_variant` would record it, without Envoy: a mix of answers, sheds,
    timeouts and retries, samples of weights and origins, Envoy counters, records."""
    rng = random.Random(f"{variant}:{seed}")
    samples = []
    for n in range(400):
        at = round(n * duration / 400, 3)
        kind = rng.choice(MIX)
        roll = rng.random()
        ms = round(rng.uniform(20, 4000), 3)
        visits: tuple[Visit, ...] = ()
        if roll < 0.1:
            status, shed, timed_out, origin = 503, True, False, ""
        elif roll < 0.15:
            status, shed, timed_out, origin, ms = 0, False, True, "", 10_000.0
            visits = (Visit("primary", 0, at + 0.01, at + 0.5, at + 10.5, "abandoned"),)
        else:
            status, shed, timed_out, origin = 200, False, False, "primary"
            visits = (Visit("primary", 1, at + 0.001, None, at + 0.001, "overloaded"),
                      Visit("primary", 0, at + 0.002, at + 0.003,
                            round(at + ms / 1000 - 0.001, 3), "200", rng.random() < 0.05))
        samples.append(Sample(at, "ewr", kind.name, status, ms, origin, shed, timed_out, n,
                              kind.path.format(n=n), visits))
    run = RunResult(variant, samples, seed=seed, run=seed - 1, load_before="1.00, 2.00, 3.00",
                    load_after="1.50, 2.00, 3.00", started_utc="2026-12-03 00:00:00 UTC")
    for i in range(int(duration * 10)):
        t = i / 10
        run.origin_stats.append((t, "primary", OriginStats(i * 5, 0, 0, i % 21, 20, 0, 0, 0)))
        run.loop_lag.append((t, 0.001 * (i % 7)))
        if i % 5 == 0:
            run.weights.append((t, "ewr", {"primary": 100}))
            run.unhealthy.append((t, "ewr", ("primary:p0h0:od",) if i % 20 == 0 else ()))
    run.envoy_stats = {"ewr": {"cluster.shop.upstream_rq_pending_overflow": 7,
                               "cluster.shop.outlier_detection.ejections_enforced_total": 2}}
    run.probes = {"primary": {"/healthz": 3}}
    if variant == "ballast":
        run.decisions.update({"tier_action": 1, "tier_queue": 3})
        run.decision_examples.update({"tier_action": "critical wait p95 40 ms > 35 ms"})
        run.records.append((5.0, "tier_action", "ewr"))
    return run


def test_a_report_recomputed_from_the_runs_files_is_byte_identical(tmp_path: Path) -> None:
    """The report is computed from the per-request files alone: written in this process, then
    recomputed by `python -m bench.scenarios report DIR` in another one (another hash seed),
    it is the same to the byte; and a run read back holds every request and attempt."""
    scenario = smoke(PRIORITY)
    out, data = tmp_path / "reports", tmp_path / "reports" / "priority"
    meta = {"scenario": "priority", "smoke": True, "command": "test", "out": str(out),
            "commit": "abc1234", "machine": "test", "started": "s", "ended": "e",
            "seeds": [1, 2], "variants": list(scenario.variants), "runs": []}
    for seed in (1, 2):
        for variant in scenario.variants:
            run = _synthetic(variant, seed, scenario.duration_s)
            path = write_run(data, run)
            back = read_run(path)
            assert [(s.n, s.kind, s.status, s.cause, len(s.attempts)) for s in back.samples] == [
                (s.n, s.kind, s.status, s.cause, len(s.attempts)) for s in run.samples]
            assert back.samples[20].attempts == run.samples[20].attempts
            meta["runs"].append({"run": seed - 1, "variant": variant, "seed": seed,
                                 "file": path.name})
    write_meta(data, meta)
    tables, runs = report_from(out, "priority")
    assert [len(rs) for rs in runs.values()] == [2, 2]
    first = (out / "priority.md").read_bytes()
    assert b"answered within 2.4 s" in first and b"### Priority inversions" in first
    rows = {m.name: spreads for _, rs in tables for m, spreads in rs}
    expected = [100 * on_time(_during(scenario, r)) for r in runs["ballast"]]
    assert rows["all requests: answered within their tier's deadline (%)"]["ballast"].values == (
        tuple(expected))
    (out / "priority.md").unlink()
    subprocess.run([sys.executable, "-m", "bench.scenarios", "report", str(out)], cwd=ROOT,
                   check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "7"})
    assert (out / "priority.md").read_bytes() == first
