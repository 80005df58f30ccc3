"""Issue 23: the dashboard's rollout panel in a real headless Chromium, against three PoPs of real
Envoys (Ballast in-process, admin token required).

A change starts rolling out: the panel shows its waves with the canary's baking, the gate's
reading and each PoP's version; paused and aborted through the admin API, the page left open
follows without a reload (wave 1 aborted, the failed version named)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from playwright.async_api import expect

from harness.eventually import eventually
from harness.rollout_fleet import admin_post, rollout_fleet
from tests.support.browser import chromium, require_chromium

pytestmark = [pytest.mark.envoy, pytest.mark.chromium]

TOKEN = "rollout-dashboard-token-0123456789"
FOLLOW_MS = 5000  # the overview refreshes on each decision (1 s) and polls


async def test_the_rollout_panel_follows_a_rollout_live(tmp_path: Path) -> None:
    require_chromium()
    errors: list[str] = []
    async with rollout_fleet(tmp_path, admin_token=TOKEN) as fleet, chromium() as browser:
        assert fleet.service is not None and fleet.service.admin is not None
        url = fleet.service.admin.url
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})
        page = await context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(f"{url}/login")
        await page.locator('input[name="token"]').fill(TOKEN)
        await page.locator('button[type="submit"]').click()
        await page.wait_for_url(f"{url}/dashboard/")
        panel = page.locator("section.panel.rollout")
        await expect(panel).to_have_attribute("data-phase", "none", timeout=10_000)
        old = fleet.service.server.intent.desired.digest[:16]

        fleet.write(marker="dashboard-marker", bake="10m")
        # the version the canary got, as its record names it (the record is written before the
        # swap, so the running intent may still hold the old version at this moment)
        [started] = await eventually(lambda: fleet.records("wave_started"), 10, "the canary wave")
        new = started["config_version"]
        assert new != old
        await expect(panel).to_have_attribute("data-phase", "baking", timeout=FOLLOW_MS)
        await expect(panel.locator('li.wave.baking[data-wave="1"]')).to_contain_text("ewr")
        await expect(panel.locator('li.wave.pending[data-wave="2"]')).to_contain_text("sjc")
        await expect(panel.locator('li.wave.pending[data-wave="3"]')).to_contain_text("lax")
        await expect(panel.locator('table.pop-versions tr[data-pop="ewr"]')).to_contain_text(new)
        await expect(panel.locator('table.pop-versions tr[data-pop="sjc"]')).to_contain_text(old)
        # the gate's reading, taken while the canary bakes (shown at the next refresh)
        await eventually(lambda: fleet.service is not None
                         and fleet.service.rollouts.rollout is not None
                         and fleet.service.rollouts.rollout.gate is not None, 10, "a reading")
        await page.reload()
        await expect(panel.locator("details.gate summary")).to_contain_text("gate: ",
                                                                            timeout=FOLLOW_MS)
        await page.evaluate("window.sameDocument = true")

        status, _ = await asyncio.to_thread(admin_post, f"{url}/rollout/pause", TOKEN)
        assert status == 200
        await expect(panel).to_have_attribute("data-phase", "paused", timeout=FOLLOW_MS)
        await expect(panel.locator('li.wave.paused[data-wave="1"]')).to_be_visible()
        status, _ = await asyncio.to_thread(admin_post, f"{url}/rollout/abort", TOKEN)
        assert status == 200
        await expect(panel).to_have_attribute("data-phase", "aborted", timeout=FOLLOW_MS)
        await expect(panel.locator('li.wave.aborted[data-wave="1"]')).to_contain_text("ewr")
        await expect(panel.locator(".failed-version")).to_contain_text(new)
        await expect(panel.locator('table.pop-versions tr[data-pop="ewr"]')).to_contain_text(old)
        assert await page.evaluate("window.sameDocument") is True, "the page was reloaded"
        assert not errors, errors
