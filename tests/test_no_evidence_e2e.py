"""Issue 33: no evidence is said as such, and a node that sends no metrics is named with the fix.

Ballast (the sink as its metric source, no probes) and two real Envoys: `ewr-1` bootstrapped with
`--metrics-sink` (its stats stream in, but no request is sent: no origin has a sample) and
`sjc-1` without it (nothing arrives from it). The ewr pair holds for `no_evidence` from its first
tick (it was "steady: all origins within thresholds"); the sjc pair holds "fail static: no
metrics", and its record, `ballast status`, `ballast explain` and the dashboard's group page name
`sjc-1` and what to change.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.fleet import write_fast_desired

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]


def _holds(state_dir: Path, pop: str) -> list[dict[str, object]]:
    return [r for r in iter_records(state_dir)
            if r["kind"] == "hold" and r.get("pop") == pop and r.get("group") == "shop"]


async def test_no_evidence_and_a_node_without_metrics_are_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    origins = {name: await DemoOrigin(name, free_port()).start()
               for name in ("primary", "secondary")}
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(tmp_path / "desired.yaml", origins, listener, sjc_listener)
    xds, admin = free_port(), free_port()
    state = tmp_path / "state"
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state, xds_address=f"127.0.0.1:{xds}",
        admin_address=f"127.0.0.1:{admin}", probes=False, reload_poll_s=0.1))
    envoys = []
    try:
        await service.start()
        for pop, sink in (("ewr", True), ("sjc", False)):
            port = free_port()
            envoys.append(EnvoyProcess(ads_bootstrap(
                node_id=f"{pop}-1", pop=pop, xds_port=xds, admin_port=port, metrics_sink=sink,
                needed_stats_only=True, stats_flush_interval_ms=1000), port).start())
        for envoy in envoys:
            await asyncio.to_thread(envoy.wait_ready, 20)
        await eventually(lambda: any("no evidence" in str(r["rule"]) for r in _holds(state, "ewr"))
                         and any("sjc-1" in str(r["rule"]) for r in _holds(state, "sjc")),
                         30, "ewr holding for no evidence, sjc naming its silent node")
        ewr = next(r for r in _holds(state, "ewr") if "no evidence" in str(r["rule"]))
        sjc = next(r for r in _holds(state, "sjc") if "sjc-1" in str(r["rule"]))
        url = f"http://127.0.0.1:{admin}"

        def timeline(pop: str) -> dict[str, object]:
            with urllib.request.urlopen(f"{url}/dashboard/api/timeline?pop={pop}&group=shop",
                                        timeout=5) as answer:
                return json.loads(answer.read())

        ewr_page = await asyncio.to_thread(timeline, "ewr")
        sjc_page = await asyncio.to_thread(timeline, "sjc")
        status = await asyncio.to_thread(main, ["status", "--server", url])
        status_out = capsys.readouterr().out
        explained = await asyncio.to_thread(main, ["explain", "--server", url, "--pop", "sjc",
                                                   "--group", "shop"])
        explain_sjc = capsys.readouterr().out
        await asyncio.to_thread(main, ["explain", "--server", url, "--pop", "ewr", "--group",
                                       "shop"])
        explain_ewr = capsys.readouterr().out
    finally:
        for envoy in envoys:
            envoy.stop()
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()

    assert not [r for r in iter_records(state) if r["kind"] == "steady"], \
        "a window without evidence is never 'steady'"
    rule = str(ewr["rule"])
    assert rule.startswith("no evidence: no origin has a conclusive window"), rule
    assert "sjc-1" not in rule and "ewr-1" not in rule  # ewr-1 reports: nothing to fix there
    assert str(sjc["rule"]).startswith("fail static: no metrics"), sjc["rule"]
    fix = "start their Envoy from `ballast bootstrap --pop sjc --node-id <id> --metrics-sink`"
    assert "node(s) sjc-1 of PoP sjc stream no stats to Ballast" in str(sjc["rule"])
    assert fix in str(sjc["rule"])
    assert status == 0 and "no metrics (the weight controller holds these PoPs):" in status_out
    assert f"  sjc: node(s) sjc-1 of PoP sjc stream no stats to Ballast: {fix}" in status_out
    assert "ewr-1" not in status_out.split("no metrics (")[1]
    assert explained == 0 and "sjc-1" in explain_sjc and fix in explain_sjc
    assert "no evidence: no origin has a conclusive window" in explain_ewr
    ewr_held = ewr_page["controllers"]["Weight controller"]  # type: ignore[index]
    assert ewr_held["holding"] == "no_evidence", ewr_page["controllers"]
    assert sjc_page["controllers"]["Weight controller"]["holding"] == "fail_static"  # type: ignore[index]
    assert "sjc-1" in sjc_page["controllers"]["Weight controller"]["rule"]  # type: ignore[index]
