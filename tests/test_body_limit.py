"""The request body limit follows the models served (ovtrio/server/body_limit.py).

On real servers whose --models-dir holds only the embedded GGUF at start (so the text
limit, 2 MiB): a vision-language model (tiny_vlm.py) or a Whisper model (tiny_whisper.py)
moved into the folder later takes its large bodies on its very first request, with no
listing first; once the vision model is unloaded and its folder gone, the limit falls
back. On an in-process server of the same folder (tests/in_process.py), a client sending
bodies over the limit again and again, beside three streams held in the engine, gets
413 each time, at once, and makes the server read the folder at most once per
RESCAN_INTERVAL. The limit's own rules are tested with a clock of the test's.
"""

from __future__ import annotations

import base64
import io
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

import loopback
import tiny_vlm
import tiny_whisper
from audio_files import tone, wav
from conftest import RunningServer
from held_steps import held_steps
from helpers import beside_innocent_streams, post
from in_process import in_process_server
from ovtrio.model import embedded_model_path
from ovtrio.server.body_limit import RESCAN_INTERVAL, BodyLimit, body_bytes, declared_length
from ovtrio.settings.server import Settings
from server_pool import server_fixture
from test_models_on_demand import KV_BLOCKS, unload

TEXT_LIMIT = Settings().max_body_bytes
RESCAN_LINE = "models folder read again"


def text_folder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())


# The folder's flags; each reading of the folder for a body over the limit is a line of
# the log at debug level.
FOLDER_FLAGS = (
    *("--models-dir", "{folder}/models", "--num-kv-blocks", KV_BLOCKS),
    *("--no-embeddings", "--log-level", "debug"),
)


def served(name: str) -> object:
    """A server of `text_folder`."""
    return server_fixture(name, *FOLDER_FLAGS, prepare=text_folder)


vision_later = served("vision_later")
whisper_later = served("whisper_later")
# Oversized bodies are the HTTP layer's to refuse: in process, over a fake engine.
text_only = in_process_server("text_only", *FOLDER_FLAGS, prepare=text_folder)


def move_in(server: RunningServer, name: str, build: object, tmp_path: Path) -> Path:
    """A model built aside (`build(folder)`), then moved into the server's models folder
    whole, as an operator would copy one in."""
    aside = tmp_path / name
    build(aside)  # type: ignore[operator]
    target = server.log_path.parent / "models" / name
    if target.exists():  # an earlier run of the test on the same server
        shutil.rmtree(target)
    shutil.move(aside, target)
    return target


def image_chat(model: str) -> dict[str, object]:
    """A chat request whose one image (a PNG of noise, 1000x1000) makes the body about
    4 MB, nearly twice the text limit."""
    buffer = io.BytesIO()
    pixels = np.random.default_rng(11).integers(0, 256, (1000, 1000, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2}


def test_a_vision_model_moved_in_later_takes_large_bodies_on_its_first_request(vision_later, tmp_path):
    server = vision_later
    folder = move_in(server, "vlm", tiny_vlm.build, tmp_path)
    body = image_chat("vlm")
    # No listing first: the body over the limit has the folder read before it is refused.
    reply = post(server.base_url, "/v1/chat/completions", body)
    assert len(reply.request.content) > TEXT_LIMIT * 3 // 2
    assert reply.status_code == 200, reply.text[:500]
    assert reply.json()["usage"]["prompt_tokens"] >= tiny_vlm.IMAGE_TOKENS
    # Unloaded and gone from the folder: forgotten at the next listing, and the limit
    # is the text one again.
    assert unload(server, "vlm").status_code == 200
    shutil.rmtree(folder)
    assert "vlm" not in {card["id"] for card in loopback.get(server.v1 + "/models", timeout=30).json()["data"]}
    refused = post(server.base_url, "/v1/chat/completions", body)
    assert refused.status_code == 413, refused.text[:500]
    assert f"than the {TEXT_LIMIT} bytes" in refused.json()["error"]["message"]


def test_a_whisper_model_moved_in_later_takes_a_large_upload_on_its_first_request(whisper_later, tmp_path):
    move_in(whisper_later, "whisper", tiny_whisper.build, tmp_path)
    # 12 s of 48 kHz stereo: 2.3 MB, over the text limit, one 30 s window for the model.
    upload = wav(tone(12.0, rate=48000), rate=48000, channels=2)
    assert len(upload) > TEXT_LIMIT
    with openai.OpenAI(base_url=whisper_later.v1, api_key="unused", max_retries=0, timeout=120) as sdk:
        result = sdk.audio.transcriptions.create(model="whisper", file=("speech.wav", upload, "audio/wav"))
    assert isinstance(result.text, str)


class Listings(logging.Handler):
    """Counts the log's readings of the folder for a body over the limit."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += RESCAN_LINE in record.getMessage()


@pytest.fixture
def listings() -> Iterator[Listings]:
    """The ovtrio log's folder readings, counted while the test runs (the in-process
    server logs in this process, at debug level as --log-level debug sets it)."""
    logger = logging.getLogger("ovtrio")
    handler, level = Listings(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_bodies_over_the_limit_sent_again_and_again_list_the_folder_at_a_bounded_rate(text_only, listings):
    server = text_only
    oversized = {"model": "alpha", "prompt": "a" * (TEXT_LIMIT + 1_000_000)}
    timings: list[float] = []
    loaded = post(server.base_url, "/v1/completions", {"model": "alpha", "prompt": "a", "max_tokens": 1})
    assert loaded.status_code == 200, loaded.text  # alpha loaded: its engine can be held

    def hostile() -> None:
        deadline = time.monotonic() + 120  # a cap for a hang
        while server.metric("ovtrio_requests_running") < 3:  # the three streams in the engine
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        for _ in range(20):
            sent = time.monotonic()
            reply = post(server.base_url, "/v1/completions", oversized)
            timings.append(time.monotonic() - sent)
            assert reply.status_code == 413, reply.text[:500]
            assert reply.json()["error"]["code"] == "request_too_large"
            assert f"than the {TEXT_LIMIT} bytes" in reply.json()["error"]["message"]
        timings.append(time.monotonic() - started)
        assert server.metric("ovtrio_requests_running") == 3
        steps.release()  # the streams held in the engine meanwhile go on to their end

    # The three streams stay in the engine until every oversized body is refused.
    with held_steps(server, "alpha") as steps:
        beside_innocent_streams(server, hostile, model="alpha")
    *_, elapsed = timings
    # Logged before each refusal is sent, in this process: counted as they happen.
    assert 1 <= listings.count <= elapsed / RESCAN_INTERVAL + 1, (listings.count, elapsed)


# ---- the limit's rules, in process -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limit_with_counted_rescans(vision: bool = False, audio: bool = False) -> tuple[BodyLimit, dict, list, Clock]:
    config: dict[str, object] = {}
    clock = Clock()
    limit = BodyLimit(Settings(), config, vision=vision, audio=audio, clock=clock)
    rescans: list[float] = []

    async def rescan() -> None:
        rescans.append(clock.now)

    limit.rescan = rescan
    return limit, config, rescans, clock


def test_the_limit_grows_with_a_vision_or_whisper_model_and_never_falls_below_its_start():
    settings = Settings()
    limit, config, _, _ = limit_with_counted_rescans()
    assert config["MAX_CONTENT_LENGTH"] == limit.bytes == TEXT_LIMIT
    limit.follow(vision=True, audio=False)
    assert limit.bytes == body_bytes(settings, vision=True) > TEXT_LIMIT and not limit.audio
    limit.follow(vision=True, audio=True)
    assert limit.bytes == limit.largest == body_bytes(settings, vision=True, audio=True) and limit.audio
    limit.follow(vision=False, audio=False)
    assert limit.bytes == TEXT_LIMIT and not limit.audio
    # A Whisper model served at start keeps its room whatever the folder holds later.
    at_start, config, _, _ = limit_with_counted_rescans(audio=True)
    at_start.follow(vision=False, audio=False)
    assert at_start.bytes == body_bytes(settings, audio=True) > TEXT_LIMIT and at_start.audio


@pytest.mark.trio
async def test_a_body_over_the_limit_has_the_folder_read_at_most_once_per_interval():
    limit, _, rescans, clock = limit_with_counted_rescans()
    await limit.before_request(TEXT_LIMIT)  # within the limit
    await limit.before_request(None)  # no Content-Length: checked as it arrives
    await limit.before_request(limit.largest + 1)  # over any limit there could be
    assert rescans == []
    for _ in range(50):
        await limit.before_request(TEXT_LIMIT + 1)
    assert rescans == [100.0]
    clock.now += RESCAN_INTERVAL / 2
    await limit.before_request(TEXT_LIMIT + 1)
    assert rescans == [100.0]
    clock.now += RESCAN_INTERVAL / 2
    await limit.before_request(limit.largest)
    assert rescans == [100.0, 100.0 + RESCAN_INTERVAL]
    # Without a models folder there is nothing to read.
    limit.rescan = None
    clock.now += 10 * RESCAN_INTERVAL
    await limit.before_request(TEXT_LIMIT + 1)
    assert len(rescans) == 2


def test_the_content_length_is_read_from_the_asgi_headers():
    assert declared_length([(b"host", b"x"), (b"content-length", b"123")]) == 123
    assert declared_length([(b"Content-Length", b"7")]) == 7
    assert declared_length([(b"content-length", b"many")]) is None
    assert declared_length([(b"transfer-encoding", b"chunked")]) is None
