"""Debian's Chromium, headless, driven by Playwright (from PyPI; it never downloads a browser)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    if shutil.which(CHROMIUM) is None:
        pytest.skip("chromium not installed (deploy/ensure-test-services.sh installs it)")


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A launched headless Chromium."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()
