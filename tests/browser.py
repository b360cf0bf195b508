"""Headless Chromium for the browser tests: the system's `chromium` (Debian's package),
driven by Playwright for Python. Playwright's own browser download is not used (it needs
the internet beyond the package registries).

Where no Chromium (or no Playwright) exists the tests that use `browser` skip with one
line saying how to get it, unless OVTRIO_REQUIRE_BROWSER is set (.ci/run sets it): then
they fail, so CI never passes with the browser tests skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

HOW_TO_GET = "no headless Chromium: apt-get install -y chromium && pip install -e '.[test]' (Playwright)"


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def launch_chromium(playwright: Any) -> Any:
    """Chromium launched the way every browser test launches it."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=list(CHROMIUM_ARGS))


def _unavailable() -> None:
    if os.environ.get("OVTRIO_REQUIRE_BROWSER"):
        pytest.fail(HOW_TO_GET + " (OVTRIO_REQUIRE_BROWSER is set)", pytrace=False)
    pytest.skip(HOW_TO_GET)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session; each test opens its own context."""
    if chromium_path() is None:
        _unavailable()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable()
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()
