"""The browser playground's layout, storage and the ways it can lose or hide things,
driven in headless Chromium (tests/browser.py) against real servers on the embedded
model.

Where a test is about the page alone (how it lays out, keeps or shows a reply) the
server's answer is a recorded stream (`fake_chat`): the reply then holds exactly what
the test needs (code, math, a finish reason, token probabilities) whatever the model
would write. Where the server's part matters (tool calls, two streams at once, a reply
cut by a reload, an API key) the real server answers.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from browser import browser  # noqa: F401 (the fixture)
from test_playground import (
    API_KEY,
    DONE,
    configure,
    conversation,
    forced,
    keyed_playground_server,  # noqa: F401 (the fixture)
    last_reply,
    open_page,
    page_ready,
    send,
    stored,
    wait_for_reply,
)

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "data" / "vendor" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True, "device_scale_factor": 2}
FAKE_VLM = "fake-vlm"


# ---- a recorded server -----------------------------------------------------------------------


def sse(chunks: list[dict]) -> str:
    return "".join("data: " + json.dumps(chunk) + "\n\n" for chunk in chunks) + "data: [DONE]\n\n"


def chat_stream(text: str = "", finish: str = "stop", logprobs: bool = False, tool_calls: list | None = None) -> str:
    """A Chat Completions stream writing `text` in pieces of 6 characters."""
    chunks: list[dict] = []
    for i in range(0, len(text), 6):
        piece = text[i : i + 6]
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
        if logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": piece, "logprob": -0.1 * (i % 7), "top_logprobs": [{"token": piece, "logprob": -0.1}]}
                ]
            }
        chunks.append({"choices": [choice]})
    for k, call in enumerate(tool_calls or []):
        chunks.append(
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": k, **call}]}, "finish_reason": None}]}
        )
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": max(1, len(text) // 6)}})
    return sse(chunks)


class FakeChat:
    """Answers the page's /v1/chat/completions with `reply` (a stream body) and keeps the
    request bodies; optionally lists a model that reads images."""

    def __init__(self, reply: str, vlm: bool = False) -> None:
        self.reply = reply
        self.vlm = vlm
        self.bodies: list[dict] = []

    def __call__(self, page) -> None:
        def answer(route) -> None:
            self.bodies.append(json.loads(route.request.post_data))
            route.fulfill(status=200, content_type="text/event-stream", body=self.reply)

        page.route("**/v1/chat/completions", answer)
        if self.vlm:
            models = {
                "object": "list",
                "data": [{"id": FAKE_VLM, "object": "model", "input_modalities": ["text", "image"]}],
            }
            page.route("**/v1/models", lambda route: route.fulfill(status=200, json=models))


def watched_page(browser, server, fake: FakeChat | None = None, **options):
    watched = open_page(browser, server, setup=fake, **options)
    page_ready(watched.page)
    return watched


@pytest.fixture
def pages(browser, server):
    """Opens watched pages (`pages(fake, **context options)`), checks and closes them."""
    opened = []

    def open_one(fake: FakeChat | None = None, **options):
        watched = watched_page(browser, server, fake, **options)
        opened.append(watched)
        return watched

    yield open_one
    try:
        for watched in opened:
            watched.check()
    finally:
        for watched in opened:
            watched.page.context.close()


def box(page, selector: str) -> dict:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not shown"
    return found


def focused_inside(page, selector: str) -> bool:
    return page.evaluate(f"document.querySelector({json.dumps(selector)}).contains(document.activeElement)")


# ---- settings beside the chat ------------------------------------------------------------------


def test_settings_open_beside_the_chat_take_the_focus_and_close_on_escape(pages):
    page = pages(
        FakeChat(chat_stream("Hello there, a reply wide enough to reach the right side of the column.")),
        viewport=DESKTOP,
    ).page
    send(page, "Hello")
    wait_for_reply(page)
    page.click("#settings-toggle")
    assert focused_inside(page, "#settings")
    settings = box(page, "#settings")
    for covered in ("#send", ".msg.assistant", "#prompt"):
        shown = box(page, covered)
        assert shown["x"] + shown["width"] <= settings["x"] + 1, f"Settings cover {covered}"
    page.keyboard.press("Escape")
    assert page.is_hidden("#settings")
    assert page.evaluate("document.activeElement.id") == "settings-toggle"
    # Narrower, Settings cover the chat over a backdrop that closes them.
    page.set_viewport_size({"width": 1000, "height": 800})
    page.click("#settings-toggle")
    assert page.is_visible("#backdrop")
    page.mouse.click(100, 400)
    assert page.is_hidden("#settings") and page.is_hidden("#backdrop")


# ---- a phone -----------------------------------------------------------------------------------------


def test_a_phone_gets_the_conversations_the_server_panel_edit_token_taps_and_a_new_line(pages, tmp_path):
    fake = FakeChat(chat_stream("A short reply for a phone.", logprobs=True))
    watched = pages(fake, **PHONE)
    page = watched.page
    assert page.evaluate("matchMedia('(pointer: coarse)').matches")
    assert box(page, ".topbar")["height"] <= 100, "the top bar takes too much of the screen"

    # Enter adds a line; Send sends.
    page.fill("#prompt", "first line")
    page.press("#prompt", "Enter")
    page.keyboard.type("second line")
    assert page.input_value("#prompt") == "first line\nsecond line" and not fake.bodies
    page.tap("#send")
    wait_for_reply(page)
    assert fake.bodies[-1]["messages"][-1]["content"] == "first line\nsecond line"

    # Edit shows without hovering.
    edit = page.locator(".msg.user button", has_text="Edit")
    assert edit.is_visible() and float(edit.evaluate("e => getComputedStyle(e.closest('.actions')).opacity")) == 1

    # A tapped token shows its alternatives.
    page.tap("#token-view")
    page.locator(".msg.assistant .tokens .tok").nth(1).tap()
    assert page.is_visible("#tip") and "%" in page.inner_text("#tip")

    # The conversations, new chat, export, import and the server panel are a tap away.
    open_drawer(page)
    for control in ("#new-chat", "#search", "#export", "#import", ".panel"):
        shown = box(page, control)
        assert shown["x"] >= 0 and shown["x"] + shown["width"] <= 390, control
    first = page.locator(".conv").first.get_attribute("data-id")
    page.tap("#new-chat")
    page.wait_for_function("() => !document.querySelector('.app').classList.contains('sidebar-open')")
    send_on_phone(page, "another conversation")
    wait_for_reply(page)
    open_drawer(page)
    assert page.locator(".conv").count() == 2
    with page.expect_download() as download:
        page.tap("#export")
    exported = tmp_path / "phone.json"
    download.value.save_as(exported)
    assert len(json.loads(exported.read_text())["conversations"]) == 2
    row = page.locator(f".conv[data-id='{first}']")
    row.locator(".conv-delete").tap()
    row.locator(".conv-delete").tap()
    assert page.locator(f".conv[data-id='{first}']").count() == 0
    page.set_input_files("#import-file", str(exported))
    page.wait_for_selector(f".conv[data-id='{first}'].active", state="attached")
    # Opening a conversation closes the drawer; so does Esc.
    assert page.is_hidden("#backdrop")
    open_drawer(page)
    page.keyboard.press("Escape")
    assert page.is_hidden("#backdrop")


def open_drawer(page) -> None:
    page.tap("#menu-toggle")
    page.wait_for_function("() => document.querySelector('#sidebar').getBoundingClientRect().left >= 0")


def send_on_phone(page, text: str) -> None:
    page.fill("#prompt", text)
    page.tap("#send")


def test_the_token_legend_never_breaks_a_word_on_a_phone(pages):
    page = pages(FakeChat(chat_stream("Tokens to colour on a narrow screen.", logprobs=True)), **PHONE).page
    send_on_phone(page, "Hi")
    wait_for_reply(page)
    page.tap("#token-view")
    broken = page.evaluate(
        """() => {
        const broken = [];
        const walker = document.createTreeWalker(document.querySelector('.legend'), NodeFilter.SHOW_TEXT);
        for (let node; (node = walker.nextNode()); ) {
            for (const match of node.textContent.matchAll(/\\S+/g)) {
                const range = document.createRange();
                range.setStart(node, match.index);
                range.setEnd(node, match.index + match[0].length);
                const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
                if (lines.size > 1) broken.push(match[0]);
            }
        }
        return broken;
    }"""
    )
    assert broken == []


# ---- tool calls ------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize("mode", ["chat", "responses"])
def test_a_tool_call_is_shown_with_its_arguments_and_its_result_goes_back(pages, mode):
    watched = pages()
    page = watched.page
    page.click(f"#api-mode [data-mode={mode}]")
    configure(page, max_tokens=60, extra={"tools": [WEATHER], "tool_choice": "required"})
    send(page, "What is the weather in Paris?")
    wait_for_reply(page)
    call = page.locator(".msg.assistant .tool-call").first
    assert call.locator(".tool-name").inner_text() == "get_weather"
    arguments = json.loads(call.locator(".tool-args").inner_text())
    assert arguments["city"] in ("Paris", "Oslo")
    reply = last_reply(page)
    assert "error" not in reply, reply.get("error")
    assert (
        reply["toolCalls"][0]["name"] == "get_weather" and json.loads(reply["toolCalls"][0]["arguments"]) == arguments
    )

    call.locator(".tool-output").fill('{"temperature_c": 21}')
    configure(page, max_tokens=4, extra={"tools": [WEATHER]})
    page.click(".tool-calls button:text('Send the result')")
    wait_for_reply(page)
    assert "error" not in last_reply(page), last_reply(page).get("error")
    body = watched.sent[-1]["body"]
    call_id = reply["toolCalls"][0]["id"]
    # (The model may make more than one call: each gets a result, empty when not filled.)
    calls = len(reply["toolCalls"])
    if mode == "chat":
        assert body["messages"][-1 - calls]["tool_calls"][0]["id"] == call_id
        assert body["messages"][-calls] == {"role": "tool", "tool_call_id": call_id, "content": '{"temperature_c": 21}'}
    else:
        assert body["previous_response_id"] == reply["responseId"]
        assert len(body["input"]) == calls
        assert body["input"][0] == {
            "type": "function_call_output",
            "call_id": call_id,
            "output": '{"temperature_c": 21}',
        }
    assert page.locator(".msg.tool .tool-result").first.inner_text() == '{"temperature_c": 21}'


def test_the_demo_tool_runs_in_the_page(pages):
    watched = pages()
    page = watched.page
    configure(page, demo_tool=True, max_tokens=80, extra={"tool_choice": "required"})
    send(page, "What time is it in Paris?")
    wait_for_reply(page)
    assert watched.sent[-1]["body"]["tools"][0]["function"]["name"] == "get_current_time"
    call = page.locator(".msg.assistant .tool-call").first
    assert call.locator(".tool-name").inner_text() == "get_current_time"
    call.locator("button:text('Run the demo tool')").click()
    result = json.loads(call.locator(".tool-output").input_value())
    assert "time" in result or "error" in result


# ---- storage --------------------------------------------------------------------------------------


def big_image(megabytes: float) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + os.urandom(int(megabytes * 1024 * 1024))


def attach_file(page, tmp_path, data: bytes, name: str = "big.png") -> None:
    path = tmp_path / name
    path.write_bytes(data)
    page.set_input_files("#attach-file", str(path))


def titles(page) -> list[str]:
    return sorted(c["title"] for c in stored(page))


# The browser refusing one write as a full disk does (Chromium enforces its quota at
# commit time, which a test cannot bring about without filling the disk).
REFUSE_ONE_WRITE = """
const put = IDBObjectStore.prototype.put;
IDBObjectStore.prototype.put = function (value, ...rest) {
    if (value && value.title === "Too big now") {
        throw new DOMException("The quota has been exceeded.", "QuotaExceededError");
    }
    return put.call(this, value, ...rest);
};
"""


# The records as they are stored: conversations, and the keys of the images kept apart.
RAW = """async () => {
    const db = await new Promise((ok) => {
        const open = indexedDB.open('ovtrio-playground');
        open.onsuccess = () => ok(open.result);
    });
    const get = (store, what) => new Promise((ok) => {
        const read = db.transaction(store).objectStore(store)[what]();
        read.onsuccess = () => ok(read.result);
    });
    const out = {conversations: await get('conversations', 'getAll'), images: await get('images', 'getAllKeys')};
    db.close();
    return out;
}"""


def test_a_conversation_too_big_for_the_old_storage_is_kept_and_a_full_disk_loses_only_its_change(pages, tmp_path):
    fake = FakeChat(chat_stream("Seen."), vlm=True)

    def setup(page) -> None:
        fake(page)
        page.add_init_script(REFUSE_ONE_WRITE)

    watched = pages(setup)
    page = watched.page
    attach_file(page, tmp_path, big_image(6))
    page.wait_for_selector("#pending-images img.thumb")
    send(page, "A big picture")
    page.wait_for_selector(".msg.assistant")
    wait_for_reply(page)
    page.click("#new-chat")
    send(page, "Just text")
    wait_for_reply(page)
    page.wait_for_function("() => !document.documentElement.dataset.writing")
    page.reload()
    page_ready(page)
    assert page.locator(".conv").count() == 2, "a conversation was lost"
    assert titles(page) == ["A big picture", "Just text"]
    assert sorted(page.locator(".conv-name").all_inner_texts()) == ["A big picture", "Just text"]
    kept = next(c for c in stored(page) if c["title"] == "A big picture")
    assert kept["messages"][0]["images"][0].startswith("data:image/png;base64,")
    # Kept apart, once, and named in the record.
    raw = page.evaluate(RAW)
    assert len(raw["images"]) == 1
    assert [c["messages"][0].get("images") for c in raw["conversations"] if c["title"] == "A big picture"] == [
        ["idb:" + raw["images"][0]]
    ]

    # A refused write is said so, by name; a later conversation is still kept.
    page.click("#new-chat")
    send(page, "Too big now")
    page.wait_for_selector("#toast:not([hidden])")
    assert "Not kept: “Too big now”" in page.inner_text("#toast") and "full" in page.inner_text("#toast")
    wait_for_reply(page)
    assert page.locator(".conv.unsaved .conv-name").inner_text() == "Too big now"
    page.click("#new-chat")
    send(page, "Small and later")
    wait_for_reply(page)
    page.reload()
    page_ready(page)
    # (The refused one stays as it was last kept: the empty "New chat".)
    assert titles(page) == ["A big picture", "Just text", "New chat", "Small and later"]
    # Deleted, its image goes too (on the next load).
    row = page.locator(".conv", has_text="A big picture")
    row.locator(".conv-delete").click()
    row.locator(".conv-delete").click()
    page.wait_for_function("() => !document.documentElement.dataset.writing")
    page.reload()
    page_ready(page)
    deadline = time.monotonic() + 120  # a cap for a hang: the page removes it when it has loaded
    while page.evaluate(RAW)["images"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.evaluate(RAW)["images"] == []


# ---- two conversations at once ------------------------------------------------------------------------


def test_a_send_in_one_conversation_goes_while_another_streams(pages, server):
    page = pages().page
    configure(page, **forced(4000))
    send(page, "Write a very long story.")
    page.wait_for_function("() => document.querySelector('.msg.assistant.streaming .content')?.textContent.length > 5")
    streaming_id = page.locator(".conv.active").get_attribute("data-id")
    page.click("#new-chat")
    assert page.is_visible("#send") and page.is_hidden("#stop")
    configure(page, **forced(3))
    send(page, "A short one.")
    page.wait_for_selector(".msg.user .bubble:text('A short one.')")
    wait_for_reply(page)
    reply = last_reply(page)
    assert reply["stats"]["completion"] == 3 and "error" not in reply
    assert page.locator(f".conv.streaming[data-id='{streaming_id}']").count() == 1
    assert page.locator(".conv.active.streaming").count() == 0
    page.click(f".conv[data-id='{streaming_id}'] .conv-title")
    assert page.is_visible("#stop")
    page.click("#stop")
    wait_for_reply(page)
    assert last_reply(page)["stats"]["finish"] == "stopped"
    assert page.locator(".conv.streaming").count() == 0


# ---- versions ------------------------------------------------------------------------------------------------


def test_edit_and_regenerate_keep_the_old_version_a_click_away(pages):
    page = pages(FakeChat(chat_stream("The first reply."))).page
    send(page, "Original question")
    wait_for_reply(page)
    send(page, "Follow-up")
    wait_for_reply(page)
    page.locator(".msg.user").first.get_by_role("button", name="Edit").click()
    page.fill(".edit-area", "Edited question")
    page.click("text=Save & send")
    wait_for_reply(page)
    first = page.locator(".msg.user").first
    assert first.locator(".version-count").inner_text() == "2/2"
    first.get_by_role("button", name="Previous version").click()
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["Original question", "Follow-up"]
    back = conversation(page)["messages"]
    assert [m["content"] for m in back] == ["Original question", "The first reply.", "Follow-up", "The first reply."]
    page.locator(".msg.user").first.get_by_role("button", name="Next version").click()
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["Edited question"]

    page.get_by_role("button", name="Regenerate").click()
    wait_for_reply(page)
    reply = page.locator(".msg.assistant").last
    assert reply.locator(".version-count").inner_text() == "2/2"
    reply.get_by_role("button", name="Previous version").click()
    assert len(conversation(page)["messages"]) == 2
    # The versions survive a reload.
    page.reload()
    page_ready(page)
    assert page.locator(".msg.assistant .version-count").inner_text() == "1/2"
    assert page.locator(".msg.user .version-count").inner_text() == "2/2"


# ---- an image being read when Enter is pressed ------------------------------------------------------------------

SLOW_READER = """
const read = FileReader.prototype.readAsDataURL;
FileReader.prototype.readAsDataURL = function (blob) { setTimeout(() => read.call(this, blob), 600); };
"""


def test_an_image_still_being_read_goes_with_the_message(pages, tmp_path):
    fake = FakeChat(chat_stream("Seen."), vlm=True)

    def setup(page) -> None:
        fake(page)
        page.add_init_script(SLOW_READER)

    page = pages(setup).page
    attach_file(page, tmp_path, big_image(0.2), "picture.png")
    send(page, "What is this?")
    page.wait_for_selector(".msg.assistant")
    wait_for_reply(page)
    content = fake.bodies[-1]["messages"][-1]["content"]
    assert isinstance(content, list) and [p["type"] for p in content] == ["text", "image_url"]
    assert page.is_hidden("#pending-images")
    assert conversation(page)["messages"][0]["images"]


# ---- smaller things ------------------------------------------------------------------------------------------------


def test_math_keeps_its_backslashes_and_is_typeset(pages):
    page = pages(FakeChat(chat_stream("Area: $a\\,b$ and\n\n$$\\frac{1}{2}\\,x$$\n\nCosts $5 and $10."))).page
    send(page, "Math please")
    wait_for_reply(page)
    content = page.locator(".msg.assistant .content")
    content.locator(".katex").first.wait_for()
    annotations = content.locator("annotation").all_text_contents()
    assert annotations == ["a\\,b", "\\frac{1}{2}\\,x"]
    assert content.locator(".math.display .katex-display").count() == 1
    assert "Costs $5 and $10." in content.inner_text()


def test_code_is_highlighted(pages):
    page = pages(FakeChat(chat_stream("```python\ndef f(x):\n    return '<b>' + x\n```"))).page
    send(page, "Code please")
    wait_for_reply(page)
    code = page.locator(".msg.assistant .code code")
    code.locator(".hljs-keyword").first.wait_for()
    assert code.inner_text() == "def f(x):\n    return '<b>' + x"
    assert code.locator("b").count() == 0


def test_a_reply_that_arrived_whole_keeps_its_time_to_first_token(pages):
    page = pages().page
    configure(page, top_logprobs=5, **forced(8))
    send(page, "Name a colour.")
    wait_for_reply(page)
    stats = page.locator(".msg.assistant .stats").last.inner_text()
    assert "arrived whole" in stats and "to first token" in stats
    assert last_reply(page)["stats"]["ttft"] > 0


def test_without_a_key_enter_says_the_key_is_missing(browser, keyed_playground_server):
    watched = open_page(browser, keyed_playground_server)
    page = watched.page
    page.locator("#key-banner").wait_for()
    send(page, "Hello")
    page.wait_for_selector("#toast:not([hidden])")
    assert "needs an API key" in page.inner_text("#toast")
    assert "lists no model" not in page.inner_text("#toast")
    assert page.evaluate("document.activeElement.id") == "api-key"
    page.fill("#api-key", API_KEY)
    page.click("#key-form button[type=submit]")
    page_ready(page)
    watched.check(allow_refused_key=True)
    page.context.close()


def test_copy_as_buttons_survive_a_reload_and_every_stop_string_is_sent(pages):
    fake = FakeChat(chat_stream("Copied."))
    page = pages(fake).page
    configure(page, stop="a\nb\nc\nd\ne")
    send(page, "Hello")
    wait_for_reply(page)
    assert fake.bodies[-1]["stop"] == ["a", "b", "c", "d", "e"]
    page.reload()
    page_ready(page)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_role("button", name="Copy as curl").click()
    curl = page.evaluate("navigator.clipboard.readText()")
    assert json.loads(shlex.split(curl.replace("\\\n", ""))[-1]) == fake.bodies[-1]


def test_a_reply_cut_by_a_reload_is_marked(pages):
    page = pages().page
    configure(page, **forced(4000))
    send(page, "Write a very long story.")
    page.wait_for_function("() => document.querySelector('.msg.assistant.streaming .content')?.textContent.length > 5")
    time.sleep(1.5)  # the streaming reply is written once a second
    page.reload()
    page_ready(page)
    assert page.is_visible(".msg.assistant .cut")
    reply = last_reply(page)
    assert reply["stats"]["finish"] == "interrupted" and reply["content"]
    assert page.is_visible("#send")


def test_a_reply_cut_at_the_token_limit_is_not_shown_as_an_error(pages):
    page = pages(FakeChat(chat_stream("Cut here", finish="length"))).page
    send(page, "Hello")
    wait_for_reply(page)
    finish = page.locator(".msg.assistant .stat.finish")
    assert "length" in finish.inner_text()
    danger = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--danger').trim()")
    colour = finish.evaluate("e => getComputedStyle(e).color")
    probe = page.evaluate(
        """(colour) => {
        const e = document.createElement('i');
        e.style.color = colour;
        document.body.append(e);
        const computed = getComputedStyle(e).color;
        e.remove();
        return computed;
    }""",
        danger,
    )
    assert colour != probe


def test_the_server_panel_drops_its_numbers_when_the_server_is_down(pages):
    watched = pages()
    page = watched.page
    page.wait_for_function("() => document.querySelector('#m-running').textContent === '0'")
    page.route("**/metrics", lambda route: route.abort())
    page.wait_for_function("() => document.querySelector('#panel-status').classList.contains('bad')", timeout=DONE)
    for tile in ("#m-running", "#m-queued", "#m-kv", "#m-rate"):
        assert page.inner_text(tile) == "–", tile
    watched.console_errors.clear()  # the browser's line about each refused /metrics


# ---- accessibility --------------------------------------------------------------------------------------------

RICH_REPLY = (
    "Here is code, math and a table.\n\n```python\nprint('hi')\n```\n\n$$e^{i\\pi} + 1 = 0$$\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n"
)


def axe_violations(page) -> list[str]:
    page.evaluate(AXE.read_text())
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:4]} "
        + v["nodes"][0].get("failureSummary", "")[:300]
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious(pages, scheme):
    fake = FakeChat(
        chat_stream(
            RICH_REPLY,
            tool_calls=[
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
            logprobs=True,
        )
    )
    found = {}
    page = pages(fake, color_scheme=scheme, viewport=DESKTOP).page
    found["empty"] = axe_violations(page)
    send(page, "Show me everything")
    wait_for_reply(page)
    page.locator(".msg.assistant .katex").first.wait_for()
    page.locator(".msg.assistant .hljs-built_in, .msg.assistant .hljs-string").first.wait_for()
    assert page.locator("h1").count() == 1
    found["conversation"] = axe_violations(page)
    page.check("#token-view")
    found["token view"] = axe_violations(page)
    page.uncheck("#token-view")
    page.click("#settings-toggle")
    found["settings"] = axe_violations(page)
    page.keyboard.press("Escape")
    phone = pages(fake, color_scheme=scheme, **PHONE).page
    found["phone"] = axe_violations(phone)
    open_drawer(phone)
    found["phone drawer"] = axe_violations(phone)
    failing = {state: v for state, v in found.items() if v}
    assert not failing, "\n".join(f"{state}: {line}" for state, lines in failing.items() for line in lines)


def test_the_keyboard_reaches_the_api_switch_the_tokens_and_every_conversation(pages):
    page = pages(FakeChat(chat_stream("Some tokens to walk through.", logprobs=True))).page
    # The API switch: one Tab stop, the arrows move the choice.
    page.focus("#api-mode [aria-checked=true]")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.mode") == "responses"
    assert page.get_attribute("#api-mode [data-mode=responses]", "aria-checked") == "true"
    page.keyboard.press("ArrowLeft")
    assert page.get_attribute("#api-mode [data-mode=chat]", "aria-checked") == "true"
    assert page.locator("#api-mode [tabindex='0']").count() == 1

    send(page, "First")
    wait_for_reply(page)
    page.click("#new-chat")
    send(page, "Second")
    wait_for_reply(page)
    # Alternatives without a mouse.
    page.check("#token-view")
    page.focus(".msg.assistant .tokens .tok")
    assert page.is_visible("#tip")
    first_tip = page.inner_text("#tip")
    page.keyboard.press("ArrowRight")
    assert page.is_visible("#tip") and page.inner_text("#tip") != first_tip
    # Rename and delete of a conversation that is not open, by Tab.
    other = page.locator(".conv:not(.active)")
    other.locator(".conv-title").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.classList.contains('conv-rename')")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.classList.contains('conv-delete')")
    assert float(other.locator(".conv-delete").evaluate("e => getComputedStyle(e).opacity")) == 1
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelectorAll('.conv').length === 1")
    # The streaming text is not a live region read again at every frame.
    assert page.get_attribute("#messages", "aria-live") is None


def test_the_model_picker_shows_a_models_state_when_the_server_gives_one(browser, server):
    models = {
        "object": "list",
        "data": [
            {"id": "a-model", "object": "model", "status": "loaded"},
            {"id": "b-model", "object": "model", "status": {"value": "unloaded", "args": []}},
            {"id": "c-model", "object": "model"},
        ],
    }
    watched = open_page(
        browser, server, setup=lambda page: page.route("**/v1/models", lambda r: r.fulfill(json=models))
    )
    page = watched.page
    page_ready(page)
    assert page.locator("#model option").all_inner_texts() == ["a-model · loaded", "b-model · unloaded", "c-model"]
    assert page.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == ["a-model", "b-model", "c-model"]
    watched.check()
    page.context.close()


def test_an_old_list_in_local_storage_moves_to_indexeddb(browser, server):
    old = [
        {
            "id": "c_old",
            "title": "From before",
            "created": 1,
            "updated": 2,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ]

    def setup(page) -> None:
        page.add_init_script(
            f"if (!sessionStorage.getItem('seeded')) {{ sessionStorage.setItem('seeded', '1');"
            f" localStorage.setItem('ovtrio.conversations', {json.dumps(json.dumps(old))}); }}"
        )

    watched = open_page(browser, server, setup=setup)
    page = watched.page
    page_ready(page)
    assert [c["title"] for c in stored(page)] == ["From before"]
    assert page.evaluate("localStorage.getItem('ovtrio.conversations')") is None
    assert page.locator(".conv-name").all_inner_texts() == ["From before"]
    watched.check()
    page.context.close()


# ---- the settings and the list -----------------------------------------------------------------------------------


def test_sampling_fields_a_conversations_own_system_prompt_and_a_chosen_theme(pages):
    fake = FakeChat(chat_stream("<think>Weighing it up.</think>The answer."))
    page = pages(fake, color_scheme="light").page
    configure(
        page,
        top_k=20,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        system="The default prompt.",
        response_format="json_object",
    )
    send(page, "First conversation")
    wait_for_reply(page)
    body = fake.bodies[-1]
    assert {k: body[k] for k in ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")} == {
        "top_k": 20,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
    }
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0] == {"role": "system", "content": "The default prompt."}
    # <think> is folded away from the answer.
    reasoning = page.locator(".msg.assistant details.reasoning")
    assert reasoning.get_attribute("open") is None and reasoning.inner_text().strip() == "Reasoning"
    assert page.inner_text(".msg.assistant .content") == "The answer."

    # This conversation's own system prompt; another conversation keeps the default.
    page.click("#settings-toggle")
    page.fill("#c-system", "Only for this one.")
    page.click("#close-settings")
    send(page, "Again")
    wait_for_reply(page)
    assert fake.bodies[-1]["messages"][0] == {"role": "system", "content": "Only for this one."}
    page.click("#new-chat")
    send(page, "Second conversation")
    wait_for_reply(page)
    assert fake.bodies[-1]["messages"][0] == {"role": "system", "content": "The default prompt."}

    # Search the list by title and text; every row has a date.
    assert all(page.locator(".conv-date").all_inner_texts())
    page.fill("#search", "again")
    assert page.locator(".conv-name").all_inner_texts() == ["First conversation"]
    page.fill("#search", "nothing like it")
    assert page.locator(".conv").count() == 0 and page.is_visible(".conv-none")
    page.fill("#search", "")
    assert page.locator(".conv").count() == 2

    # A chosen theme beats the system's.
    background = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    page.click("#settings-toggle")
    page.select_option("#s-theme", "dark")
    assert page.evaluate(background) != light
    page.reload()
    page_ready(page)
    assert page.evaluate(background) != light


@pytest.mark.parametrize("mode", ["chat", "responses"])
def test_a_text_file_goes_as_its_text(pages, tmp_path, mode):
    watched = pages()
    page = watched.page
    page.click(f"#api-mode [data-mode={mode}]")
    configure(page, **forced(2))
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\nThe key is 42.\n")
    page.set_input_files("#attach-text-file", str(notes))
    page.wait_for_selector("#pending-images .file-chip")
    send(page, "What is the key?")
    wait_for_reply(page)
    assert "error" not in last_reply(page), last_reply(page).get("error")
    body = watched.sent[-1]["body"]
    content = body["messages"][-1]["content"] if mode == "chat" else body["input"][-1]["content"]
    kind = "text" if mode == "chat" else "input_text"
    assert content == [
        {"type": kind, "text": "What is the key?"},
        {"type": kind, "text": "File notes.md:\n\n```\n# Notes\nThe key is 42.\n\n```"},
    ]
    assert page.inner_text(".msg.user .file-chip") == "notes.md"
    assert conversation(page)["messages"][0]["files"] == [{"name": "notes.md", "text": "# Notes\nThe key is 42.\n"}]
    assert page.is_hidden("#pending-images")


def pdf_with_text(lines: list[str]) -> bytes:
    """A one-page PDF writing `lines` in Helvetica."""
    text = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) Tj T*" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        " /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(text)} >>\nstream\n{text}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_a_pdf_goes_as_its_text(pages, tmp_path):
    fake = FakeChat(chat_stream("Read."))
    page = pages(fake).page
    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_with_text(["Quarterly report", "The key is 42."]))
    page.set_input_files("#attach-text-file", str(report))
    page.wait_for_selector("#pending-images .file-chip")
    send(page, "Summarise it.")
    page.wait_for_selector(".msg.assistant")
    wait_for_reply(page)
    parts = fake.bodies[-1]["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "Summarise it."}
    assert parts[1]["text"].startswith("File report.pdf:")
    assert "Quarterly report" in parts[1]["text"] and "The key is 42." in parts[1]["text"]


def test_a_reply_cut_at_its_token_limit_can_be_continued(pages):
    watched = pages()
    page = watched.page
    configure(page, system="Be brief.", **forced(4))
    send(page, "Tell me about the sea.")
    wait_for_reply(page)
    first = last_reply(page)
    assert first["stats"]["finish"] == "length"
    page.get_by_role("button", name="Continue").click()
    page.wait_for_function("() => document.querySelector('.msg.assistant .stats')?.textContent.includes('')")
    wait_for_reply(page)
    sent = watched.sent[-1]
    assert sent["url"].endswith("/v1/messages")
    assert sent["body"]["system"] == "Be brief." and sent["body"]["max_tokens"] == 4
    assert sent["body"]["messages"] == [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": first["content"]},
    ]
    reply = last_reply(page)
    assert "error" not in reply, reply.get("error")
    assert reply["content"].startswith(first["content"]) and reply["stats"]["continued"] is True
    assert reply["stats"]["completion"] >= 4
    assert len(conversation(page)["messages"]) == 2


def test_each_conversation_keeps_its_model(pages):
    fake = FakeChat(chat_stream("Hi."))
    models = {"object": "list", "data": [{"id": "model-a", "object": "model"}, {"id": "model-b", "object": "model"}]}

    def setup(page) -> None:
        fake(page)
        page.route("**/v1/models", lambda route: route.fulfill(json=models))

    page = pages(setup).page
    page.select_option("#model", "model-a")
    send(page, "With A")
    wait_for_reply(page)
    first = page.locator(".conv.active").get_attribute("data-id")
    page.click("#new-chat")
    page.select_option("#model", "model-b")
    send(page, "With B")
    wait_for_reply(page)
    assert [body["model"] for body in fake.bodies] == ["model-a", "model-b"]
    page.click(f".conv[data-id='{first}'] .conv-title")
    assert page.input_value("#model") == "model-a"
    send(page, "Again with A")
    wait_for_reply(page)
    assert fake.bodies[-1]["model"] == "model-a"


def test_a_conversation_deleted_while_it_streams_stays_deleted(pages, server):
    page = pages().page
    configure(page, **forced(4000))
    send(page, "Write a very long story.")
    page.wait_for_function("() => document.querySelector('.msg.assistant.streaming .content')?.textContent.length > 5")
    row = page.locator(".conv.active")
    row.locator(".conv-delete").click()
    row.locator(".conv-delete").click()
    assert page.locator(".conv").count() == 0
    page.wait_for_function("() => !document.body.classList.contains('running')")
    time.sleep(1.5)  # past the next write a streaming reply would have had
    page.reload()
    page_ready(page)
    assert page.locator(".conv").count() == 0 and stored(page) == []
