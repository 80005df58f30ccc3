"""Issue 36, break 2, with the attacker a real browser (Debian's Chromium, driven by Playwright).

The probe that filed it: signed in at `/login`, the operator's browser opens a page served from
another port of 127.0.0.1 that auto-submits `<form method=POST action=".../rollout/abort">`: the
rollout was paused and aborted ("by cookie via the admin API"). A browser sends its cookies to
every port of a host, and another port is the same *site*, so `SameSite=Strict` let them through.

Here a rollout is baking (Ballast in-process, admin token required); the operator signs in; the
attacker's page posts a form to `/rollout/abort` and a `fetch` (credentials included) to
`/rollout/pause`. Nothing changes: the rollout still bakes, no action is recorded, and the
browser was shown the 403 that refused it. The control: the dashboard's own Pause button, in the
same browser, pauses the rollout (recorded as the session's).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Dialog, expect

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.eventually import eventually
from tests.support.browser import chromium, require_chromium

pytestmark = pytest.mark.chromium

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "desired.yaml"
TOKEN = "csrf-browser-test-token-0123456789"
ACTIONS = ("rollout_paused", "rollout_resumed", "rollout_aborted", "rollout_promoted")
ATTACK = """<!doctype html><html><body>
<form id="abort" method="POST" action="{admin}/rollout/abort"></form>
<script>
fetch("{admin}/rollout/pause", {{method: "POST", mode: "no-cors", credentials: "include"}})
  .finally(() => document.getElementById("abort").submit());
</script></body></html>"""


@pytest.fixture
async def baking(tmp_path: Path) -> AsyncIterator[BallastService]:
    """A service whose change's canary (ewr) bakes for the default 5 minutes."""
    desired = tmp_path / "desired.yaml"
    shutil.copy(EXAMPLE, desired)
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, admin_token_file=token,
        reload_poll_s=0.1, rollout_poll_ms=100))
    await service.start()
    try:
        desired.write_text(desired.read_text().replace("connect_timeout: 300ms",
                                                       "connect_timeout: 301ms", 1))
        await eventually(lambda: phase(service) == "baking", 20, "the canary baking")
        yield service
    finally:
        await service.stop(0)


@pytest.fixture
async def attacker() -> AsyncIterator[tuple[web.AppRunner, list[str]]]:
    """A web server on another port of 127.0.0.1; its pages, for the test to fill in."""
    pages: list[str] = []

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=pages[-1], content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner, pages
    await runner.cleanup()


def phase(service: BallastService) -> str | None:
    current = service.rollouts.rollout
    return None if current is None else current.phase


def actions(service: BallastService) -> list[dict[str, Any]]:
    return [r for r in iter_records(service.config.state_dir) if r["kind"] in ACTIONS]


async def test_a_page_of_another_port_cannot_act_but_the_dashboard_can(
    baking: BallastService, attacker: tuple[web.AppRunner, list[str]],
) -> None:
    require_chromium()
    assert baking.admin is not None
    admin = baking.admin.url
    runner, pages = attacker
    attack_url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    pages.append(ATTACK.format(admin=admin))
    async with chromium() as browser:
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(f"{admin}/login")
        await page.locator('input[name="token"]').fill(TOKEN)
        await page.locator('button[type="submit"]').click()
        await page.wait_for_url(f"{admin}/dashboard/")
        assert any(c["name"] == "ballast_admin_session" for c in await context.cookies())
        # the attack: its form post ends on the admin API's refusal
        await page.goto(attack_url)
        await page.wait_for_url(f"{admin}/rollout/abort")
        await expect(page.locator("body")).to_contain_text("cross-site request refused")
        assert phase(baking) == "baking"
        assert actions(baking) == []

        # the control: the dashboard's own button, in the same browser
        page.on("dialog", _accept)
        await page.goto(f"{admin}/dashboard/")
        panel = page.locator("section.panel.rollout")
        await expect(panel).to_have_attribute("data-phase", "baking", timeout=10_000)
        await panel.locator('button[data-action="pause"]').click()
        await expect(panel).to_have_attribute("data-phase", "paused", timeout=10_000)
        [paused] = actions(baking)
        assert paused["kind"] == "rollout_paused"
        assert "session via the admin API" in json.dumps(paused)
        # signed out, the session opens nothing any more
        await page.locator("#sign-out").click()
        await page.wait_for_url(f"{admin}/login")
        response = await page.goto(f"{admin}/dashboard/api/overview")
        assert response is not None and response.status == 401


async def _accept(dialog: Dialog) -> None:
    """The dashboard asks before it acts; the operator says yes."""
    await dialog.accept()
