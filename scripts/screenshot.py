"""Screenshots of the playground for the README and docs: the real page of a real server (the
embedded model), in headless Chromium (Debian's `chromium`, driven by Playwright).

    python scripts/screenshot.py            # writes docs/playground.png and docs/playground-dark.png

Starts `python -m ovtrio serve` on a free port, asks the model one question in the
light theme, then shows the token view of the same reply in the dark theme with the
alternatives of one token on hover, and stops the server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
# The same flags as the browser tests (tests/browser.py).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
QUESTION = "Write a Python function that reverses a string."
SYSTEM = "You are a concise assistant. Use Markdown."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    base = f"http://127.0.0.1:{port}/"
    settings = {"system": SYSTEM, "temperature": "0", "max_tokens": "160", "seed": "", "stop": "", "extra": ""}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1360, "height": 860}, device_scale_factor=1)
            page = context.new_page()
            page.set_default_timeout(120_000)
            page.goto(base)
            page.evaluate(
                "s => localStorage.setItem('ovtrio.settings', JSON.stringify(s))",
                {**settings, "api": "chat", "logprobs": True, "top_logprobs": 5, "tokenView": False},
            )
            page.reload()
            page.wait_for_function("() => document.querySelector('#model').options.length > 0")
            page.fill("#prompt", QUESTION)
            page.press("#prompt", "Enter")
            page.wait_for_function("() => !document.body.classList.contains('running')")
            time.sleep(3.2)  # two refreshes of the server panel
            page.fill("#prompt", "Nice. Can it handle None as well?")
            page.mouse.move(5, 5)
            page.screenshot(path=str(args.out / "playground.png"))
            stored = page.evaluate("() => localStorage.getItem('ovtrio.conversations')")
            context.close()

            dark = browser.new_context(viewport={"width": 1360, "height": 860}, color_scheme="dark")
            page = dark.new_page()
            page.goto(base)
            page.evaluate(
                "([s, c]) => { localStorage.setItem('ovtrio.settings', JSON.stringify(s));"
                " localStorage.setItem('ovtrio.conversations', c); }",
                [{**settings, "api": "responses", "tokenView": True}, stored],
            )
            page.reload()
            page.wait_for_function("() => document.querySelector('#model').options.length > 0")
            time.sleep(1.7)
            tokens = page.locator(".tok")
            tokens.nth(min(9, tokens.count() - 1)).hover()
            page.screenshot(path=str(args.out / "playground-dark.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(json.dumps({"wrote": [str(args.out / "playground.png"), str(args.out / "playground-dark.png")]}))


if __name__ == "__main__":
    main()
