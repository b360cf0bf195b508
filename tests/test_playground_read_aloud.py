"""The playground's Read aloud button, on a real server serving the tiny SpeechT5
(tiny_speecht5.py) beside the embedded model, in headless Chromium (tests/browser.py).

The page is held to what it sends and what the server answers: the reply's answer, as
the page keeps it, is the `input` it posts to /v1/audio/speech, the answer is a wav that
the page plays to its end, and without a speech model no reply has the button.
"""

from __future__ import annotations

import re

import pytest

import tiny_speecht5
from browser import browser  # noqa: F401 (the fixture)
from server_pool import server_fixture
from test_playground import configure, conversation, open_page, page_ready, send, wait_for_reply

pytestmark = pytest.mark.browser

SPEECH = "speecht5"

read_aloud_server = server_fixture(
    "read_aloud_server",
    "--speech-model",
    "{folder}/" + SPEECH,
    "--no-embeddings",
    prepare=lambda folder: tiny_speecht5.build(folder / SPEECH),
)


# What the page plays: each play() with whether it ended, or the error it failed with.
KEEP_PLAYED = """(() => {
    const play = HTMLMediaElement.prototype.play;
    window.played = [];
    HTMLMediaElement.prototype.play = function () {
        const record = { ended: false, error: null };
        window.played.push(record);
        this.addEventListener("ended", () => { record.ended = true; });
        return play.apply(this, arguments).catch((error) => { record.error = String(error); throw error; });
    };
})()"""
ENDED_OR_REFUSED = (
    "() => (window.played.length && (window.played[0].ended || window.played[0].error))"
    " || !document.querySelector('#speech-status').hidden"
)


def _answer(content: str) -> str:
    """The reply without a leading <think>…</think>, as the page reads it aloud."""
    return re.sub(r"^\s*<think>[\s\S]*?</think>\s*", "", content)


def test_a_reply_is_read_aloud_by_the_speech_model(browser, read_aloud_server):
    watched = open_page(browser, read_aloud_server, setup=lambda page: page.add_init_script(KEEP_PLAYED))
    page = watched.page
    spoken = []
    page.on("response", lambda response: spoken.append(response) if response.url.endswith("/audio/speech") else None)
    try:
        page_ready(page)
        configure(page, max_tokens=8)
        send(page, "Say hello.")
        wait_for_reply(page)
        button = page.locator(".msg.assistant .read-aloud")
        assert button.count() == 1 and button.inner_text() == "Read aloud"
        button.click()
        page.wait_for_function(ENDED_OR_REFUSED)
        assert page.is_hidden("#speech-status"), page.inner_text("#speech-status")
        assert page.evaluate("window.played") == [{"ended": True, "error": None}]
        # Played to its end: the button is back as it was.
        assert button.inner_text() == "Read aloud" and button.get_attribute("aria-pressed") == "false"
        assert len(spoken) == 1 and spoken[0].status == 200
        assert spoken[0].headers["content-type"].startswith("audio/wav")
        body = spoken[0].request.post_data_json
        reply = conversation(page)["messages"][-1]
        assert body["model"] == SPEECH and body["response_format"] == "wav"
        assert body["input"] == _answer(reply["content"])
        watched.check()
    finally:
        page.context.close()


def test_without_a_speech_model_no_reply_has_the_button(browser, server):
    watched = open_page(browser, server)
    page = watched.page
    try:
        page_ready(page)
        configure(page, max_tokens=4)
        send(page, "Say hello.")
        wait_for_reply(page)
        assert page.locator(".msg.assistant").count() == 1
        assert page.locator(".read-aloud").count() == 0
        watched.check()
    finally:
        page.context.close()
