"""Proxyless gRPC clients steered by Ballast: real grpcio xDS clients (one process per PoP, the
bootstrap of `ballast bootstrap --grpc`) dialling `xds:///shop-api`, plain gRPC origins
counting the calls they answer, load reports (LRS) as the only metric source.

A regional fault (the primary fails 60 % of the calls from ewr only) makes the clients of ewr
report the errors; ewr's weights leave the primary step by step and the share of ewr's calls
the primary answers follows the weights, while sjc's clients never move. Before that, the load
reports Ballast received match what the origins counted, within 5 %.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from harness.eventually import eventually
from harness.grpc_fleet import SERVICE, GrpcFleet, grpc_fleet
from harness.grpc_origin import GrpcFault

HOME = {"primary": 95, "secondary": 5}
APPLY_S = 1.0  # a push's way to the client and its applying it, on a loaded machine


async def _watch(fleet: GrpcFleet, history: list[tuple[float, int]]) -> None:
    while True:
        history.append((time.monotonic(), fleet.weights("ewr")["primary"]))
        await asyncio.sleep(0.05)


def _share(before: dict[str, int], after: dict[str, int]) -> tuple[float, int]:
    """The primary's share of the calls answered between two counts, and their number."""
    primary = after["primary"] - before["primary"]
    total = primary + after["secondary"] - before["secondary"]
    return (primary / total if total else 0.0), total


def _reported(fleet: GrpcFleet) -> dict[tuple[str, str], float]:
    windows = fleet.service.load_reports.report_windows(2**62, 2**62)
    return {(pop, origin): held.issued for (pop, group, origin), held in windows.items()
            if group == SERVICE}


def _matches(fleet: GrpcFleet) -> bool:
    reported = _reported(fleet)
    for pop in ("ewr", "sjc"):
        for origin, counted in fleet.calls(pop).items():
            if abs(reported.get((pop, origin), 0.0) - counted) > 0.05 * max(counted, 20):
                return False
    return True


async def _load_reports_match_the_origins(fleet: GrpcFleet) -> None:
    pops = ("ewr", "sjc")
    # a client's first calls go to whichever origin's connection is ready first (gRPC picks
    # among ready localities only): the split by weight is measured from here on
    await eventually(lambda: min(fleet.calls(pop)["primary"] for pop in pops) >= 40, 20,
                     "both PoPs' clients connected")
    warm = {pop: fleet.calls(pop) for pop in pops}
    await eventually(lambda: min(fleet.calls(pop)["primary"] - warm[pop]["primary"]
                                 for pop in pops) >= 150, 20, "calls from both PoPs")
    for pop in pops:
        await fleet.ask(pop, "rate 0")
    await eventually(lambda: _matches(fleet), 10, "load reports matching the origins' counts")
    reported = _reported(fleet)
    for pop in pops:
        counted = fleet.calls(pop)
        share, _ = _share(warm[pop], counted)
        assert counted["secondary"] > warm[pop]["secondary"], "the standby's warm pool gets calls"
        assert 0.9 <= share <= 0.99, (pop, warm[pop], counted)
        every = sum(counted.values())
        assert abs(sum(reported[pop, o] for o in counted) - every) <= 0.05 * every
    for pop in ("ewr", "sjc"):
        await fleet.ask(pop, "rate 40")


async def test_regional_fault_moves_ewr_calls_and_not_sjc(tmp_path: Path) -> None:
    async with grpc_fleet(tmp_path) as fleet:
        assert fleet.weights("ewr") == HOME and fleet.weights("sjc") == HOME
        await _load_reports_match_the_origins(fleet)
        sjc_before = fleet.calls("sjc")

        history: list[tuple[float, int]] = []  # (monotonic s, ewr's primary weight)
        watching = asyncio.create_task(_watch(fleet, history))
        fleet.origins["primary"].set_fault(GrpcFault(error_rate=0.6, pops=("ewr",)))
        await eventually(lambda: fleet.weights("ewr")["primary"] <= 75, 45, "ewr to leave")
        # the share of ewr's calls the primary answers follows the weights as they move on:
        # within the weights Ballast held over the interval and the second before it (what
        # the client may still apply at its start)
        samples = []
        for _ in range(3):
            started, counts_before = time.monotonic(), fleet.calls("ewr")
            await asyncio.sleep(2.0)  # a measurement interval: ~80 calls at 40 a second
            share, total = _share(counts_before, fleet.calls("ewr"))
            held = [w for at, w in history if at >= started - APPLY_S] or [history[-1][1]]
            samples.append((max(held), min(held), round(share * 100), total))
            assert total >= 40, samples
            assert min(held) - 8 <= share * 100 <= max(held) + 8, samples
        watching.cancel()
        assert samples[-1][1] < samples[0][1], samples  # the weights went on moving
        shifts = fleet.records("weight_shift", pop="ewr")
        assert len(shifts) >= 2 and all(
            sum(r["weights_after"].values()) == 100 and r["weights_after"]["secondary"] >= 5
            for r in shifts), shifts
        assert "5xx" in shifts[0]["rule"] or "error" in shifts[0]["rule"], shifts[0]["rule"]
        # sjc: the same origin, no fault from there: its weights and its calls never moved
        assert fleet.weights("sjc") == HOME
        assert not fleet.records("weight_shift", "return", pop="sjc")
        share, total = _share(sjc_before, fleet.calls("sjc"))
        assert total >= 200 and share >= 0.9, (share, total)
        errors = await fleet.ask("sjc", "report")
        assert not errors["errors"], errors
