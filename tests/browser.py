"""A real browser for tests: Debian's headless Chromium driven by Playwright for Python,
and web pages served from an origin of their own.

Import the fixtures into a test module (`from browser import browser, page_server`)
and mark its tests `browser`. Playwright's own browser download is not used: the
system's `chromium` runs (`executable_path`). Where there is no Chromium or no
Playwright the tests skip with one line saying how to get them, except when
OVTRIO_REQUIRE_BROWSER is set (.ci/run sets it): then a missing browser fails them, so
CI cannot pass with the browser tests skipped.

Chromium resolves every name under `.test` to 127.0.0.1 (REBOUND_DOMAIN): a page at
http://anything.test:PORT/ is as a page would be whose own domain an attacker rebound to
the loopback address (DNS rebinding).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

REQUIRE_ENV = "OVTRIO_REQUIRE_BROWSER"
HOW_TO_GET = "no headless Chromium: apt-get install -y chromium && pip install playwright (the test extra)"
REBOUND_DOMAIN = "test"

CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # The tests keep several pages of one browser open at once: a page Chromium counts as
    # in the background gets no animation frames and slowed timers, and the playground
    # draws a streaming reply once a frame.
    "--disable-renderer-backgrounding",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    f"--host-resolver-rules=MAP *.{REBOUND_DOMAIN} 127.0.0.1",
)


def _missing() -> str | None:
    """Why there is no browser to run, or None."""
    if shutil.which("chromium") is None:
        return HOW_TO_GET
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return HOW_TO_GET
    return None


# One Playwright and one Chromium for the whole test process. Each module that imports
# the `browser` fixture gets a session fixture of its own, and a second Playwright started
# beside a running one fails ("Sync API inside the asyncio loop"): the modules share this
# one, and the last fixture to end closes it.
_shared: dict[str, Any] = {}


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless Chromium for the session (Playwright's sync Browser)."""
    reason = _missing()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set and there is {reason}")
        pytest.skip(reason)
    if not _shared:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        try:
            chromium = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=list(CHROMIUM_ARGS))
        except BaseException:
            playwright.stop()
            raise
        _shared.update(playwright=playwright, chromium=chromium, users=0)
    _shared["users"] += 1
    try:
        yield _shared["chromium"]
    finally:
        _shared["users"] -= 1
        if not _shared["users"]:
            try:
                _shared["chromium"].close()
            finally:
                _shared["playwright"].stop()
                _shared.clear()


# A microphone that is a fake device (a beep every second) which pages may use without
# the permission prompt a headless browser could never answer.
FAKE_MEDIA_ARGS = ("--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream")


@pytest.fixture(scope="session")
def media_browser(browser: Any) -> Iterator[Any]:
    """A second headless Chromium, on the session's Playwright, with a fake microphone."""
    chromium = _shared["playwright"].chromium.launch(
        executable_path=shutil.which("chromium"), args=[*CHROMIUM_ARGS, *FAKE_MEDIA_ARGS]
    )
    try:
        yield chromium
    finally:
        chromium.close()


class PageServer:
    """Static pages on 127.0.0.1:`port`, a web origin other than the server's."""

    def __init__(self, port: int, pages: Mapping[str, str]) -> None:
        body = dict(pages)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                page = body.get(self.path.split("?")[0], "<!doctype html><title>page</title>")
                data = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = port
        self._http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def url(self, host: str = "127.0.0.1", path: str = "/") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._http.shutdown()
        self._http.server_close()


def page_server_fixture(port: int, pages: Mapping[str, str] | None = None) -> Any:
    """A session fixture serving `pages` (path -> HTML; any other path gets an empty
    page) on 127.0.0.1:`port`."""

    @pytest.fixture(scope="session")
    def page_server() -> Iterator[PageServer]:
        with PageServer(port, pages or {}) as server:
            yield server

    return page_server


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser tab (its own context: no cookies or cache shared between tests)."""
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()
