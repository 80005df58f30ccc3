"""The tiers source's scenario, compressed to seconds, through a real Envoy: the direction only
(checkout p95: tier controller ≤ static tiers ≤ one FIFO cluster) and the controller's decisions
going back once the origin is fast again. The numbers themselves: `python -m bench.scenarios
priority`, docs/scenarios/priority.md."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.tier_scenario import Phases, run

pytestmark = pytest.mark.envoy

# after: drain, window 3 s, then recover_after (a third of it, at least 2 s) without the
# trigger lifts the actions and without the surplus gives taken slots back, a tick later
PHASES = Phases(before=2, slow=6.5, settle=2.5, after=12)


async def test_controller_beats_static_beats_fifo_and_its_decisions_reverse(
    tmp_path: Path,
) -> None:
    # nothing decides in the fifo and static set-ups: their fast phase after the slowdown
    # would only wait (the checkout p95 is of the slow phase)
    fifo = await run("fifo", replace(PHASES, after=0), tmp_path)
    static = await run("static", replace(PHASES, after=0), tmp_path)
    controller = await run("controller", PHASES, tmp_path)
    p95 = {r.setup: r.checkout_p95 for r in (fifo, static, controller)}
    assert p95["controller"] <= p95["static"] <= p95["fifo"], (p95, [
        (r["time"], r["kind"], r["rule"]) for r in controller.records])
    assert not fifo.records and not static.records  # nothing decides there
    actions = [r["detail"]["change"] for r in controller.records if r["kind"] == "tier_action"]
    assert actions[:1] == ["on"] and actions[-1] == "off", [
        (r["time"], r["kind"], r["rule"]) for r in controller.records]
    # checkout's extra slots: borrowed (idle ones) or taken by preemption; all back at the end
    extra = [r["detail"]["state"]["lent"].get("critical", 0)
             + r["detail"]["state"]["took"].get("critical", 0)
             for r in controller.records if r["kind"] in ("tier_lend", "tier_preempt")]
    assert max(extra) > 0 and extra[-1] == 0, [
        (r["time"], r["kind"], r["rule"]) for r in controller.records]
