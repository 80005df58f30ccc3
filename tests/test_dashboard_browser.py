"""The on-call dashboard in a real headless Chromium (Debian's, driven by Playwright) against a
whole fleet on loopback: Ballast in-process (admin token required), real Envoys in PoPs ewr and
sjc, real origins.

Without the token, the page, its data and its stream are refused (401); signed in through the
admin API's /login form, the fleet shows with no console error and nothing fetched from elsewhere.

The primary origin starts failing for ewr only; the page, left open, must draw the move and list
the decisions within a few seconds, without a reload. Deep links open the right views in a fresh
page. With BALLAST_DASHBOARD_SCREENSHOT=path the group view is also saved there (the
screenshot in docs/operations.md comes from this test)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from harness.demo_origin import Fault
from harness.eventually import eventually
from harness.fleet import Fleet, running_fleet
from tests.support.browser import chromium, require_chromium

pytestmark = [pytest.mark.envoy, pytest.mark.chromium]

UPDATE_WITHIN_MS = 3000  # "within a few seconds": from the record in the log to the page
TOKEN = "dashboard-test-token-0123456789"


def _watch(page: Page, errors: list[str], requests: list[str]) -> None:
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))


async def _first_shift(fleet: Fleet) -> dict[str, object]:
    await eventually(lambda: bool(fleet.records("weight_shift", pop="ewr")), 45,
                         "ewr's first weight shift")
    return fleet.records("weight_shift", pop="ewr")[0]


async def test_dashboard_shows_the_fleet_and_follows_a_failover_live(tmp_path: Path) -> None:
    require_chromium()
    errors: list[str] = []
    requests: list[str] = []
    async with running_fleet(tmp_path, admin_token=TOKEN) as fleet, chromium() as browser:
        admin = fleet.service.admin
        assert admin is not None
        base = f"{admin.url}/dashboard/"
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})

        # Without the admin token the page, its data and its stream are refused.
        stranger = await context.new_page()
        refused = await stranger.goto(base)
        assert refused is not None and refused.status == 401
        assert await stranger.locator("article.pop").count() == 0
        for path in ("api/overview", "api/stream", "static/dashboard.js"):
            answer = await context.request.get(base + path)
            assert answer.status == 401, path
        wrong = await context.request.get(
            base + "api/overview", headers={"Authorization": "Bearer not-the-token-at-all"})
        assert wrong.status == 401
        await stranger.close()

        # With it: signed in through the admin API's form (a cookie), as an engineer would.
        page = await context.new_page()
        _watch(page, errors, requests)
        await page.goto(f"{admin.url}/login")
        await page.locator('input[name="token"]').fill(TOKEN)
        await page.locator('button[type="submit"]').click()
        await page.wait_for_url(base)

        # Fleet: both PoPs of the example, each with its Envoy, synced, and its version.
        for pop in ("ewr", "sjc"):
            node = page.locator(f'article.pop[data-pop="{pop}"] li.node[data-node="{pop}-edge-1"]')
            await expect(node).to_contain_text("SYNCED", timeout=10_000)
            await expect(node).to_contain_text("1.40.0")
        await expect(page.locator("#version code")).to_have_text(
            fleet.service.server.intent.desired.digest[:16])
        await expect(page.locator(".config.config_applied")).to_contain_text("config_applied")

        # Into ewr, then its group, by clicking: the page stays one document from here on.
        await page.evaluate("window.sameDocument = true")
        await page.locator('article.pop[data-pop="ewr"] h3 a').click()
        await expect(page.locator('table.nodes tr[data-node="ewr-edge-1"]')).to_contain_text(
            "SYNCED")
        await page.locator("table.groups a", has_text="shop").click()
        await expect(page.locator("main h1")).to_have_text("shop in ewr")
        await page.locator(".ranges a", has_text="15m").click()
        await expect(page.locator(".ranges a.on")).to_have_text("15m")
        await expect(page.locator("#live")).to_have_text("live")

        fleet.origins["primary"].set_fault(Fault(error_rate=0.6, status=503, pops=("ewr",)))
        shift = await _first_shift(fleet)
        seen_in_log = time.monotonic()
        marker = page.locator(f'.chart.weights .mark[data-seq="{shift["seq"]}"]')
        await expect(marker).to_have_count(1, timeout=UPDATE_WITHIN_MS)
        streamed = page.locator(f'#stream-list li[data-seq="{shift["seq"]}"]')
        await expect(streamed).to_contain_text("weight_shift", timeout=UPDATE_WITHIN_MS)
        assert time.monotonic() - seen_in_log < UPDATE_WITHIN_MS / 1000 + 0.5
        after = shift["weights_after"]
        assert isinstance(after, dict)
        await expect(page.locator('.legend strong[data-current="primary"]')).not_to_have_text(
            " 95%", timeout=UPDATE_WITHIN_MS)
        assert await page.evaluate("window.sameDocument") is True, "the page was reloaded"

        # The live panel filters on the server: sjc shows no ewr record, ewr's shifts only shifts.
        panel = page.locator("#stream-list li")
        await page.locator('#stream-filter select[name="pop"]').select_option("sjc")
        await expect(page.locator('#stream-list li[data-pop="sjc"]').first).to_be_visible()
        await expect(page.locator('#stream-list li[data-pop="ewr"]')).to_have_count(0)
        await page.locator('#stream-filter select[name="pop"]').select_option("ewr")
        await page.locator('#stream-filter select[name="kind"]').select_option("weight_shift")
        await expect(page.locator(f'#stream-list li[data-seq="{shift["seq"]}"]')).to_be_visible()
        kinds = await panel.evaluate_all("items => items.map(i => i.dataset.kind + i.dataset.pop)")
        assert kinds and set(kinds) == {"weight_shiftewr"}, kinds

        # Hover shows the rule, a click the whole record (rule, inputs, next) and a deep link.
        assert shift["rule"] in (await marker.locator("title").text_content() or "")
        await marker.locator(".mark-head").click()
        picked = page.locator("#picked .decision")
        await expect(picked).to_contain_text(str(shift["rule"]))
        await expect(picked.locator(".next")).to_contain_text("next:")
        await expect(picked.locator("details pre").first).to_contain_text('"scores"')
        assert f"seq={shift['seq']}" in page.url
        await eventually(lambda: len(fleet.records("weight_shift", pop="ewr")) >= 3, 30,
                             "a few more steps for the picture")
        await page.wait_for_timeout(1000)  # let the last refresh paint before the screenshot
        shot = tmp_path / "dashboard.png"
        await page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("BALLAST_DASHBOARD_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["BALLAST_DASHBOARD_SCREENSHOT"])

        # Deep links, each in a fresh page: a decision, a PoP, a group at a decision.
        fresh = await context.new_page()
        _watch(fresh, errors, requests)
        await fresh.goto(f"{base}#/decision/{shift['seq']}")
        await expect(fresh.locator("main h1")).to_have_text(f"Decision #{shift['seq']}")
        await expect(fresh.locator(".decision .rule")).to_contain_text(str(shift["rule"]))
        await fresh.goto(f"{base}#/pop/sjc")
        await expect(fresh.locator("main h1")).to_have_text("PoP sjc")
        await expect(fresh.locator('table.nodes tr[data-node="sjc-edge-1"]')).to_be_visible()
        await fresh.goto(f"{base}#/pop/ewr/group/shop?range=6h&seq={shift['seq']}")
        await expect(fresh.locator("main h1")).to_have_text("shop in ewr")
        await expect(fresh.locator(".ranges a.on")).to_have_text("6h")
        await expect(fresh.locator("#picked .decision")).to_contain_text(str(shift["rule"]))
        await context.close()

    assert errors == []
    assert requests and all(url.startswith(admin.url) for url in requests), (
        "the page fetched something from elsewhere")
