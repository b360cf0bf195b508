"""The playground's microphone and audio files, on a real server serving the tiny
Whisper (tiny_whisper.py) beside the embedded model, in headless Chromium
(tests/browser.py; the microphone is Chromium's fake device).

The random Whisper writes nonsense, so the page is held to the server's own answer:
the audio the page posted (its request body, or the file it was given) is sent to
/v1/audio/transcriptions again here, and the message box must hold exactly that text.
"""

from __future__ import annotations

import base64
import time

import httpx
import pytest

import tiny_whisper
from audio_files import tone, wav
from browser import browser, media_browser  # noqa: F401 (the fixtures)
from server_pool import server_fixture
from test_audio import WHISPER, audio_server  # noqa: F401 (the fixture: one server for both modules)
from test_playground import API_KEY, DONE, open_page, page_ready, ready_page
from test_playground_ui import axe_violations

pytestmark = pytest.mark.browser

TRANSCRIPTIONS = "/v1/audio/transcriptions"

keyed_speech_server = server_fixture(
    "keyed_speech_server",
    "--transcription-model",
    "{folder}/" + WHISPER,
    "--api-key",
    API_KEY,
    "--no-embeddings",
    prepare=lambda folder: tiny_whisper.build(folder / WHISPER),
)
SPEECH = wav(tone(3.0, hertz=330))


def text_of(server, data: bytes, name: str = "speech.wav", key: str | None = None) -> str:
    response = httpx.post(
        server.base_url + TRANSCRIPTIONS,
        data={"model": WHISPER},
        files={"file": (name, data)},
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()["text"]


@pytest.fixture
def speech_page(browser, audio_server):
    with ready_page(browser, audio_server) as watched:
        yield watched


def wait_for_transcription(page) -> None:
    """Waits until the page has the text (or says why not, which fails the test)."""
    page.wait_for_function(
        "() => { const status = document.querySelector('#speech-status');"
        " return status.hidden || status.classList.contains('error'); }"
    )
    assert page.is_hidden("#speech-status"), page.inner_text("#speech-status")


def test_without_a_transcription_model_there_is_neither_button(browser, server):
    watched = open_page(browser, server)
    try:
        page = watched.page
        page_ready(page)
        assert page.is_hidden("#mic") and page.is_hidden("#attach-audio")
        page.set_input_files(
            "#attach-text-file", files=[{"name": "speech.wav", "mimeType": "audio/wav", "buffer": SPEECH}]
        )
        page.wait_for_selector("#toast:not([hidden])")
        assert "Not attached: speech.wav" in page.inner_text("#toast")
        assert page.input_value("#prompt") == "" and page.is_hidden("#speech-status")
        watched.check()
    finally:
        watched.page.context.close()


# The files the page posts, kept for the test as it posts them: Chromium does not hand a
# request's body to Playwright when part of it is a Blob.
KEEP_POSTED_FILES = """(() => {
    const fetched = window.fetch;
    window.postedFiles = [];
    window.fetch = async function (resource, init) {
        if (init && init.body instanceof FormData && init.body.get("file")) {
            const file = init.body.get("file");
            const bytes = new Uint8Array(await file.arrayBuffer());
            let binary = "";
            for (let i = 0; i < bytes.length; i += 8192) binary += String.fromCharCode(...bytes.subarray(i, i + 8192));
            window.postedFiles.push({ name: file.name, type: file.type, data: btoa(binary) });
        }
        return fetched.apply(this, arguments);
    };
})()"""


def test_a_recording_is_transcribed_into_the_box(media_browser, audio_server):
    watched = open_page(media_browser, audio_server, setup=lambda page: page.add_init_script(KEEP_POSTED_FILES))
    page = watched.page
    try:
        page_ready(page)
        assert page.is_visible("#mic") and page.is_visible("#attach-audio")
        page.click("#mic")
        page.wait_for_selector("#mic[aria-pressed=true]")
        assert "Recording" in page.inner_text("#speech-status")
        time.sleep(2)
        page.click("#mic")
        wait_for_transcription(page)
        posted = page.evaluate("window.postedFiles")
        assert [(file["name"], file["type"].split(";")[0]) for file in posted] == [("recording.webm", "audio/webm")]
        recording = base64.b64decode(posted[0]["data"])
        assert recording[:4] == b"\x1a\x45\xdf\xa3", "a WebM (Matroska) file"
        assert page.input_value("#prompt") == text_of(audio_server, recording, "recording.webm")
        assert page.get_attribute("#mic", "aria-pressed") == "false" and page.inner_text("#mic") == "Mic"
        watched.check()
    finally:
        page.context.close()


def test_an_audio_file_is_transcribed_at_the_cursor(speech_page, audio_server):
    page = speech_page.page
    expected = text_of(audio_server, SPEECH)
    page.fill("#prompt", "Summarise: ")
    page.set_input_files(
        "#attach-audio-file", files=[{"name": "speech.wav", "mimeType": "audio/wav", "buffer": SPEECH}]
    )
    wait_for_transcription(page)
    assert page.input_value("#prompt") == "Summarise: " + expected
    assert page.is_hidden("#pending-images"), "transcribed, not attached"


def test_a_dropped_audio_file_is_transcribed_not_refused(speech_page, audio_server):
    page = speech_page.page
    expected = text_of(audio_server, SPEECH)
    page.evaluate(
        """(data) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], "dropped.wav", { type: "audio/wav" }));
            const drop = new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true });
            document.querySelector("#messages").dispatchEvent(drop);
        }""",
        base64.b64encode(SPEECH).decode(),
    )
    page.wait_for_function("() => document.querySelector('#prompt').value !== ''", timeout=DONE)
    wait_for_transcription(page)
    assert page.input_value("#prompt") == expected
    assert page.is_hidden("#toast")


def test_a_file_that_is_not_audio_shows_the_servers_refusal(speech_page, audio_server):
    page = speech_page.page
    notes = b"These are the minutes of the meeting, not a recording of it."
    refusal = httpx.post(
        audio_server.base_url + TRANSCRIPTIONS,
        data={"model": WHISPER},
        files={"file": ("notes.wav", notes)},
        timeout=120,
    )
    assert refusal.status_code == 400
    message = refusal.json()["error"]["message"]
    speech_page.expected_refusals += 1  # the browser logs the 400
    page.fill("#prompt", "kept")
    page.set_input_files("#attach-audio-file", files=[{"name": "notes.wav", "mimeType": "audio/wav", "buffer": notes}])
    page.wait_for_selector("#speech-status.error")
    assert page.inner_text("#speech-status") == f"Not transcribed: notes.wav: {message}"
    assert page.input_value("#prompt") == "kept"
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.wait_for_timeout(600)  # the colours' transitions
        assert not axe_violations(page), scheme


def test_with_an_api_key_the_page_sends_it_with_the_audio(browser, keyed_speech_server):
    assert httpx.post(keyed_speech_server.base_url + TRANSCRIPTIONS, timeout=30).status_code == 401
    expected = text_of(keyed_speech_server, SPEECH, key=API_KEY)
    watched = open_page(browser, keyed_speech_server)
    page = watched.page
    try:
        page.locator("#key-banner").wait_for()
        assert page.is_hidden("#attach-audio"), "not offered before the key lists the models"
        page.fill("#api-key", API_KEY)
        page.click("#key-form button[type=submit]")
        page_ready(page)
        page.set_input_files(
            "#attach-audio-file", files=[{"name": "speech.wav", "mimeType": "audio/wav", "buffer": SPEECH}]
        )
        wait_for_transcription(page)
        assert page.input_value("#prompt") == expected
        watched.check(allow_refused_key=True)
    finally:
        page.context.close()
