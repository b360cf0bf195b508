"""The browser playground at `/`, driven in headless Chromium against real servers on
the embedded model (tests/browser.py launches the browser).

Every page a test opens is watched: a request to any other origin, an uncaught
exception or a console error fails the test (`Watched.check`). The one console error
allowed is the browser's own line about a refusal the page answers by asking again
without the refused field (DEGRADES_ON): `top_logprobs` (today's engine reports the
chosen token only), or a `previous_response_id` the server no longer has.

Nothing here asserts what the model writes: replies are forced through the API
(max_tokens with ignore_eos, a JSON schema's enum) or compared with themselves.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

import loopback
from browser import browser  # noqa: F401 (the fixture)
from conftest import MODEL, RunningServer
from in_process import in_process_server

API_KEY = "pg-key-7f3a"
# What a browser asks `/` for: the page (other clients get Ollama's answer, "Ollama is running").
BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
# The page and its key are the HTTP layer's: these two serve in process over the fake engine.
keyed_playground_server = in_process_server("keyed_playground_server", "--api-key", API_KEY)
no_playground_server = in_process_server("no_playground_server", "--no-playground", "--api-key", API_KEY)

STATIC = Path(__file__).resolve().parents[1] / "ovtrio" / "playground" / "static"
MODES = ("chat", "responses", "socket")
# A flag that any of these would set if it ran.
HOSTILE = (
    "<img src=x onerror=window.pwned=1> <script>window.pwned=1</script> "
    "[click](javascript:window.pwned=1) <a href=javascript:window.pwned=1>a</a> "
    "<svg onload=window.pwned=1></svg>"
)
# Refusals the page answers by asking again without the field: alternatives the server
# cannot give, a previous response it no longer has.
DEGRADES_ON = ("top_logprobs", "previous_response_id")
DONE = 60_000  # ms a reply may take on a loaded 2-core machine


# ---- the page, watched ---------------------------------------------------------------


@dataclass
class Watched:
    page: Any
    origin: str
    foreign: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    expected_refusals: int = 0
    sent: list[dict] = field(default_factory=list)  # request bodies and WebSocket frames, in order

    def check(self, allow_refused_key: bool = False) -> None:
        assert not self.foreign, f"requests left the page's origin: {self.foreign}"
        assert not self.page_errors, f"uncaught errors: {self.page_errors}"
        errors = [e for e in self.console_errors if not (allow_refused_key and _about_a_refused_key(e))]
        loads = [
            e for e in errors if re.match(r"Failed to load resource: the server responded with a status of 40[04]", e)
        ]
        assert len(loads) <= self.expected_refusals and len(errors) == len(loads), f"console errors: {errors}"


def _about_a_refused_key(message: str) -> bool:
    return "status of 401" in message or ("WebSocket connection" in message and "401" in message)


def _same_origin(url: str, origin: str) -> bool:
    ws_origin = origin.replace("http://", "ws://", 1)
    return any(url == o or url.startswith(o + "/") for o in (origin, ws_origin)) or url.startswith("blob:" + origin)


def open_page(browser, server: RunningServer, setup=None, **context_options) -> Watched:
    """A watched page of `server`'s playground; `setup(page)` runs before it loads (routes,
    init scripts)."""
    context_options.setdefault("viewport", {"width": 1280, "height": 860})
    context = browser.new_context(accept_downloads=True, **context_options)
    page = context.new_page()
    if setup is not None:
        setup(page)
    page.set_default_timeout(DONE)
    watched = Watched(page, server.base_url)

    def on_request(request) -> None:
        if not _same_origin(request.url, server.base_url) and not request.url.startswith("data:"):
            watched.foreign.append(request.url)
        if request.method == "POST" and request.post_data:
            try:
                watched.sent.append({"url": request.url, "body": json.loads(request.post_data)})
            except ValueError:
                pass

    def on_response(response) -> None:
        if response.status in (400, 404) and response.request.method == "POST":
            try:
                if response.json()["error"]["param"] in DEGRADES_ON:
                    watched.expected_refusals += 1
            except Exception:  # noqa: BLE001 (a body that is not an OpenAI error counts for nothing)
                pass

    def on_socket(socket) -> None:
        if not _same_origin(socket.url, server.base_url):
            watched.foreign.append(socket.url)
        socket.on("framesent", lambda payload: watched.sent.append({"url": socket.url, "body": json.loads(payload)}))

    page.on("request", on_request)
    page.on("response", on_response)
    page.on("websocket", on_socket)
    page.on("console", lambda message: message.type == "error" and watched.console_errors.append(message.text))
    page.on("pageerror", lambda error: watched.page_errors.append(str(error)))
    page.goto(server.base_url + "/")
    page.wait_for_selector("html[data-ready]")
    return watched


@contextmanager
def ready_page(browser, server: RunningServer) -> Iterator[Watched]:
    """A page of `server` once it lists its models; checked for page errors, then closed."""
    watched = open_page(browser, server)
    page_ready(watched.page)
    try:
        yield watched
        watched.check()
    finally:
        watched.page.context.close()


@pytest.fixture
def watched(browser, server):
    with ready_page(browser, server) as page:
        yield page


def page_ready(page) -> None:
    page.wait_for_function("() => document.querySelector('#model').options.length > 0")


def configure(page, **values: Any) -> None:
    """Fill settings fields (`max_tokens=8`, `extra={...}`) in the settings panel."""
    page.click("#settings-toggle")
    for name, value in values.items():
        if isinstance(value, bool):
            page.set_checked("#s-" + name.replace("_", "-"), value)
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        field = "#s-" + name.replace("_", "-")
        if page.locator(field).evaluate("e => e.tagName") == "SELECT":
            page.select_option(field, text)
        else:
            page.fill(field, text)
    page.click("#close-settings")


def choose_mode(page, mode: str) -> None:
    page.click(f"#api-mode [data-mode={mode}]")


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_for_reply(page) -> None:
    page.wait_for_function("() => !document.body.classList.contains('running')")
    page.wait_for_selector("#send:not([hidden])")


# Every conversation the page keeps (IndexedDB, one record each; its images, kept apart once
# each, put back in), and a way to change one.
STORED = """async () => {
    const db = await new Promise((ok, fail) => {
        const open = indexedDB.open('ovtrio-playground');
        open.onsuccess = () => ok(open.result);
        open.onerror = () => fail(open.error);
    });
    const get = (store, what) => new Promise((ok, fail) => {
        const read = db.transaction(store).objectStore(store)[what]();
        read.onsuccess = () => ok(read.result);
        read.onerror = () => fail(read.error);
    });
    const all = await get('conversations', 'getAll');
    const keys = await get('images', 'getAllKeys');
    const values = await get('images', 'getAll');
    db.close();
    // Images are kept apart, once each, and named in the conversation ("idb:<key>").
    const images = new Map(keys.map((key, i) => [key, values[i]]));
    const resolve = (messages) => {
        for (const m of messages) {
            if (m.images) m.images = m.images.map((ref) => ref.startsWith('idb:') ? images.get(ref.slice(4)) : ref);
            for (const tail of m.versions || []) if (tail) resolve(tail);
        }
    };
    for (const c of all) resolve(c.messages);
    return all;
}"""
STORE = """async (record) => {
    const db = await new Promise((ok, fail) => {
        const open = indexedDB.open('ovtrio-playground');
        open.onsuccess = () => ok(open.result);
        open.onerror = () => fail(open.error);
    });
    await new Promise((ok, fail) => {
        const tx = db.transaction('conversations', 'readwrite');
        tx.objectStore('conversations').put(record);
        tx.oncomplete = ok;
        tx.onerror = () => fail(tx.error);
    });
    db.close();
}"""


def stored(page) -> list[dict]:
    """The conversations as the page keeps them, once its writes are done."""
    page.wait_for_function("() => !document.documentElement.dataset.writing")
    return page.evaluate(STORED)


def conversation(page) -> dict:
    """The open conversation as the page keeps it."""
    current = page.evaluate("document.querySelector('.conv.active')?.dataset.id")
    return next((c for c in stored(page) if c["id"] == current), None)


def last_reply(page) -> dict:
    return conversation(page)["messages"][-1]


def shown_messages(page) -> list[str]:
    """What the page shows of each message: its text, and the reply's figures."""
    return page.locator(".msg .bubble, .msg .content, .msg .stats").all_inner_texts()


def forced(tokens: int) -> dict:
    """Settings that make the model write exactly `tokens` tokens."""
    return {"max_tokens": tokens, "extra": {"ignore_eos": True}}


# ---- served by the app ------------------------------------------------------------------


def test_the_page_and_its_files_are_served_with_a_policy_for_its_own_origin_only(server):
    files = [path for path in STATIC.rglob("*") if path.is_file()]
    own = sum(path.stat().st_size for path in files if "vendor" not in path.parts)
    assert own <= 176 * 1024, f"the playground's own files weigh {own} bytes"
    # The libraries it loads when a reply needs them, each with its license.
    vendor = STATIC / "vendor"
    assert sum(path.stat().st_size for path in vendor.rglob("*") if path.is_file()) <= 2600 * 1024
    assert {path.parent.name for path in vendor.glob("*/LICENSE")} == {"highlight", "katex", "pdfjs"}
    for path in files:
        relative = path.relative_to(STATIC).as_posix()
        url = server.base_url + ("/" if relative == "index.html" else "/playground/" + relative)
        answer = loopback.get(url, headers=BROWSER)
        assert answer.status_code == 200, url
        assert answer.content == path.read_bytes()
        policy = answer.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self';" in policy and "connect-src 'self';" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
    page = (STATIC / "index.html").read_text()
    # No inline script or style, and nothing from another origin.
    assert "<script>" not in page and "<style" not in page and " style=" not in page and "http" not in page
    etag = loopback.get(server.base_url + "/", headers=BROWSER).headers["etag"]
    again = loopback.get(server.base_url + "/", headers={**BROWSER, "If-None-Match": etag})
    assert again.status_code == 304
    missing = loopback.get(server.base_url + "/playground/js/missing.js")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}


def test_every_file_of_the_page_ships_in_the_wheel():
    import fnmatch
    import tomllib

    config = tomllib.loads((STATIC.parents[2] / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["ovtrio.playground"]
    for path in STATIC.rglob("*"):
        if path.is_file():
            relative = path.relative_to(STATIC.parent).as_posix()
            assert any(
                fnmatch.fnmatch(relative, pattern) and relative.count("/") == pattern.count("/") for pattern in patterns
            ), relative


def test_the_page_needs_no_key_but_the_api_does(keyed_playground_server):
    base = keyed_playground_server.base_url
    assert loopback.get(base + "/", headers=BROWSER).status_code == 200
    assert loopback.get(base + "/").text == "Ollama is running"  # what Ollama's clients probe, open too
    assert loopback.get(base + "/playground/js/app.js").status_code == 200
    assert loopback.get(base + "/playground/js/nothing.js").status_code == 401
    assert loopback.get(base + "/v1/models").status_code == 401


def test_hypercorn_serves_the_page_too(hypercorn_server):
    answer = loopback.get(hypercorn_server.base_url + "/", headers=BROWSER)
    assert answer.status_code == 200 and answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert answer.content == (STATIC / "index.html").read_bytes()


def test_no_playground_leaves_the_root_to_the_probe(no_playground_server):
    base = no_playground_server.base_url
    keyed = {"Authorization": f"Bearer {API_KEY}"}
    missing = loopback.get(base + "/playground/js/app.js", headers=keyed)
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    # `/` answers as Ollama does, to a browser too: there is no page.
    for accept in ("text/html", "*/*"):
        probe = loopback.get(base + "/", headers={**keyed, "Accept": accept})
        assert probe.status_code == 200 and probe.text == "Ollama is running"
    # Without the page, its paths are not open either; the probe is, as /health is.
    assert loopback.get(base + "/playground/js/app.js").status_code == 401
    assert loopback.get(base + "/").text == "Ollama is running"


async def test_a_browser_websocket_offers_the_key_as_a_subprotocol(keyed_playground_server):
    url = keyed_playground_server.base_url.replace("http://", "ws://") + "/v1/responses"
    async with open_websocket_url(url, subprotocols=["responses", "openai-insecure-api-key." + API_KEY]) as ws:
        assert ws.subprotocol == "responses"  # never the one carrying the key
        await ws.send_message(
            json.dumps({"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 2})
        )
        with trio.fail_after(60):
            while json.loads(await ws.get_message())["type"] not in ("response.completed", "response.incomplete"):
                pass
    for offered in (["responses", "openai-insecure-api-key.wrong"], ["responses"]):
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(url, subprotocols=offered):
                pass
        assert refused.value.status_code == 401


# ---- in the browser ------------------------------------------------------------------------

browser_test = pytest.mark.browser


# A page of the playground's origin that loads one of its modules and marks itself
# ready: what any page costs the browser on this machine now (Playwright answers it).
BASELINE_PAGE = (
    '<!doctype html><script type="module">import "/playground/js/dom.js"; performance.mark("baseline-ready");</script>'
)


@browser_test
def test_the_text_box_takes_input_soon_after_navigation(browser, server):
    """Measured in the browser, from navigation start to the page's `playground-ready`
    mark (set once its handlers are installed), against the same for a page of the same
    origin that loads one module and marks itself ready, in turn: the best of three
    fresh pages of each, after one first page that pays for the browser's own start.
    A ratio, so that the other work on a loaded machine, which slows both, does not
    decide it (idle, the playground was ready in about 100-200 ms)."""
    open_page(browser, server).page.context.close()
    times, baselines = [], []
    for _ in range(3):
        watched = open_page(browser, server)
        page = watched.page
        times.append(page.evaluate("performance.getEntriesByName('playground-ready')[0].startTime"))
        page.fill("#prompt", "typed")
        assert page.input_value("#prompt") == "typed"
        watched.check()
        page.context.close()
        context = browser.new_context()
        page = context.new_page()
        page.route(
            server.base_url + "/baseline", lambda route: route.fulfill(body=BASELINE_PAGE, content_type="text/html")
        )
        page.goto(server.base_url + "/baseline")
        page.wait_for_function("performance.getEntriesByName('baseline-ready').length > 0")
        baselines.append(page.evaluate("performance.getEntriesByName('baseline-ready')[0].startTime"))
        context.close()
    assert min(times) < 8 * min(baselines), f"the page was ready {times} ms after navigation; a bare page {baselines}"


@browser_test
def test_the_model_list_holds_the_models_that_chat_only(watched, server):
    """/v1/models lists the embedder too (its card's kind says so): it is not offered."""
    kinds = {card["id"]: card["kind"] for card in loopback.get(server.v1 + "/models").json()["data"]}
    assert "embedding" in kinds.values()
    options = watched.page.eval_on_selector_all("#model option", "options => options.map((o) => o.value)")
    assert options == [name for name, kind in kinds.items() if kind == "generation"]


def test_a_reply_streams_into_the_page(watched):
    page = watched.page
    # Long enough to span several frames on a machine whose two cores the engine keeps
    # busy (the page renders at most once a frame, and a starved browser draws few).
    configure(page, **forced(200))
    page.evaluate(
        """() => {
        window.__renders = [];
        new MutationObserver(() => {
            const reply = document.querySelector('.msg.assistant.streaming .content');
            if (reply) window.__renders.push(reply.textContent.length);
        }).observe(document.querySelector('#messages'), {childList: true, subtree: true, characterData: true});
    }"""
    )
    send(page, "Count to one hundred.")
    wait_for_reply(page)
    renders = page.evaluate("window.__renders")
    final = len(page.text_content(".msg.assistant .content"))
    partial = {length for length in renders if 0 < length < final}
    # At least one frame drawn mid-stream: a page that drew only at the end fails here.
    assert partial, f"renders while streaming: {renders} (final length {final})"
    reply = last_reply(page)
    assert reply["stats"]["completion"] == 200 and reply["stats"]["ttft"] > 0 and reply["stats"]["tps"] > 0
    assert page.locator(".msg.assistant .stats").inner_text().count("200") >= 1


@browser_test
@pytest.mark.parametrize(("mode", "how"), [("chat", "button"), ("responses", "escape"), ("socket", "button")])
def test_stop_cancels_the_request_on_the_server(watched, server, mode, how):
    page = watched.page
    choose_mode(page, mode)
    configure(page, **forced(4000))
    send(page, "Write a very long story.")
    page.wait_for_function("() => document.querySelector('.msg.assistant.streaming .content')?.textContent.length > 10")
    assert server.metric("ovtrio_requests_running", model_name=MODEL) >= 1
    generated = server.metric("ovtrio_generated_tokens_total", model_name=MODEL)
    if how == "button":
        page.click("#stop")
    else:
        page.keyboard.press("Escape")
    # The server's own count: what it generated after Stop, a few tokens while the
    # cancel reaches it (however slow the machine), not the ~4000 left of the request.
    give_up = time.monotonic() + 600  # a cap for a request that never ends
    while server.metric("ovtrio_requests_running", model_name=MODEL) > 0:
        assert time.monotonic() < give_up, "the server still runs the request 10 minutes after Stop"
        time.sleep(0.05)
    after_stop = server.metric("ovtrio_generated_tokens_total", model_name=MODEL) - generated
    assert after_stop < 400, f"the server generated {after_stop:.0f} tokens after Stop"
    wait_for_reply(page)
    reply = last_reply(page)
    assert reply["stats"]["finish"] == "stopped" and reply["content"]
    assert reply["stats"]["completion"] < 4000


@browser_test
@pytest.mark.parametrize("mode", MODES)
def test_each_api_mode_answers_and_responses_chain(watched, mode):
    page = watched.page
    choose_mode(page, mode)
    configure(page, **forced(6))
    send(page, "Hello there.")
    wait_for_reply(page)
    first = last_reply(page)
    assert first["stats"]["mode"] == mode and first["stats"]["completion"] == 6 and "error" not in first
    sent_first = watched.sent[-1]
    expected_url = "/v1/chat/completions" if mode == "chat" else "/v1/responses"
    assert sent_first["url"].endswith(expected_url)
    if mode == "socket":
        assert sent_first["url"].startswith("ws://") and sent_first["body"]["type"] == "response.create"
    send(page, "And again.")
    wait_for_reply(page)
    second = last_reply(page)
    assert second["stats"]["completion"] == 6 and "error" not in second
    body = watched.sent[-1]["body"]
    if mode == "chat":
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
        assert body["messages"][1]["content"] == first["content"]
    else:
        assert first["responseId"].startswith("resp")
        assert body["previous_response_id"] == first["responseId"]
        assert body["input"] == [{"role": "user", "content": "And again."}]
        assert second["responseId"] != first["responseId"]


@browser_test
def test_a_forgotten_previous_response_is_replaced_by_the_whole_conversation(watched):
    page = watched.page
    choose_mode(page, "responses")
    configure(page, **forced(4))
    send(page, "Remember this.")
    wait_for_reply(page)
    first = last_reply(page)
    record = conversation(page)
    record["messages"][1]["responseId"] = "resp_forgotten"
    page.evaluate(STORE, record)
    page.reload()
    page_ready(page)
    send(page, "What was it?")
    wait_for_reply(page)
    chained, whole = watched.sent[-2]["body"], watched.sent[-1]["body"]
    assert chained["previous_response_id"] == "resp_forgotten"
    assert "previous_response_id" not in whole
    assert whole["input"] == [
        {"role": "user", "content": "Remember this."},
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "What was it?"},
    ]
    reply = last_reply(page)
    assert "error" not in reply and reply["stats"]["completion"] == 4


@browser_test
def test_hostile_text_from_the_user_and_the_model_stays_inert(watched):
    page = watched.page
    # The model is made to write the payload: a JSON schema whose only value it is.
    schema = {"type": "string", "enum": [HOSTILE]}
    configure(
        page,
        max_tokens=300,
        extra={"response_format": {"type": "json_schema", "json_schema": {"name": "payload", "schema": schema}}},
    )
    send(page, HOSTILE)
    wait_for_reply(page)
    reply = last_reply(page)
    assert "onerror=window.pwned=1" in reply["content"] and "javascript:" in reply["content"]
    messages = page.locator("#messages")
    assert messages.locator("img, script, svg, iframe, [onerror], [onload], a[href^='javascript']").count() == 0
    assert "onerror=window.pwned=1" in page.text_content(".msg.user .bubble")
    assert "onerror=window.pwned=1" in page.text_content(".msg.assistant .content")
    for element in messages.locator("a, .link-refused").all():
        element.click(modifiers=["Alt"])  # no navigation away: an inert span, or a new tab
    page.mouse.move(10, 10)
    assert page.evaluate("window.pwned") is None
    # Rendered again from storage: still inert.
    page.reload()
    page.wait_for_selector("html[data-ready]")
    assert page.locator("#messages img, #messages script").count() == 0
    assert page.evaluate("window.pwned") is None


@browser_test
def test_the_markdown_renderer_builds_safe_nodes(watched):
    """Renderer only: the page's request is answered by a recorded stream, so the reply
    holds every construct at once."""
    page = watched.page
    reply = (
        "# Title\n\nSome **bold**, *em*, `code` and a [link](https://example.org/x).\n\n"
        "```python\nprint('<b>hi</b>')\n```\n\n- one\n- two\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n"
        "[bad](javascript:window.pwned=1) [data](data:text/html;base64,PHNjcmlwdD5wd25lZDwvc2NyaXB0Pg==) "
        "<img src=x onerror=window.pwned=1> <b onclick=window.pwned=1>bold?</b>"
    )
    chunks = [reply[i : i + 7] for i in range(0, len(reply), 7)]
    thinking = "".join(
        "data: "
        + json.dumps({"choices": [{"index": 0, "delta": {"reasoning_content": part}, "finish_reason": None}]})
        + "\n\n"
        for part in ("First, <b>think</b> ", "about it.")
    )
    body = thinking + "".join(
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]}) + "\n\n"
        for chunk in chunks
    )
    body += (
        "data: "
        + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + "\n\ndata: [DONE]\n\n"
    )
    page.route(
        "**/v1/chat/completions", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body)
    )
    send(page, "Show me everything.")
    wait_for_reply(page)
    reasoning = page.locator(".msg.assistant details.reasoning")
    assert reasoning.get_attribute("open") is None  # folded
    assert reasoning.locator(".reasoning-body").text_content() == "First, <b>think</b> about it."
    content = page.locator(".msg.assistant .content")
    assert content.locator("h3").inner_text() == "Title"
    assert content.locator("strong").first.inner_text() == "bold"
    assert content.locator(".code code").inner_text() == "print('<b>hi</b>')"
    assert content.locator(".code .code-copy").count() == 1
    assert content.locator("li").count() == 2 and content.locator("td").count() == 2
    links = content.locator("a")
    assert links.count() == 1
    assert links.get_attribute("href") == "https://example.org/x" and "noopener" in links.get_attribute("rel")
    assert content.locator(".link-refused").count() == 2
    assert content.locator("img, script, b, [onclick], [onerror]").count() == 0
    assert "<img src=x onerror=window.pwned=1>" in content.inner_text()
    for element in content.locator(".link-refused").all():
        element.click()
    assert page.evaluate("window.pwned") is None


@browser_test
def test_a_reload_keeps_the_conversation_and_export_then_import_gives_it_back(watched, tmp_path):
    page = watched.page
    configure(page, **forced(5))
    send(page, "First question")
    wait_for_reply(page)
    send(page, "Second question")
    wait_for_reply(page)
    before = conversation(page)
    shown = shown_messages(page)
    page.reload()
    page.wait_for_selector("html[data-ready]")
    assert conversation(page) == before
    assert shown_messages(page) == shown

    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "conversations.json"
    download.value.save_as(exported)
    document = json.loads(exported.read_text())
    assert [c["id"] for c in document["conversations"]] == [before["id"]]

    row = page.locator(f".conv[data-id='{before['id']}']")
    row.locator(".conv-delete").click()
    row.locator(".conv-delete").click()  # the second click confirms
    assert page.locator(f".conv[data-id='{before['id']}']").count() == 0
    assert "First question" not in page.inner_text("#messages")

    page.set_input_files("#import-file", str(exported))
    page.wait_for_selector(f".conv[data-id='{before['id']}'].active")
    assert conversation(page) == before
    assert shown_messages(page) == shown


@browser_test
def test_edit_and_regenerate_replace_the_turns_after_them(watched):
    page = watched.page
    configure(page, **forced(4))
    send(page, "Original question")
    wait_for_reply(page)
    send(page, "Follow-up")
    wait_for_reply(page)
    page.locator(".msg.user").first.hover()
    page.locator(".msg.user").first.get_by_role("button", name="Edit").click()
    page.fill(".edit-area", "Edited question")
    page.click("text=Save & send")
    wait_for_reply(page)
    messages = conversation(page)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == "Edited question"
    page.get_by_role("button", name="Regenerate").click()
    wait_for_reply(page)
    again = conversation(page)["messages"]
    assert len(again) == 2 and again[0]["content"] == "Edited question" and again[1]["stats"]["completion"] == 4


@browser_test
def test_token_view_colours_each_token_and_shows_alternatives_on_hover(watched):
    page = watched.page
    configure(page, top_logprobs=5, **forced(8))
    send(page, "Name a colour.")
    wait_for_reply(page)
    page.check("#token-view")
    tokens = page.locator(".msg.assistant .tokens .tok")
    assert tokens.count() == 8
    assert all(cls.startswith("tok p") for cls in tokens.evaluate_all("els => els.map(e => e.className)"))
    reply = last_reply(page)
    assert len(reply["tokens"]) == 8 and all(t["lp"] <= 0 for t in reply["tokens"])
    tokens.first.hover()
    tip = page.locator("#tip")
    assert tip.is_visible() and "%" in tip.inner_text()
    # The server scores the reply: five alternatives for every token, the chosen one among them
    # when it was the likeliest.
    assert all(len(t["top"]) == 5 for t in reply["tokens"])
    assert tip.locator("tr").count() == 5
    # Scored once it ended, the reply came whole (test_playground_ui: its time to first
    # token is still shown).
    assert "arrived whole" in page.locator(".msg.assistant .stats").last.inner_text()


@browser_test
@pytest.mark.parametrize("mode", MODES)
def test_copy_as_python_and_curl_repeat_the_exact_request(watched, server, mode):
    page = watched.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    choose_mode(page, mode)
    configure(page, temperature=0, seed=7, stop="\\n\\n", **forced(5))
    send(page, "Say something.")
    wait_for_reply(page)
    sent = watched.sent[-1]["body"]
    page.get_by_role("button", name="Copy as curl").click()
    curl = page.evaluate("navigator.clipboard.readText()")
    argv = shlex.split(curl.replace("\\\n", ""), comments=True)
    body = json.loads(argv[-1])
    if mode == "socket":
        sent = {k: v for k, v in sent.items() if k not in ("type", "stream_id")}
        assert body == {**sent, "stream": True}
    else:
        assert body == sent
        assert argv[:3] == ["curl", "-N", watched.sent[-1]["url"]] and argv[-2] == "-d"
    page.get_by_role("button", name="Copy as Python").click()
    script = page.evaluate("navigator.clipboard.readText()")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@browser_test
def test_the_server_panel_shows_live_load(watched, server):
    page = watched.page
    page.wait_for_function("() => document.querySelector('#panel-status').textContent === 'live'")
    configure(page, **forced(3000))
    send(page, "Go on for a while.")
    page.wait_for_function("() => document.querySelector('#m-running').textContent === '1'", timeout=20_000)
    assert float(page.text_content("#m-kv").split()[0]) > 0
    page.click("#stop")
    page.wait_for_function("() => document.querySelector('#m-running').textContent === '0'", timeout=20_000)


@browser_test
def test_with_an_api_key_the_page_asks_for_it_and_then_works(browser, keyed_playground_server):
    server = keyed_playground_server
    watched = open_page(browser, server)
    page = watched.page
    banner = page.locator("#key-banner")
    banner.wait_for()
    assert "needs an API key" in banner.inner_text()
    page.fill("#api-key", "not-the-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.querySelector('#key-message').textContent.includes('refused')")

    page.fill("#api-key", API_KEY)
    page.click("#key-form button[type=submit]")
    page_ready(page)
    assert not banner.is_visible()
    configure(page, **forced(4))
    for mode in MODES:
        choose_mode(page, mode)
        send(page, f"Hello over {mode}")
        wait_for_reply(page)
        reply = last_reply(page)
        assert "error" not in reply and reply["stats"]["completion"] == 4, reply
    # Not remembered unless asked: a reload asks again.
    assert page.evaluate("localStorage.getItem('ovtrio.apiKey')") is None
    page.reload()
    banner.wait_for()
    page.fill("#api-key", API_KEY)
    page.check("#remember-key")
    page.click("#key-form button[type=submit]")
    page_ready(page)
    assert page.evaluate("localStorage.getItem('ovtrio.apiKey')") == API_KEY
    page.reload()
    page_ready(page)
    assert not banner.is_visible()
    watched.check(allow_refused_key=True)
    page.context.close()


def test_the_response_format_is_off_and_says_why_when_the_server_cannot_constrain(browser, server):
    """A model card whose structured_output is unavailable (a server without XGrammar:
    tests/test_structured_output_availability.py) turns the response-format control off."""
    reason = "structured output needs XGrammar on this server (xgrammar is not installed): pip install xgrammar"

    def without_constraints(page) -> None:
        def answer(route) -> None:
            response = route.fetch()
            body = response.json()
            for card in body["data"]:
                card["structured_output"] = {"available": False, "reason": reason}
            route.fulfill(response=response, json=body)

        page.route("**/v1/models", answer)

    for setup, disabled in ((None, False), (without_constraints, True)):
        watched = open_page(browser, server, setup)
        try:
            page_ready(watched.page)
            control = watched.page.locator("#s-response-format")
            assert control.is_disabled() is disabled
            assert ("pip install" in (control.get_attribute("title") or "")) is disabled
        finally:
            watched.page.context.close()
