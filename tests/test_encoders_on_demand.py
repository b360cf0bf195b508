"""Encoders in --models-dir, on real servers: a folder holding the
embedded GGUF, an embedding model (the embedded embedder's converted IR), a Whisper model
(tiny_whisper.py), an embedding folder without its tokenizer, one whose weights are cut
short and a Whisper folder whose config.json is. Each is served as its kind under its
folder's name, listed with its state, loaded on its first request, unloaded by hand and
when idle, and found or forgotten as the folder changes; --models-max counts them; a
vision model in the folder gives the server the body limit images need. Nothing here
depends on what a model writes: a reloaded model is compared with itself. Encoders of a
folder under the hypercorn command: test_launcher_parity.py.
"""

from __future__ import annotations

import base64
import io
import shutil
import threading
import time
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
    StreamUntilTold,
    _rss_mb,
    _worker_pid,
    chat,
    count,
    loads,
    series_of,
    states,
    unload,
    wait_for_state,
    wait_until_running,
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
# Unloads whatever has been idle for 2 s.
idle_encoders = server_fixture(
    "idle_encoders",
    "--models-dir",
    "{folder}/models",
    "--model-idle-unload",
    "2",
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


def test_the_transcription_model_unloads_by_request_and_loads_again(server):
    first = transcribe(server)
    assert first.status_code == 200, first.text
    loaded = loads(server, WHISPER)
    unloads = count(server, "ovtrio_model_unloads_total", model_name=WHISPER, reason="request")
    reply = unload(server, WHISPER)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"]["value"] == "unloaded"
    assert states(server)[WHISPER]["value"] == "unloaded"
    assert server.metric("ovtrio_model_loaded", model_name=WHISPER) == 0
    assert server.metric("ovtrio_model_unloads_total", model_name=WHISPER, reason="request") == unloads + 1
    again = transcribe(server)
    assert again.status_code == 200, again.text
    assert again.json()["text"] == first.json()["text"]
    assert loads(server, WHISPER) == loaded + 1
    # And loaded by hand, as a generation model is.
    assert unload(server, WHISPER).status_code == 200
    by_hand = loopback.post(server.base_url + "/models/load", json={"model": WHISPER}, timeout=120)
    assert by_hand.status_code == 200 and by_hand.json()["status"]["value"] == "loaded", by_hand.text
    assert loads(server, WHISPER) == loaded + 2


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


def models_of(server: RunningServer) -> Path:
    return server.log_path.parent / "models"


def test_a_broken_encoder_is_not_loaded_again_at_once_unless_its_files_change(server):
    """A load holds the one load turn: a client asking again and again for a broken
    encoder hears the failure, with Retry-After, and the load is tried again once the
    folder's files change."""
    folder = models_of(server) / "minilm-mended"
    if folder.exists():  # an earlier run of this test on the same server
        shutil.rmtree(folder)
    link_embedder(folder)
    weights = folder / "openvino_model.bin"
    whole = weights.resolve()
    weights.unlink()
    weights.write_bytes(whole.read_bytes()[:1000])
    first = embed(server, "minilm-mended")
    assert first.status_code == 503 and first.json()["error"]["code"] == "model_unavailable", first.text
    failures = count(server, "ovtrio_model_load_failures_total", model_name="minilm-mended")
    assert failures == 1
    again = embed(server, "minilm-mended")
    assert again.status_code == 503 and "weights" in again.json()["error"]["message"], again.text
    assert 1 <= int(again.headers["retry-after"]) <= 10
    by_hand = loopback.post(server.base_url + "/models/load", json={"model": "minilm-mended"}, timeout=60)
    assert by_hand.status_code == 503 and by_hand.headers.get("retry-after"), by_hand.text
    assert count(server, "ovtrio_model_load_failures_total", model_name="minilm-mended") == failures
    # Mended: its files changed, so the next request loads it.
    weights.unlink()
    weights.symlink_to(whole)
    mended = embed(server, "minilm-mended")
    assert mended.status_code == 200, mended.text
    assert loads(server, "minilm-mended") == 1
    assert unload(server, "minilm-mended").status_code == 200
    shutil.rmtree(folder)


def test_an_unload_asked_while_an_encoder_loads_unloads_it_once_loaded(server):
    """As a generation model's: the load ends, then the model unloads (it was left
    loaded, the unload answering "loading")."""
    for _ in range(5):
        assert unload(server, EMBEDDER).status_code == 200
        loading = threading.Thread(
            target=lambda: loopback.post(server.base_url + "/models/load", json={"model": EMBEDDER}, timeout=60)
        )
        loading.start()
        deadline = time.monotonic() + 30
        while (state := states(server)[EMBEDDER]["value"]) == "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.005)
        if state != "loading":  # loaded before it was seen loading: try again
            loading.join()
            continue
        reply = unload(server, EMBEDDER)
        loading.join()
        assert reply.status_code == 200 and reply.json()["status"]["value"] == "unloaded", reply.text
        assert states(server)[EMBEDDER]["value"] == "unloaded"
        return
    pytest.fail("the embedder was never seen loading")


def test_a_busy_encoder_is_unloaded_once_its_requests_are_done(serve_encoders):
    """As a generation model's: with "drain" (the default) the unload waits for what the
    encoder computes; with "drain": false it is refused while the encoder is busy."""
    server = serve_encoders
    assert embed(server).status_code == 200
    # About 60,000 tokens: seconds of computing, in batches.
    inputs = ["a loaf of bread baked this morning in the oven of the village " * 2] * 2048
    replies: list[httpx.Response] = []

    def large_request() -> None:
        reply = loopback.post(
            server.base_url + "/v1/embeddings", json={"model": EMBEDDER, "input": inputs}, timeout=300
        )
        replies.append(reply)

    running = threading.Thread(target=large_request)
    running.start()
    deadline = time.monotonic() + 60
    while True:  # refused once the request computes (loaded again if it came first)
        busy = unload(server, EMBEDDER, drain=False)
        if busy.status_code == 409:
            break
        assert not replies and time.monotonic() < deadline, "the request never kept the embedder busy"
        time.sleep(0.05)
    assert busy.json()["error"]["code"] == "model_busy" and busy.json()["error"]["param"] == "drain"
    unloads = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request")
    loaded = loads(server, EMBEDDER)
    drained = unload(server, EMBEDDER)
    running.join()
    assert drained.status_code == 200 and drained.json()["status"]["value"] == "unloaded", drained.text
    reply = replies[0]
    assert reply.status_code == 200 and len(reply.json()["data"]) == len(inputs), reply.text[:300]
    # Computed whole before the unload: not cut and loaded again for the rest.
    assert loads(server, EMBEDDER) == loaded
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request") == unloads + 1
    assert states(server)[EMBEDDER]["value"] == "unloaded"


def test_an_encoder_folder_added_later_is_served_and_one_removed_is_forgotten(server):
    added = models_of(server) / "minilm-later"
    if added.exists():  # an earlier run of this test on the same server
        shutil.rmtree(added)
    link_embedder(added)
    # Named by a request before any listing: the folder is read again.
    vectors = embed(server, "minilm-later")
    assert vectors.status_code == 200, vectors.text
    assert vectors.json()["model"] == "minilm-later"
    assert cards(server)["minilm-later"]["kind"] == "embedding"
    assert count(server, "ovtrio_encoder_requests_total", model_name="minilm-later") == 1
    # Gone from the folder, but loaded: listed until it is unloaded.
    shutil.rmtree(added)
    assert states(server)["minilm-later"]["value"] == "loaded"
    assert unload(server, "minilm-later").status_code == 200
    assert "minilm-later" not in states(server)
    assert series_of(server, "minilm-later") == {}  # its metrics went with it
    gone = embed(server, "minilm-later")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


def test_encoders_of_the_folder_unload_when_idle_and_load_again(idle_encoders):
    server = idle_encoders
    first = transcribe(server)
    assert first.status_code == 200, first.text
    assert embed(server).status_code == 200
    for name in (WHISPER, EMBEDDER):
        wait_for_state(server, name, "unloaded", timeout=30)
        assert server.metric("ovtrio_model_unloads_total", model_name=name, reason="idle") >= 1
    again = transcribe(server)
    assert again.status_code == 200 and again.json()["text"] == first.json()["text"]


def generation_and_embedder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    link_embedder(models / EMBEDDER)


# Room for one model, an encoder or not, and a load waits at most 1 s for it.
serve_one_model = server_fixture(
    "serve_one_model",
    "--models-dir",
    "{folder}/models",
    "--models-max",
    "1",
    "--models-load-wait",
    "1",
    "--num-kv-blocks",
    KV_BLOCKS,
    prepare=generation_and_embedder,
)


def test_models_max_counts_the_encoders(serve_one_model):
    server = serve_one_model
    assert chat(server, "alpha").status_code == 200
    # Idle once its request's lease has ended: the embedder takes the generation model's
    # place, and then gives it back.
    assert embed(server).status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[EMBEDDER]["value"]) == ("unloaded", "loaded")
    assert server.metric("ovtrio_model_unloads_total", model_name="alpha", reason="lru") >= 1
    assert chat(server, "alpha").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[EMBEDDER]["value"]) == ("loaded", "unloaded")
    assert server.metric("ovtrio_model_unloads_total", model_name=EMBEDDER, reason="lru") >= 1
    # While the generation model runs a request, the embedder finds no room: 503 with
    # Retry-After after --models-load-wait, and it stays unloaded, not failed.
    running = StreamUntilTold(server, "alpha", max_tokens=2000)
    running.start()
    wait_until_running(server, "alpha")
    refused = embed(server)
    by_hand = loopback.post(server.base_url + "/models/load", json={"model": EMBEDDER}, timeout=60)
    running.stop()
    assert running.status == 200 and not running.ended
    for reply in (refused, by_hand):
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "model_unavailable" and "--models-max 1" in error["message"], error
        assert int(reply.headers["Retry-After"]) >= 1
    assert states(server)[EMBEDDER]["value"] == "unloaded"


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
