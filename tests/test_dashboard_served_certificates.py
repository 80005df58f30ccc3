"""The dashboard's overview lists the certificates the TLS listeners serve, with their days to
expiry and a warning inside the warning window, in a real headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.envoy_process import free_port
from tests.support.browser import chromium, require_chromium
from tests.support.tls_listeners import TlsSite, tls_desired_yaml

pytestmark = [pytest.mark.chromium, pytest.mark.timeout(60)]


async def test_overview_shows_served_certificates_days_to_expiry(tmp_path: Path) -> None:
    require_chromium()
    site = TlsSite(tmp_path / "certs")
    site.write("shop", "shop.test", not_after_days=60)
    site.write("media", "media.test", not_after_days=5)  # inside the 14-day window
    path = tmp_path / "desired.yaml"
    path.write_text(tls_desired_yaml(site, https_port=free_port(), listener_port=free_port(),
                                     primary_port=free_port(), secondary_port=free_port()))
    service = BallastService(ServiceConfig(
        desired_path=path, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False))
    await service.start()
    try:
        assert service.admin is not None
        async with chromium() as browser:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(f"{service.admin.url}/dashboard/")
            shop = page.locator('li.certificate[data-certificate="https/shop"]')
            media = page.locator('li.certificate[data-certificate="https/media"]')
            await expect(shop).to_contain_text("days to expiry", timeout=10_000)
            assert "59." in await shop.inner_text() or "60.0" in await shop.inner_text()
            await expect(shop).to_contain_text("shop.test in ewr")
            await expect(media).to_contain_text("within the 14-day warning window")
            assert await media.get_attribute("class") == "certificate expiring"
            assert errors == []
    finally:
        await service.stop()
