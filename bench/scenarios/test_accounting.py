"""The incident bench's accounting, without Envoy: what counts as an error, the latencies over
answered requests, the same schedule and the same per-request draws for every variant of a
run, verdicts only where the ranges over runs do not overlap, one time compression, and an
origin that stops working for a client that left."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from bench.scenarios.analysis import (
    Spread,
    answered,
    causes,
    error_rate,
    held_though_better,
    is_shed_onset,
    latencies,
    shed_while_idle,
    statuses,
    verdict,
)
from bench.scenarios.catalog import PRIORITY, SCENARIOS
from bench.scenarios.load import REQUEST_HEADER, Sample, Surge, schedule
from bench.scenarios.origin import Behaviour, OriginSpec, ScriptedOrigin
from bench.scenarios.stack import ballast_desired, failover_bootstrap
from bench.scenarios.timers import COMPRESSION
from control_plane.decide.controller import ControllerState, step
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy
from harness.envoy_process import free_port


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
    boot = failover_bootstrap("ewr", 10000, 9901, {"primary": [8001], "secondary": [8002]})
    cluster = boot["static_resources"]["clusters"][0]
    assert cluster["health_checks"][0]["interval"] == f"{5 / c:g}s"
    assert cluster["outlier_detection"]["base_ejection_time"] == f"{30 / c:g}s"
    flap = SCENARIOS["flap"].script
    phases = {flap(share / 1000)["primary"].error_rate > 0 for share in range(100, 160)}
    assert phases == {True, False}
    assert PRIORITY.surges  # checkout's demand exceeds its share while the origin is slow


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
