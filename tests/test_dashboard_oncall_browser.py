"""Issue 37: the on-call surfaces of the dashboard in a real headless Chromium (Debian's, driven
by Playwright), against real Envoys, origins, etcd.

- A whole fleet (Ballast in-process, Envoys in ewr and sjc, the primary origin answering 60 %
  503s through ewr): the ewr card's per-origin numbers (weight, 5xx, p95, health score) are
  `/status`'s of the same reconcile tick, the failing primary's score negative; the group's
  health chart draws that score below its 0 line (not clipped to 0); the failover-ramp panel
  says in words which stage the standby is on, the share it allows, since when it ramps (its
  ramp_start record) and why (a ramp record's rule).
- Two replicas on etcd, ewr's Envoy streaming from the follower: the leader's rollout panel
  shows each replica's ACKs of each PoP.

Each view is saved as a screenshot in the test's folder."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from control_plane.desired.model import StandbyRampPolicy
from harness.demo_origin import Fault
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually
from harness.fleet import running_fleet
from harness.rollout_fleet import rollout_desired
from tests.support.browser import chromium, require_chromium
from tests.test_rollout_replicas import _free_ports, _leading, canary_envoy, replica

pytestmark = [pytest.mark.envoy, pytest.mark.chromium]

SCHEDULE = StandbyRampPolicy().schedule
SENTENCE = re.compile(r"^secondary ramps: stage (\d+) of (\d+), at most (\d+) % of the traffic "
                      r"\(now (\d+) %\), since (\d\d:\d\d:\d\d)Z; why: (.+) #(\d+)$")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


NONE = "\u2013"  # what the card shows where the tick had no signal


def _expected_row(origin: str, shown: dict[str, Any]) -> list[str]:
    """A card's row as the page must show `/status`'s numbers."""
    rate, p95, score = shown["error_rate_pct"], shown["p95_ms"], shown["score"]
    return [origin, f"{shown['weight']} %",
            NONE if rate is None else f"{rate:.1f} %",
            NONE if p95 is None else f"{p95} ms",
            NONE if score is None else f"{score:.2f}"]


def _watch(page: Page, errors: list[str]) -> None:
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))


async def test_pop_cards_health_chart_and_ramp_panel(tmp_path: Path) -> None:
    require_chromium()
    errors: list[str] = []
    async with running_fleet(tmp_path) as fleet, chromium() as browser:
        admin = fleet.service.admin
        assert admin is not None
        # a step every 4 s: the standby's ramp lasts long enough to be looked at
        path = fleet.service.config.desired_path
        path.write_text(path.read_text().replace("  interval: 1s\n  window: 3s",
                                                 "  interval: 4s\n  window: 4s", 1))
        await eventually(lambda: len(fleet.records("config_applied")) >= 2, 10, "4 s steps")
        fleet.origins["primary"].set_fault(Fault(error_rate=0.6, status=503, pops=("ewr",)))
        [start] = await eventually(lambda: fleet.records("ramp_start", pop="ewr"), 60,
                                   "the standby's ramp in ewr")
        context = await browser.new_context(viewport={"width": 1400, "height": 1100})
        page = await context.new_page()
        _watch(page, errors)

        # the ramp panel, in words (while the standby ramps)
        await page.goto(f"{admin.url}/dashboard/#/pop/ewr/group/shop?range=15m")
        panel = page.locator('section[data-controller="Failover ramp"] .ramp[data-origin='
                             '"secondary"] .ramp-sentence')
        await expect(panel).to_contain_text("secondary ramps: stage", timeout=10_000)
        sentence = (await panel.text_content() or "").strip()
        await page.screenshot(path=str(tmp_path / "ramp-panel.png"), full_page=True)
        found = SENTENCE.match(sentence)
        assert found is not None, sentence
        stage, stages, share, _, since, why, seq = found.groups()
        assert int(stages) == len(SCHEDULE) and int(share) == SCHEDULE[int(stage) - 1], sentence
        assert since == start["time"][11:19], (sentence, start)
        ramps = {r["seq"]: r for r in fleet.records(pop="ewr") if r["kind"].startswith("ramp_")}
        record = ramps[int(seq)]  # the record it links to says why, with the stage it names
        assert record["rule"] == why, (record, sentence)
        assert record["detail"]["state"]["ramps"]["secondary"] == int(stage) - 1, record

        # the health chart: the failing primary's negative scores drawn below its 0 line
        chart = page.locator("svg.chart.health")
        low = chart.locator('circle[data-origin="primary"]')
        await expect(low.first).to_be_visible()
        drawn = await chart.evaluate("""svg => {
            const zero = Number(svg.querySelector("line.zero").getAttribute("y1"));
            return [zero, [...svg.querySelectorAll('circle[data-origin="primary"]')].map(
                c => [Number(c.dataset.score), Number(c.getAttribute("cy"))])];
        }""")
        zero, points = drawn
        negative = [(score, cy) for score, cy in points if score < 0]
        assert negative, points
        assert all(cy > zero for _, cy in negative), drawn
        assert all(cy <= zero for score, cy in points if score >= 0), drawn
        await chart.screenshot(path=str(tmp_path / "health-chart.png"))

        # the ewr card: /status's numbers of the same tick (the page refreshes every few s)
        await page.goto(f"{admin.url}/dashboard/")
        table = page.locator('article.pop[data-pop="ewr"] table.origins[data-group="shop"]')
        await expect(table).to_be_visible(timeout=10_000)
        ticks: dict[str, dict[str, Any]] = {}

        async def same_tick() -> dict[str, Any] | None:
            shown = (await asyncio.to_thread(_get, f"{admin.url}/status"))["origins"]
            reading = shown["ewr"]["shop"]
            ticks[str(reading["read_at_ms"])] = reading
            return ticks.get(await table.get_attribute("data-read-at") or "")

        reading = await eventually(same_tick, 20, "the card and /status on the same tick",
                                   interval=0.2)
        for origin, numbers in reading["origins"].items():
            cells = await table.locator(f'tr[data-origin="{origin}"] td').all_text_contents()
            assert cells == _expected_row(origin, numbers), (cells, numbers)
        primary = reading["origins"]["primary"]
        assert primary["score"] < 0 and primary["error_rate_pct"] > 20, primary
        await expect(table.locator('tr[data-origin="primary"] td.score.negative')).to_have_text(
            f"{primary['score']:.2f}")
        await page.locator('article.pop[data-pop="ewr"]').screenshot(
            path=str(tmp_path / "pop-card.png"))
        await context.close()
    assert not errors, errors


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    if etcd_binary() is None or shutil.which("etcdctl") is None:
        pytest.skip("etcd and etcdctl needed")
    server = EtcdServer().start()
    yield server
    server.cleanup()


@pytest.mark.etcd
async def test_the_rollout_panel_shows_each_replicas_acks(etcd: EtcdServer,
                                                          tmp_path: Path) -> None:
    require_chromium()
    errors: list[str] = []
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(_free_ports()))
    async with replica(etcd, tmp_path, "a", desired, admin=True) as a:
        await eventually(lambda: _leading(a), 10, "a leads")
        async with replica(etcd, tmp_path, "b", desired) as b, canary_envoy(b), \
                chromium() as browser:
            await eventually(lambda: a.server.acks.pop("ewr").applied == 1, 10,
                             "a counts b's Envoy of ewr")
            assert a.admin is not None
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            _watch(page, errors)
            await page.goto(f"{a.admin.url}/dashboard/")
            rows = page.locator("section.panel.rollout table.pop-versions")
            version = a.server.intent.desired.digest[:16]
            await expect(rows.locator('tr[data-pop="ewr"]:not(.replica)')).to_contain_text(
                f"ewr{version}100", timeout=10_000)
            via_b = rows.locator('tr.replica[data-pop="ewr"][data-replica="b"] td')
            await expect(via_b).to_have_text(["via b", version, "1", "0", "0"])
            via_a = rows.locator('tr.replica[data-pop="ewr"][data-replica="a"] td')
            await expect(via_a).to_have_text(["via a", version, "0", "0", "0"])
            await page.locator("section.panel.rollout").screenshot(
                path=str(tmp_path / "replica-acks.png"))
    assert not errors, errors
