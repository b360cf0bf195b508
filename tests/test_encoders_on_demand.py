"""Encoders in --models-dir, on real servers: a folder holding the embedded GGUF, an
embedding model (the embedded embedder's converted IR), a Whisper model
(tiny_whisper.py), an embedding folder without its tokenizer, one whose weights are cut
short and a Whisper folder whose config.json is. Each is served as its kind under its
folder's name and really embeds or transcribes once loaded on its first request; a
broken folder is listed failed with what the engine said while the others serve; the
embedder gives its memory back over load cycles; a vision model in the folder gives the
server the body limit images need. The residency rules of encoders (unloads by hand,
when idle and to make room, --models-max counting them, loads held or failed, leases)
run in process over fake encoders: test_encoder_residency_in_process.py. Encoders of a
folder under the hypercorn command: test_launcher_parity.py.
"""

from __future__ import annotations

import base64
import io
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

import loopback
import tiny_vlm
import tiny_whisper
from audio_files import tone, wav
from conftest import SESSION_CACHE, RunningServer
from helpers import beside_innocent_streams, post
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME, embedded_embedder_folder
from ovtrio.model import embedded_model_path
from server_pool import server_fixture
from test_models_on_demand import (
    CYCLES,
    KV_BLOCKS,
    RSS_BOUND_MB,
    _rss_mb,
    _worker_pid,
    count,
    loads,
    states,
    unload,
)

EMBEDDER = "minilm"
WHISPER = "whisper"
NO_TOKENIZER = "no-tokenizer"
CUT_SHORT = "cut-short"
BROKEN_WHISPER = "whisper-cut-short"
SPEECH = wav(tone(2.0))


def embedder_folder() -> Path:
    """The embedded embedder converted into the session's model cache (its IR folder)."""
    return embedded_embedder_folder(SESSION_CACHE)


def link_embedder(folder: Path) -> None:
    """`folder` made an embedding model: links to each file of the converted embedder."""
    folder.mkdir()
    for entry in embedder_folder().iterdir():
        (folder / entry.name).symlink_to(entry)


def encoders_folder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    link_embedder(models / EMBEDDER)
    tiny_whisper.build(models / WHISPER)
    # Hostile folders: an embedding model without its tokenizer (refused when found), and
    # one whose weights file is a tenth of what its graph reads (refused when loaded).
    link_embedder(models / NO_TOKENIZER)
    (models / NO_TOKENIZER / "openvino_tokenizer.xml").unlink()
    link_embedder(models / CUT_SHORT)
    weights = models / CUT_SHORT / "openvino_model.bin"
    whole = weights.resolve().read_bytes()
    weights.unlink()
    weights.write_bytes(whole[: len(whole) // 10])
    # And a Whisper model whose config.json is cut short: found, refused when loaded.
    (models / BROKEN_WHISPER).mkdir()
    for entry in (models / WHISPER).iterdir():
        if entry.name != "config.json":
            (models / BROKEN_WHISPER / entry.name).symlink_to(entry)
    (models / BROKEN_WHISPER / "config.json").write_text('{"model_type": "whis')


serve_encoders = server_fixture(
    "serve_encoders",
    "--models-dir",
    "{folder}/models",
    "--num-kv-blocks",
    KV_BLOCKS,
    prepare=encoders_folder,
)


@pytest.fixture
def server(serve_encoders: RunningServer) -> RunningServer:
    """The server, with the embedder and the Whisper model unloaded."""
    server = serve_encoders
    for name in (EMBEDDER, WHISPER):
        reply = unload(server, name)
        assert reply.status_code == 200, reply.text
    return server


def embed(server: RunningServer, model: str = EMBEDDER) -> httpx.Response:
    return post(server.base_url, "/v1/embeddings", {"model": model, "input": "a loaf of bread"})


def transcribe(server: RunningServer, model: str = WHISPER) -> httpx.Response:
    return loopback.post(
        server.base_url + "/v1/audio/transcriptions",
        files={"file": ("speech.wav", SPEECH, "audio/wav")},
        data={"model": model},
        timeout=120,
    )


def cards(server: RunningServer) -> dict[str, dict[str, Any]]:
    models = loopback.get(server.base_url + "/v1/models", timeout=30).json()["data"]
    return {model["id"]: model for model in models}


def test_each_kind_in_the_folder_is_served_as_its_kind_on_its_first_request(server):
    listed = cards(server)
    kinds = {name: card["kind"] for name, card in listed.items()}
    assert kinds == {
        "alpha": "generation",
        EMBEDDER: "embedding",
        WHISPER: "transcription",
        NO_TOKENIZER: "embedding",
        CUT_SHORT: "embedding",
        BROKEN_WHISPER: "transcription",
    }, "the folder's embedder stands in for the embedded one"
    assert EMBEDDED_EMBEDDER_NAME not in listed
    assert listed[WHISPER]["input_modalities"] == ["audio"]
    assert {name: listed[name]["status"]["value"] for name in (EMBEDDER, WHISPER)} == dict.fromkeys(
        (EMBEDDER, WHISPER), "unloaded"
    )

    vectors = embed(server)
    assert vectors.status_code == 200, vectors.text
    assert vectors.json()["model"] == EMBEDDER and len(vectors.json()["data"][0]["embedding"]) == 384
    assert states(server)[EMBEDDER]["value"] == "loaded"
    assert states(server)[WHISPER]["value"] == "unloaded"
    heard = transcribe(server)
    assert heard.status_code == 200, heard.text
    assert states(server)[WHISPER]["value"] == "loaded"
    for name in (EMBEDDER, WHISPER):
        assert server.metric("ovtrio_model_loaded", model_name=name) == 1
        assert server.metric("ovtrio_model_state", model_name=name, state="loaded") == 1
        assert loads(server, name) >= 1
        assert server.metric("ovtrio_model_load_seconds_count", model_name=name) == loads(server, name)
    # A model of one kind named at another kind's route is a 400 naming `model`.
    wrong = post(server.base_url, "/v1/embeddings", {"model": WHISPER, "input": "x"})
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "model_kind_mismatch"


def test_the_embedder_returns_its_memory_over_twenty_load_and_unload_cycles(server):
    """As a generation model's (measured: 9 MB over 40 cycles; docs/models.md). Whisper's
    pipeline keeps a few MB a cycle itself, so it is not held to the bound."""
    pid = _worker_pid(server)
    assert embed(server).status_code == 200
    assert unload(server, EMBEDDER).status_code == 200
    before = _rss_mb(pid)
    for _ in range(CYCLES):
        assert embed(server).status_code == 200
        assert unload(server, EMBEDDER).json()["status"]["value"] == "unloaded"
    after = _rss_mb(pid)
    assert after - before < RSS_BOUND_MB, (before, after)


def test_a_broken_encoder_folder_is_listed_failed_and_the_others_serve(server):
    listed = states(server)
    # Found without its tokenizer: failed from the start, with the reason.
    assert listed[NO_TOKENIZER]["value"] == "failed"
    assert "openvino_tokenizer.xml" in listed[NO_TOKENIZER]["reason"]
    refused = embed(server, NO_TOKENIZER)
    assert refused.status_code == 503 and "openvino_tokenizer.xml" in refused.json()["error"]["message"]
    # Weights, or a config, cut short: the load fails, and only the model's own requests
    # hear why, while three streams of the generation model and the embedder go on.
    failures = count(server, "ovtrio_model_load_failures_total", model_name=CUT_SHORT)
    answers: list[httpx.Response] = []
    heard: list[httpx.Response] = []

    def hostile() -> None:
        threads = [threading.Thread(target=lambda: answers.append(embed(server, CUT_SHORT))) for _ in range(2)]
        threads.append(threading.Thread(target=lambda: answers.append(embed(server))))
        threads.append(threading.Thread(target=lambda: heard.append(transcribe(server, BROKEN_WHISPER))))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    beside_innocent_streams(server, hostile, model="alpha")
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200, 503, 503], [answer.text for answer in answers]
    for answer in answers:
        if answer.status_code == 503:
            error = answer.json()["error"]
            assert error["code"] == "model_unavailable" and "weights" in error["message"], error
    assert heard[0].status_code == 503 and "json" in heard[0].json()["error"]["message"], heard[0].text
    listed = states(server)
    assert listed[CUT_SHORT]["value"] == "failed" and "weights" in listed[CUT_SHORT]["reason"]
    assert listed[BROKEN_WHISPER]["value"] == "failed" and "json" in listed[BROKEN_WHISPER]["reason"]
    assert server.metric("ovtrio_model_load_failures_total", model_name=CUT_SHORT) > failures
    assert embed(server).status_code == 200
    assert transcribe(server).status_code == 200


# A text limit small enough for one image to pass it.
TEXT_LIMIT = 200_000


def vision_folder(folder: Path) -> None:
    tiny_vlm.build(folder / "models" / "vlm")


vision_in_folder = server_fixture(
    "vision_in_folder",
    "--models-dir",
    "{folder}/models",
    "--max-body-bytes",
    str(TEXT_LIMIT),
    "--no-embeddings",
    prepare=vision_folder,
)


def test_a_vision_model_in_the_folder_gets_the_body_limit_images_need(vision_in_folder):
    server = vision_in_folder
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "vlm", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    reply = post(server.base_url, "/v1/chat/completions", body)
    assert len(reply.request.content) > TEXT_LIMIT
    assert reply.status_code == 200, reply.text[:500]
    assert reply.json()["usage"]["prompt_tokens"] >= tiny_vlm.IMAGE_TOKENS


def test_the_folder_tells_each_kind_by_its_files(tmp_path):
    """Embedding, rerank and Whisper folders are told apart by their files; a folder
    holding no model is none."""
    from encoder_fixtures import write_reranker
    from ovtrio.serving.discovery import folder_models

    models = tmp_path / "models"
    models.mkdir()
    link_embedder(models / EMBEDDER)
    write_reranker(models / "reranker")
    tiny_whisper.build(models / WHISPER)
    (models / "notes").mkdir()
    (models / "notes" / "readme.txt").write_text("not a model")
    # A Whisper folder whose config.json is cut short is still one (its load says what
    # is wrong, if anything), not skipped.
    shutil.copytree(models / WHISPER, models / "whisper-cut")
    (models / "whisper-cut" / "config.json").write_text('{"model_type": "whis')
    found = {model.name: model.kind for model in folder_models(models)}
    kinds = {EMBEDDER: "embedding", "reranker": "rerank", WHISPER: "transcription", "whisper-cut": "transcription"}
    assert found == kinds
    # Read once per version of a folder: one replaced by another kind is seen as that kind.
    shutil.rmtree(models / EMBEDDER)
    (models / "reranker").rename(models / EMBEDDER)
    del kinds["reranker"]
    assert {model.name: model.kind for model in folder_models(models)} == {**kinds, EMBEDDER: "rerank"}
