"""Load reports (LRS) from real Envoy 1.40 (`ballast bootstrap --load-reports`: the bootstrap's
`cluster_manager.load_stats_config`) as Ballast's only metric source.

What Envoy reports per locality, and per endpoint when Ballast asks for it, matches what the
origins counted within 5 %; a regional fault seen only through the load reports of ewr's Envoy
moves ewr's weights, gradually, while sjc's stay home.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.lifecycle.status import service_status
from harness.demo_origin import Fault
from harness.eventually import eventually
from harness.fleet import Fleet, dump_records, running_fleet

pytestmark = pytest.mark.envoy

HOME = {"primary": 95, "secondary": 5}


def _reported(fleet: Fleet) -> dict[str, float]:
    """Requests issued per origin as the load reports say, both PoPs and every tier summed."""
    totals: dict[str, float] = {}
    for (_, group, origin), held in fleet.service.load_reports.report_windows(
            2**62, 2**62).items():
        if group == "shop":
            totals[origin] = totals.get(origin, 0.0) + held.issued
    return totals


def _matches(fleet: Fleet) -> bool:
    reported = _reported(fleet)
    return all(abs(reported.get(name, 0.0) - origin.total) <= 0.05 * max(origin.total, 20)
               for name, origin in fleet.origins.items())


async def test_envoy_load_reports_match_what_the_origins_counted(tmp_path: Path) -> None:
    async with running_fleet(tmp_path, metrics_source="lrs",
                             lrs_endpoint_granularity=True) as fleet:
        await eventually(lambda: fleet.origins["primary"].total >= 150, 30,
                         "traffic through both PoPs")
        fleet.stop_traffic()
        await eventually(lambda: _matches(fleet), 10,
                         "load reports matching the origins' counts")
        reported = _reported(fleet)
        assert fleet.origins["secondary"].total > 0 and reported["secondary"] > 0
        reporters = fleet.service.load_reports.reporters()
        assert {r["node"] for r in reporters} == {"ewr-edge-1", "sjc-edge-1"}, reporters
        assert all(r["per_endpoint"] for r in reporters), reporters
        shown = service_status(fleet.service)["load_reports"]
        assert shown["streams"] == 2 and shown["per_pop"] == {"ewr": 1, "sjc": 1}, shown
        assert [r["node"] for r in shown["listed"]] == ["ewr-edge-1", "sjc-edge-1"]


async def test_a_regional_incident_seen_by_load_reports_alone_moves_weights(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, metrics_source="lrs") as fleet:
        await eventually(lambda: fleet.origins["primary"].total > 30, 20, "steady traffic")
        fleet.origins["primary"].set_fault(Fault(error_rate=0.6, status=503, pops=("ewr",)))
        await eventually(lambda: fleet.weights("ewr")["primary"] <= 70, 45, "ewr to leave")
        shifts = fleet.records("weight_shift", pop="ewr")
        log = dump_records(fleet.records())
        assert len(shifts) >= 2, log
        assert all(r["weights_after"]["secondary"] >= 5 for r in shifts), log
        signals = shifts[0]["inputs"]["signals"]["primary"]
        assert signals["errors_5xx"] > 0 and signals["requests"] > 0, signals
        assert signals["latency_from"] in ("none", "probes"), signals  # reports carry none
        assert "5xx" in shifts[0]["rule"] or "error" in shifts[0]["rule"], shifts[0]["rule"]
        assert fleet.weights("sjc") == HOME, log
        assert not fleet.records("weight_shift", pop="sjc"), log
