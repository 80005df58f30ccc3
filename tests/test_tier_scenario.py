"""The tiers source's scenario, compressed to seconds, through a real Envoy: the direction only
(checkout p95: tier controller ≤ static tiers ≤ one FIFO cluster) and the controller's decisions
going back once the origin is fast again. The numbers themselves: `python -m bench.scenarios
priority`, docs/scenarios/priority.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.tier_scenario import Phases, run

pytestmark = pytest.mark.envoy

PHASES = Phases(before=2, slow=6.5, settle=2.5, after=10)  # after: drain, window 3 s, lift


async def test_controller_beats_static_beats_fifo_and_its_decisions_reverse(
    tmp_path: Path,
) -> None:
    fifo = await run("fifo", PHASES, tmp_path)
    static = await run("static", PHASES, tmp_path)
    controller = await run("controller", PHASES, tmp_path)
    p95 = {r.setup: r.checkout_p95 for r in (fifo, static, controller)}
    assert p95["controller"] <= p95["static"] <= p95["fifo"], p95
    assert not fifo.records and not static.records  # nothing decides there
    actions = [r["detail"]["change"] for r in controller.records if r["kind"] == "tier_action"]
    assert actions[:1] == ["on"] and actions[-1] == "off", controller.records
    critical_lent = [r["detail"]["lent"].get("critical", 0) for r in controller.records
                     if r["kind"] == "tier_lend"]
    assert max(critical_lent) > 0 and critical_lent[-1] == 0, controller.records
