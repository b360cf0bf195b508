"""Images in the browser playground, driven in headless Chromium: against a server
serving the tiny vision-language model (tiny_vlm.py, random weights: its text is never
asserted) and against the embedded text-only model.

An image goes in three ways (the file picker, a paste, a drop), shows as a thumbnail in
the composer and in the sent message, travels as an image part of the request the
browser really sends (read from the wire: request bodies and WebSocket frames), is
counted in the prompt's tokens, stays with the conversation (reload, export, import)
and comes along in the next turn, in each of the three API modes.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

import tiny_vlm
from browser import browser  # noqa: F401 (the fixture)
from test_images import MODEL as VLM
from test_images import vlm_server  # noqa: F401 (the fixture: 300 kB per image at most)
from test_playground import (
    choose_mode,
    configure,
    conversation,
    forced,
    last_reply,
    page_ready,
    ready_page,
    send,
    wait_for_reply,
)

pytestmark = pytest.mark.browser


def png(seed: int, size: tuple[int, int] = (60, 40)) -> bytes:
    width, height = size
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# Hand the page a file the way a user's clipboard or a drag from the desktop would: a
# real ClipboardEvent / DragEvent whose DataTransfer holds a File. Returns whether the
# page took the event (preventDefault), so that the browser did nothing else with it.
PASTE = """([b64, name, type]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, {type}));
    const event = new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true});
    document.querySelector('#prompt').dispatchEvent(event);
    return event.defaultPrevented;
}"""
DROP = """([b64, name, type]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, {type}));
    const target = document.querySelector('#prompt');
    const over = new DragEvent('dragover', {dataTransfer: data, bubbles: true, cancelable: true});
    target.dispatchEvent(over);
    const drop = new DragEvent('drop', {dataTransfer: data, bubbles: true, cancelable: true});
    target.dispatchEvent(drop);
    return over.defaultPrevented && drop.defaultPrevented;
}"""


def attach(page, how: str, data: bytes, tmp_path, name: str = "picture.png", mime: str = "image/png") -> None:
    if how == "picker":
        path = tmp_path / name
        path.write_bytes(data)
        page.set_input_files("#attach-file", str(path))
    else:
        taken = page.evaluate(PASTE if how == "paste" else DROP, [base64.b64encode(data).decode(), name, mime])
        assert taken, f"the page left the {how} to the browser"


def pending_thumbnails(page) -> list[str]:
    return page.eval_on_selector_all("#pending-images img.thumb", "images => images.map(i => i.src)")


def shown_images(page) -> list[str]:
    """The images shown in the sent user messages, loaded (decoded by the browser)."""
    page.wait_for_function("() => [...document.querySelectorAll('.msg.user img.thumb')].every(i => i.complete)")
    return page.eval_on_selector_all(
        ".msg.user img.thumb", "images => images.filter(i => i.naturalWidth > 0).map(i => i.src)"
    )


def image_parts(body: dict) -> list[str]:
    """The image URLs in a chat or Responses request body (or WebSocket frame)."""
    urls = []
    turns = body.get("messages") or (body["input"] if isinstance(body.get("input"), list) else [])
    for turn in turns:
        content = turn.get("content")
        for part in content if isinstance(content, list) else []:
            if part.get("type") == "image_url":
                urls.append(part["image_url"]["url"])
            elif part.get("type") == "input_image":
                urls.append(part["image_url"])
    return urls


def api_sent(watched) -> list[dict]:
    return [s["body"] for s in watched.sent if s["url"].endswith(("/v1/chat/completions", "/v1/responses"))]


@pytest.fixture
def vlm_page(browser, vlm_server):
    with ready_page(browser, vlm_server) as watched:
        watched.page.wait_for_selector("#attach:not([hidden])")
        yield watched


@pytest.fixture
def text_page(browser, server):
    with ready_page(browser, server) as watched:
        yield watched


# ---- a vision-language model ----------------------------------------------------------------


@pytest.mark.parametrize(("mode", "how"), [("chat", "picker"), ("responses", "paste"), ("socket", "drop")])
def test_an_image_is_attached_shown_sent_counted_and_carried_into_the_next_turn(vlm_page, tmp_path, mode, how):
    watched, page = vlm_page, vlm_page.page
    assert page.is_enabled("#attach")
    choose_mode(page, mode)
    configure(page, **forced(4))

    send(page, "Describe this image.")  # the same text without an image, for the prompt's size
    wait_for_reply(page)
    text_only = last_reply(page)
    assert "error" not in text_only and image_parts(api_sent(watched)[-1]) == []
    page.click("#new-chat")

    image = png(1)
    attach(page, how, image, tmp_path)
    page.wait_for_selector("#pending-images:not([hidden]) img.thumb")
    assert pending_thumbnails(page) == [data_url(image)]
    assert page.inner_text("#attach") == "Image (1)"
    send(page, "Describe this image.")
    page.wait_for_selector(".msg.user img.thumb")
    assert page.is_hidden("#pending-images")
    wait_for_reply(page)

    first = last_reply(page)
    assert "error" not in first, first.get("error")
    assert first["stats"]["mode"] == mode and first["stats"]["completion"] == 4
    assert first["stats"]["prompt"] - text_only["stats"]["prompt"] >= tiny_vlm.IMAGE_TOKENS
    body = api_sent(watched)[-1]
    sent_url = watched.sent[-1]["url"]
    if mode == "chat":
        assert sent_url.endswith("/v1/chat/completions")
        assert body["messages"][-1]["content"] == [
            {"type": "text", "text": "Describe this image."},
            {"type": "image_url", "image_url": {"url": data_url(image)}},
        ]
    else:
        assert sent_url.startswith("ws://" if mode == "socket" else "http://")
        assert body["input"][-1]["content"] == [
            {"type": "input_text", "text": "Describe this image."},
            {"type": "input_image", "image_url": data_url(image)},
        ]
    assert shown_images(page) == [data_url(image)]
    kept = conversation(page)["messages"][0]
    assert kept["images"] == [data_url(image)] and kept["content"] == "Describe this image."

    send(page, "And what else?")
    wait_for_reply(page)
    second = last_reply(page)
    assert "error" not in second, second.get("error")
    assert second["stats"]["completion"] == 4
    # The image is still part of the conversation the model reads.
    assert second["stats"]["prompt"] - text_only["stats"]["prompt"] >= tiny_vlm.IMAGE_TOKENS
    body = api_sent(watched)[-1]
    if mode == "chat":
        assert image_parts(body) == [data_url(image)] and len(body["messages"]) == 3
    else:
        assert body["previous_response_id"] == first["responseId"]
        assert body["input"] == [{"role": "user", "content": "And what else?"}]
    assert shown_images(page) == [data_url(image)]


def test_images_stay_with_the_conversation_across_a_reload_and_export_then_import(vlm_page, tmp_path):
    watched, page = vlm_page, vlm_page.page
    configure(page, **forced(3))
    one, two = png(2), png(3, (48, 48))
    attach(page, "picker", one, tmp_path, "one.png")
    attach(page, "paste", two, tmp_path)
    page.wait_for_function("() => document.querySelectorAll('#pending-images img.thumb').length === 2")
    # One of them removed again, and attached again: the order is the user's.
    page.click("#pending-images .thumb-remove >> nth=0")
    assert pending_thumbnails(page) == [data_url(two)]
    attach(page, "drop", one, tmp_path)
    page.wait_for_function("() => document.querySelectorAll('#pending-images img.thumb').length === 2")
    send(page, "Compare them.")
    wait_for_reply(page)
    assert "error" not in last_reply(page)
    assert image_parts(api_sent(watched)[-1]) == [data_url(two), data_url(one)]
    before = conversation(page)
    assert before["messages"][0]["images"] == [data_url(two), data_url(one)]

    page.reload()
    page.wait_for_selector("html[data-ready]")
    page_ready(page)
    assert conversation(page) == before
    assert shown_images(page) == [data_url(two), data_url(one)]

    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "conversations.json"
    download.value.save_as(exported)
    document = json.loads(exported.read_text())
    assert document["conversations"][0]["messages"][0]["images"] == [data_url(two), data_url(one)]
    row = page.locator(f".conv[data-id='{before['id']}']")
    row.locator(".conv-delete").click()
    row.locator(".conv-delete").click()
    assert page.locator(".msg.user img.thumb").count() == 0
    page.set_input_files("#import-file", str(exported))
    page.wait_for_selector(f".conv[data-id='{before['id']}'].active")
    assert conversation(page) == before
    assert shown_images(page) == [data_url(two), data_url(one)]

    # The imported conversation goes on, its images sent again with it.
    send(page, "Which is brighter?")
    wait_for_reply(page)
    assert "error" not in last_reply(page)
    assert image_parts(api_sent(watched)[-1]) == [data_url(two), data_url(one)]


@pytest.mark.parametrize("how", ["picker", "paste", "drop"])
def test_a_file_that_is_not_an_image_is_refused_in_the_page(vlm_page, tmp_path, how):
    watched, page = vlm_page, vlm_page.page
    attach(page, how, b"PK\x03\x04 an archive", tmp_path, "archive.zip", "application/zip")
    page.wait_for_selector("#toast:not([hidden])")
    assert "archive.zip is not an image" in page.inner_text("#toast")
    assert pending_thumbnails(page) == [] and page.is_hidden("#pending-images")
    configure(page, **forced(2))
    send(page, "Hello.")
    wait_for_reply(page)
    assert "error" not in last_reply(page)
    assert image_parts(api_sent(watched)[-1]) == [] and "archive" not in json.dumps(watched.sent)


def test_an_image_over_the_servers_limit_gets_its_400_as_a_sentence(vlm_page, tmp_path):
    watched, page = vlm_page, vlm_page.page
    configure(page, **forced(3))
    big = png(4, (400, 400))  # about 480 kB as PNG; the server takes 300 kB at most
    assert len(big) > 300_000
    attach(page, "picker", big, tmp_path, "big.png")
    page.wait_for_selector("#pending-images img.thumb")
    refusals = []
    page.on(
        "response",
        lambda r: r.url.endswith("/v1/chat/completions") and r.status == 400 and refusals.append(r.json()["error"]),
    )
    send(page, "Describe this image.")
    wait_for_reply(page)
    # (A first refusal may be of the alternatives, which the page answers by asking again
    # without them.)
    error = refusals[-1]
    assert error["code"] == "image_too_large" and error["param"].endswith("image_url")
    watched.expected_refusals += 1  # the browser's console line about the 400
    shown = page.inner_text(".msg.assistant .error")
    assert shown == f"The server refused the request (400): {error['message']}"
    assert "\n    at " not in shown and "Error:" not in shown  # a sentence, not a stack

    # Edit takes the refused image out of the message; the conversation then goes on.
    sent_before = len(api_sent(watched))
    page.click(".msg.user button:text('Edit')")
    page.click(".msg.user .thumb-remove")
    assert page.locator(".msg.user img.thumb").count() == 0
    page.click(".msg.user button:text('Save & send')")
    wait_for_reply(page)
    assert "error" not in last_reply(page), last_reply(page).get("error")
    later = api_sent(watched)[sent_before:]
    assert later and all(image_parts(b) == [] for b in later)
    assert "images" not in conversation(page)["messages"][0]


# ---- a text-only model ----------------------------------------------------------------------


def test_a_text_only_model_offers_no_attach_and_ignores_pasted_or_dropped_images(text_page, tmp_path):
    watched, page = text_page, text_page.page
    cards = page.evaluate("fetch('/v1/models').then(r => r.json())")["data"]
    assert all("image" not in card.get("input_modalities", ["text"]) for card in cards)
    assert page.is_hidden("#attach") and page.is_disabled("#attach") and page.is_disabled("#attach-file")
    url_before = page.url
    for how in ("paste", "drop"):
        attach(page, how, png(5), tmp_path)  # taken by the page: a drop never opens the file
        page.wait_for_selector("#toast:not([hidden])")
        assert "does not read images" in page.inner_text("#toast")
        assert pending_thumbnails(page) == []
    assert page.url == url_before
    configure(page, **forced(2))
    send(page, "Hello.")
    wait_for_reply(page)
    assert "error" not in last_reply(page)
    bodies = api_sent(watched)
    assert bodies and all(image_parts(b) == [] for b in bodies)
    assert bodies[-1]["messages"][-1] == {"role": "user", "content": "Hello."}
    assert page.locator(".msg.user img").count() == 0
    assert "images" not in conversation(page)["messages"][0]


def test_the_vlm_is_listed_as_reading_images(vlm_page):
    cards = {card["id"]: card for card in vlm_page.page.evaluate("fetch('/v1/models').then(r => r.json())")["data"]}
    assert "image" in cards[VLM]["input_modalities"]
    # The embedded embedder is served beside it, and reads text only.
    assert all(card["input_modalities"] == ["text"] for name, card in cards.items() if name != VLM)
