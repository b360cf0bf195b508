"""Screenshots of the playground for the README and docs: the real page of a real server (the
embedded model), in headless Chromium (Debian's `chromium`, driven by Playwright).

    python scripts/screenshot.py     # docs/playground{,-dark,-phone,-phone-dark}.png

Starts `python -m ovtrio serve` on a free port. The embedded model is too small to write
code, math, a table and a tool call on demand, and reads no images, so the conversation
shown is imported (Import, as a user would) from a file this script writes, holding a
picture it draws; the page renders it as it renders any reply, beside the live server
panel. Shot at 1440x1120 and 390x844 (a phone: touch, the conversations in a drawer),
light and dark.
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


def picture() -> str:
    """A small drawn picture (a sunset over hills), as a data URL."""
    import base64
    import io

    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 200))
    draw = ImageDraw.Draw(image)
    for y in range(200):
        draw.line([(0, y), (320, y)], fill=(255 - y // 2, 140 - y // 3, 90 + y // 2))
    draw.ellipse([190, 50, 260, 120], fill=(255, 214, 102))
    draw.polygon([(0, 200), (0, 130), (90, 90), (170, 140), (250, 100), (320, 135), (320, 200)], fill=(46, 64, 87))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


REPLY = """The picture shows **hills at sunset**. Its colours, roughly:

| Part | Colour | Share |
|---|---|--:|
| Sky | orange to violet | 55 % |
| Hills | dark blue | 40 % |

The area under a curve $f$ between $a$ and $b$ is

$$A = \\int_a^b f(x)\\,dx \\approx \\sum_{i=0}^{n-1} f(x_i)\\,\\Delta x$$

```python
def area(f, a: float, b: float, n: int = 1000) -> float:
    dx = (b - a) / n  # the midpoint rule
    return sum(f(a + (i + 0.5) * dx) for i in range(n)) * dx
```
"""


def conversation(model: str) -> dict:
    def reply(content: str, **more) -> dict:
        return {
            "role": "assistant",
            "content": content,
            "stats": {"mode": "chat", "model": model, "finish": "stop"},
            **more,
        }

    now = int(time.time() * 1000)
    call = {"id": "call_1", "name": "get_current_time", "arguments": '{"timezone": "Europe/Paris"}'}
    messages = [
        {
            "role": "user",
            "content": "What is in this picture? And how would I compute the area under a curve?",
            "images": [picture()],
        },
        reply(REPLY),
        {"role": "user", "content": "What time is it in Paris?"},
        {**reply(""), "toolCalls": [call], "stats": {"mode": "chat", "model": model, "finish": "tool_calls"}},
        {
            "role": "tool",
            "toolCallId": "call_1",
            "name": "get_current_time",
            "content": '{"timezone": "Europe/Paris", "time": "2026-11-27 19:05:12"}',
        },
        reply("It is **19:05** in Paris."),
    ]
    return {"id": "c_screenshot", "title": "Hills at sunset", "created": now, "updated": now, "messages": messages}


def shoot(browser, base: str, out: Path, name: str, scheme: str, export: Path, phone: bool) -> None:
    options = {"viewport": {"width": 1440, "height": 1120}, "device_scale_factor": 1}
    if phone:
        options = {
            "viewport": {"width": 390, "height": 844},
            "device_scale_factor": 2,
            "is_mobile": True,
            "has_touch": True,
        }
    context = browser.new_context(color_scheme=scheme, **options)
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(base)
    page.evaluate("s => localStorage.setItem('ovtrio.settings', JSON.stringify(s))", SETTINGS)
    page.reload()
    page.wait_for_function("() => document.querySelector('#model').options.length > 0")
    page.set_input_files("#import-file", str(export))
    page.wait_for_selector(".conv.active[data-id='c_screenshot']", state="attached")
    page.locator(".msg.assistant .katex").first.wait_for()
    page.locator(".msg.assistant .hljs-keyword").first.wait_for()
    time.sleep(3.2)  # two refreshes of the server panel
    page.evaluate("document.querySelector('#toast').hidden = true")
    if not phone or scheme == "light":
        # From the top of the conversation (the picture, the table, the math); the dark
        # phone shows its end (the code, the tool call).
        page.evaluate("document.querySelector('#messages').scrollTop = 0")
    page.fill("#prompt", "Thanks! Can it handle a curve given as points?")
    page.mouse.move(5, 5)
    page.screenshot(path=str(out / name))
    context.close()


SETTINGS = {"api": "chat", "temperature": "0", "max_tokens": "40", "logprobs": True, "top_logprobs": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    base = f"http://127.0.0.1:{port}/"
    names = {
        ("light", False): "playground.png",
        ("dark", False): "playground-dark.png",
        ("light", True): "playground-phone.png",
        ("dark", True): "playground-phone-dark.png",
    }
    try:
        with urllib.request.urlopen(base + "v1/models") as answer:
            model = json.load(answer)["data"][0]["id"]
        export = args.out / ".screenshot-conversation.json"
        export.write_text(
            json.dumps(
                {"format": "ovtrio-playground-conversations", "version": 2, "conversations": [conversation(model)]}
            )
        )
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            for (scheme, phone), name in names.items():
                shoot(browser, base, args.out, name, scheme, export, phone)
            browser.close()
        export.unlink()
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(json.dumps({"wrote": [str(args.out / name) for name in names.values()]}))


if __name__ == "__main__":
    main()
