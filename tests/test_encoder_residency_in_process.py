"""The residency rules of encoders (embedding, rerank, Whisper and text-to-speech models
in --models-dir, and the embedded embedder) on in-process servers over fake encoders
(fake_encoders.py), with the folders of test_encoders_on_demand.py and
test_speech_lifecycle.py: which kind each folder is served as, which loads on its first
request and which stays unloaded, unloads by hand, when idle and to make room under
--models-max (which counts every kind), what a request that cannot have its model is
told (409, 503 with Retry-After), how a request computing holds its model, and what
/v1/models and /metrics say meanwhile. A test holds a load (server.loads) or a model's
batches (server.steps) for as long as it looks, so every wait is on the server's own
state. What a real encoder computes, how its load fails on broken files, its memory
over load cycles, a vision model's body limit and a drain at SIGTERM stay on the real
servers of test_encoders_on_demand.py and test_speech_lifecycle.py.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopback
import tiny_speecht5
import tiny_whisper
from encoder_fixtures import write_reranker
from fake_encoders import fake_score, fake_transcript, fake_vector
from helpers import post
from in_process import InProcessServer, in_process_server
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME
from ovtrio.model import embedded_model_path
from test_encoders_on_demand import EMBEDDER, NO_TOKENIZER, SPEECH, WHISPER, cards, link_embedder
from test_models_on_demand import (
    HANG_CAP,
    StreamUntilTold,
    chat,
    count,
    loads,
    models_folder,
    series_of,
    states,
    unload,
    wait_for_state,
    wait_until_running,
)
from test_residency_in_process import in_thread, wait_until

RERANKER = "reranker"
SPEAKER = "speecht5"
SAMPLES = 32_000  # SPEECH's: 2 s at 16 kHz, one window
NAMED = (WHISPER, EMBEDDER)


def encoders_folder(folder: Path) -> None:
    """The embedded GGUF, an embedding model, a reranker and a Whisper model, and an
    embedding model without its tokenizer (refused when found)."""
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    link_embedder(models / EMBEDDER)
    write_reranker(models / RERANKER)
    tiny_whisper.build(models / WHISPER)
    link_embedder(models / NO_TOKENIZER)
    (models / NO_TOKENIZER / "openvino_tokenizer.xml").unlink()


# An unload waits for the requests of its model as long as a test holds them.
encoders_in_process = in_process_server(
    "encoders_in_process", "--models-dir", "{folder}/models", "--drain-timeout", str(HANG_CAP), prepare=encoders_folder
)
# Unloads whatever has been idle for 2 s.
idle_encoders_in_process = in_process_server(
    "idle_encoders_in_process", "--models-dir", "{folder}/models", "--model-idle-unload", "2", prepare=encoders_folder
)
# The embedded embedder beside a folder of generation models, loaded only when asked
# (the generation models), and unloaded once idle for 2 s.
embedded_idle_in_process = in_process_server(
    "embedded_idle_in_process",
    "--models-dir",
    "{folder}/models",
    "--no-models-autoload",
    "--model-idle-unload",
    "2",
    prepare=models_folder,
)


def generation_and_embedder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    link_embedder(models / EMBEDDER)


# Room for one model, an encoder or not, and a load waits at most 1 s for it.
def room_for_one(name: str, prepare: Callable[[Path], None]) -> Any:
    """An in-process server of the folder `prepare` fills, with room for one model and a
    load that waits at most 1 s for it."""
    return in_process_server(
        name, "--models-dir", "{folder}/models", "--models-max", "1", "--models-load-wait", "1", prepare=prepare
    )


one_model_in_process = room_for_one("one_model_in_process", generation_and_embedder)


def fresh(server: InProcessServer, *names: str) -> InProcessServer:
    """`server` with the folder's encoders (and `names`) unloaded."""
    for name in (EMBEDDER, RERANKER, WHISPER, *names):
        reply = unload(server, name)
        assert reply.status_code == 200, reply.text
    return server


@pytest.fixture
def server(encoders_in_process: InProcessServer) -> InProcessServer:
    return fresh(encoders_in_process)


def encoder(server: InProcessServer, name: str) -> Any:
    (found,) = [encoder for encoder in server.registry.encoders if encoder.name == name]
    return found


def embed(server: InProcessServer, model: str = EMBEDDER, text: str | list[str] = "a loaf of bread") -> httpx.Response:
    return post(server.base_url, "/v1/embeddings", {"model": model, "input": text})


def transcribe(server: InProcessServer, model: str = WHISPER) -> httpx.Response:
    return loopback.post(
        server.base_url + "/v1/audio/transcriptions",
        files={"file": ("speech.wav", SPEECH, "audio/wav")},
        data={"model": model},
        timeout=HANG_CAP,
    )


def load_by_hand(server: InProcessServer, model: str) -> httpx.Response:
    return loopback.post(server.base_url + "/models/load", json={"model": model}, timeout=HANG_CAP)


def vectors_of(reply: httpx.Response) -> list[list[float]]:
    return [item["embedding"] for item in reply.json()["data"]]


def close_to(left: list[list[float]], right: list[list[float]]) -> bool:
    return len(left) == len(right) and all(
        len(a) == len(b) and all(abs(x - y) < 1e-6 for x, y in zip(a, b)) for a, b in zip(left, right)
    )


@contextmanager
def calls_counted(target: Any, method: str) -> Iterator[Counter[str]]:
    """How many times `target.method` has been called (awaited or not), in the block."""
    called: Counter[str] = Counter()
    original = getattr(target, method)

    def counted(*args: Any, **params: Any) -> Any:
        called[method] += 1
        return original(*args, **params)

    setattr(target, method, counted)
    try:
        yield called
    finally:
        delattr(target, method)


def test_each_kind_in_the_folder_is_served_as_its_kind_on_its_first_request(server):
    listed = cards(server)
    assert {name: card["kind"] for name, card in listed.items()} == {
        "alpha": "generation",
        EMBEDDER: "embedding",
        RERANKER: "rerank",
        WHISPER: "transcription",
        NO_TOKENIZER: "embedding",
    }, "the folder's embedder stands in for the embedded one"
    assert EMBEDDED_EMBEDDER_NAME not in listed
    assert listed[WHISPER]["input_modalities"] == ["audio"]
    encoders = (EMBEDDER, RERANKER, WHISPER)
    assert {name: listed[name]["status"]["value"] for name in encoders} == dict.fromkeys(encoders, "unloaded")
    before = {name: server.loads.count(name) for name in encoders}

    vectors = embed(server, text=["a loaf of bread", "butter"])
    assert vectors.status_code == 200, vectors.text
    assert vectors.json()["model"] == EMBEDDER
    assert close_to(vectors_of(vectors), [fake_vector("a loaf of bread"), fake_vector("butter")])
    now = states(server)
    assert (now[EMBEDDER]["value"], now[RERANKER]["value"], now[WHISPER]["value"]) == ("loaded", "unloaded", "unloaded")
    assert server.loads.count(EMBEDDER) == before[EMBEDDER] + 1
    assert server.loads.count(WHISPER) == before[WHISPER]  # only the model named loads

    documents = ["a cat on a mat", "the cat sat on the mat", "a dog"]
    ranked = post(server.base_url, "/v1/rerank", {"model": RERANKER, "query": "the cat sat", "documents": documents})
    assert ranked.status_code == 200, ranked.text
    scores = {result["index"]: result["relevance_score"] for result in ranked.json()["results"]}
    assert scores == pytest.approx({index: fake_score("the cat sat", text) for index, text in enumerate(documents)})
    assert ranked.json()["results"][0]["index"] == 1  # best first
    heard = transcribe(server)
    assert heard.status_code == 200, heard.text
    assert heard.json()["text"] == fake_transcript(SAMPLES)
    assert {name: states(server)[name]["value"] for name in encoders} == dict.fromkeys(encoders, "loaded")
    for name in encoders:
        assert server.loads.count(name) == before[name] + 1
        assert server.metric("ovtrio_model_loaded", model_name=name) == 1
        assert server.metric("ovtrio_model_state", model_name=name, state="loaded") == 1
        assert loads(server, name) >= 1
        assert server.metric("ovtrio_model_load_seconds_count", model_name=name) == loads(server, name)
    # Found without its tokenizer: failed from the start, with the reason, never loaded.
    assert states(server)[NO_TOKENIZER]["value"] == "failed"
    assert "openvino_tokenizer.xml" in states(server)[NO_TOKENIZER]["reason"]
    refused = embed(server, NO_TOKENIZER)
    assert refused.status_code == 503 and "openvino_tokenizer.xml" in refused.json()["error"]["message"]
    assert server.loads.count(NO_TOKENIZER) == 0
    # A model of one kind named at another kind's route is a 400 naming `model`.
    for route, body in (("/v1/embeddings", {"input": "x"}), ("/v1/rerank", {"query": "x", "documents": ["y"]})):
        wrong = post(server.base_url, route, {"model": WHISPER, **body})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "model_kind_mismatch", wrong.text
        assert wrong.json()["error"]["param"] == "model"


def test_the_transcription_model_unloads_by_request_and_loads_again(server):
    first = transcribe(server)
    assert first.status_code == 200, first.text
    loaded, counted = loads(server, WHISPER), server.loads.count(WHISPER)
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
    assert loads(server, WHISPER) == loaded + 1 and server.loads.count(WHISPER) == counted + 1
    # And loaded by hand, as a generation model is.
    assert unload(server, WHISPER).status_code == 200
    by_hand = load_by_hand(server, WHISPER)
    assert by_hand.status_code == 200 and by_hand.json()["status"]["value"] == "loaded", by_hand.text
    assert loads(server, WHISPER) == loaded + 2 and server.loads.count(WHISPER) == counted + 2


def test_a_failed_encoder_is_not_loaded_again_at_once_unless_its_files_change(server):
    """A client asking again and again for an encoder whose load failed hears the
    failure, with Retry-After, and no load is tried again until the folder's files change."""
    folder = server.folder / "models" / "minilm-mended"
    link_embedder(folder)
    weights = folder / "openvino_model.bin"
    whole = weights.resolve()
    weights.unlink()
    weights.write_bytes(b"cut short")
    try:
        server.loads.fail_next("cannot load embedding model: its weights are cut short")
        first = embed(server, "minilm-mended")
        assert first.status_code == 503 and first.json()["error"]["code"] == "model_unavailable", first.text
        assert count(server, "ovtrio_model_load_failures_total", model_name="minilm-mended") == 1
        assert server.loads.count("minilm-mended") == 1
        again = embed(server, "minilm-mended")
        assert again.status_code == 503 and "weights are cut short" in again.json()["error"]["message"], again.text
        assert 1 <= int(again.headers["retry-after"]) <= 10
        by_hand = load_by_hand(server, "minilm-mended")
        assert by_hand.status_code == 503 and by_hand.headers.get("retry-after"), by_hand.text
        listed = states(server)["minilm-mended"]
        assert listed["value"] == "failed" and "weights are cut short" in listed["reason"], listed
        assert count(server, "ovtrio_model_load_failures_total", model_name="minilm-mended") == 1
        assert server.loads.count("minilm-mended") == 1  # not tried again
        # Mended: its files changed, so the next request loads it.
        weights.unlink()
        weights.symlink_to(whole)
        mended = embed(server, "minilm-mended")
        assert mended.status_code == 200, mended.text
        assert server.loads.count("minilm-mended") == 2 and loads(server, "minilm-mended") == 1
        assert unload(server, "minilm-mended").status_code == 200
    finally:
        shutil.rmtree(folder)


def test_an_unload_asked_while_an_encoder_loads_unloads_it_once_loaded(server):
    """As a generation model's: the load ends, then the model unloads (it was left
    loaded, the unload answering "loading")."""
    before = server.loads.count(EMBEDDER)
    unloads = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request")
    with server.loads.held(), calls_counted(encoder(server, EMBEDDER), "settled") as settled:
        loading, loaded = in_thread(load_by_hand, server, EMBEDDER)
        wait_for_state(server, EMBEDDER, "loading")
        asked_before = settled["settled"]
        unloader, unloaded = in_thread(unload, server, EMBEDDER)
        wait_until(lambda: settled["settled"] > asked_before or unloaded, "the unload was answered or waits")
        assert not unloaded, f"the unload did not wait for the load: {unloaded[0].text}"
        assert states(server)[EMBEDDER]["value"] == "loading"
    unloader.join()
    loading.join()
    assert loaded[0].status_code == 200, loaded[0].text  # the load ended, then the unload
    assert unloaded[0].status_code == 200 and unloaded[0].json()["status"]["value"] == "unloaded", unloaded[0].text
    assert states(server)[EMBEDDER]["value"] == "unloaded"
    assert server.loads.count(EMBEDDER) == before + 1
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request") == unloads + 1


def test_a_busy_encoder_is_unloaded_once_its_requests_are_done(server):
    """As a generation model's: with "drain" (the default) the unload waits for what the
    encoder computes; with "drain": false it is refused while the encoder is busy."""
    assert embed(server).status_code == 200
    inputs = [f"a loaf of bread number {index}" for index in range(300)]  # batches of encoder_max_batch
    embedder = encoder(server, EMBEDDER)
    loaded = loads(server, EMBEDDER)
    unloads = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request")
    with server.steps.held(EMBEDDER), calls_counted(embedder, "drained") as drained:
        running, replies = in_thread(embed, server, EMBEDDER, inputs)
        wait_until(lambda: embedder.worker.has_work, "the request reached the embedder")
        busy = unload(server, EMBEDDER, drain=False)
        assert busy.status_code == 409, busy.text
        assert busy.json()["error"]["code"] == "model_busy" and busy.json()["error"]["param"] == "drain"
        unloader, unloading = in_thread(unload, server, EMBEDDER)
        wait_until(lambda: drained["drained"] == 1, "the unload waits for the request")
        assert states(server)[EMBEDDER]["value"] == "loaded" and not replies and not unloading
    unloader.join()
    running.join()
    assert unloading[0].status_code == 200 and unloading[0].json()["status"]["value"] == "unloaded", unloading[0].text
    reply = replies[0]
    assert reply.status_code == 200, reply.text[:300]
    # Computed whole before the unload: not cut and loaded again for the rest.
    assert close_to(vectors_of(reply), [fake_vector(text) for text in inputs])
    assert loads(server, EMBEDDER) == loaded
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="request") == unloads + 1
    assert states(server)[EMBEDDER]["value"] == "unloaded"


def test_an_encoder_folder_added_later_is_served_and_one_removed_is_forgotten(server):
    added = server.folder / "models" / "minilm-later"
    link_embedder(added)
    try:
        # Named by a request before any listing: the folder is read again.
        vectors = embed(server, "minilm-later")
        assert vectors.status_code == 200, vectors.text
        assert vectors.json()["model"] == "minilm-later"
        assert cards(server)["minilm-later"]["kind"] == "embedding"
        assert count(server, "ovtrio_encoder_requests_total", model_name="minilm-later") == 1
        assert server.loads.count("minilm-later") == 1
        # Gone from the folder, but loaded: listed until it is unloaded.
        shutil.rmtree(added)
        assert states(server)["minilm-later"]["value"] == "loaded"
        assert unload(server, "minilm-later").status_code == 200
        assert "minilm-later" not in states(server)
        assert series_of(server, "minilm-later") == {}  # its metrics went with it
        gone = embed(server, "minilm-later")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    finally:
        shutil.rmtree(added, ignore_errors=True)


def test_encoders_of_the_folder_unload_when_idle_and_load_again(idle_encoders_in_process):
    server = idle_encoders_in_process
    idle_before = {name: count(server, "ovtrio_model_unloads_total", model_name=name, reason="idle") for name in NAMED}
    counted = {name: server.loads.count(name) for name in NAMED}
    first = transcribe(server)
    assert first.status_code == 200, first.text
    assert embed(server).status_code == 200
    for name in NAMED:
        wait_for_state(server, name, "unloaded")
        assert server.metric("ovtrio_model_unloads_total", model_name=name, reason="idle") == idle_before[name] + 1
    again = transcribe(server)
    assert again.status_code == 200 and again.json()["text"] == first.json()["text"]
    assert server.loads.count(WHISPER) == counted[WHISPER] + 2


def test_a_computing_encoder_is_not_unloaded_when_idle_time_passes(idle_encoders_in_process):
    """A request computing holds its model: its idle time starts when the request ends."""
    server = idle_encoders_in_process
    assert embed(server).status_code == 200
    embedder = encoder(server, EMBEDDER)
    idle_before = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="idle")
    with server.steps.held(EMBEDDER):
        running, replies = in_thread(embed, server, EMBEDDER)
        wait_until(lambda: embedder.worker.has_work, "the request reached the embedder")
        used = embedder.last_used
        # The idle rule looks again and again, and finds the model in use each time.
        wait_until(lambda: embedder.last_used > used + 2, "the idle rule saw the model in use past its idle time")
        assert states(server)[EMBEDDER]["value"] == "loaded" and not replies
    running.join()
    assert replies[0].status_code == 200
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="idle") == idle_before
    wait_for_state(server, EMBEDDER, "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="idle") == idle_before + 1


def test_the_embedded_embedder_unloads_when_idle_and_loads_again(embedded_idle_in_process):
    server = embedded_idle_in_process
    assert cards(server)[EMBEDDED_EMBEDDER_NAME]["kind"] == "embedding"
    idle_before = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDED_EMBEDDER_NAME, reason="idle")
    counted = server.loads.count(EMBEDDED_EMBEDDER_NAME)
    first = embed(server, EMBEDDED_EMBEDDER_NAME)
    assert first.status_code == 200, first.text
    assert close_to(vectors_of(first), [fake_vector("a loaf of bread")])
    wait_for_state(server, EMBEDDED_EMBEDDER_NAME, "unloaded")
    idle = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDED_EMBEDDER_NAME, reason="idle")
    assert idle == idle_before + 1
    again = embed(server, EMBEDDED_EMBEDDER_NAME)
    assert again.status_code == 200
    assert vectors_of(again) == vectors_of(first)
    assert server.loads.count(EMBEDDED_EMBEDDER_NAME) == counted + 2
    # And by hand (or by the idle rule, whichever comes first).
    assert unload(server, EMBEDDED_EMBEDDER_NAME).status_code == 200
    wait_for_state(server, EMBEDDED_EMBEDDER_NAME, "unloaded")


def test_models_max_counts_the_encoders(one_model_in_process):
    server = one_model_in_process
    for name in ("alpha", EMBEDDER):
        assert unload(server, name).status_code == 200
    alpha_lru = count(server, "ovtrio_model_unloads_total", model_name="alpha", reason="lru")
    embedder_lru = count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="lru")
    assert chat(server, "alpha").status_code == 200
    # Idle once its request's lease has ended: the embedder takes the generation model's
    # place, and then gives it back.
    assert embed(server).status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[EMBEDDER]["value"]) == ("unloaded", "loaded")
    assert count(server, "ovtrio_model_unloads_total", model_name="alpha", reason="lru") == alpha_lru + 1
    assert chat(server, "alpha").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[EMBEDDER]["value"]) == ("loaded", "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name=EMBEDDER, reason="lru") == embedder_lru + 1
    # While the generation model runs a request, the embedder finds no room: 503 with
    # Retry-After after --models-load-wait, and it stays unloaded, not failed, with no
    # load begun.
    counted = server.loads.count(EMBEDDER)
    with server.steps.held("alpha"):
        running = StreamUntilTold(server, "alpha", max_tokens=2000)
        running.start()
        wait_until_running(server, "alpha")
        refused = embed(server)
        by_hand = load_by_hand(server, EMBEDDER)
        assert server.metric("ovtrio_requests_running", model_name="alpha") == 1
        running.stopping.set()
    running.join()
    assert running.status == 200 and not running.ended
    for reply in (refused, by_hand):
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "model_unavailable" and "--models-max 1" in error["message"], error
        assert int(reply.headers["Retry-After"]) >= 1
    assert states(server)[EMBEDDER]["value"] == "unloaded"
    assert server.loads.count(EMBEDDER) == counted


def test_a_computing_encoder_holds_its_place_under_models_max(one_model_in_process):
    """An encoder whose request computes is in use: a generation model finds no room
    beside it, and gets a 503 with Retry-After, until the request ends."""
    server = one_model_in_process
    assert unload(server, "alpha").status_code == 200
    assert embed(server).status_code == 200
    embedder = encoder(server, EMBEDDER)
    alpha_loads = server.loads.count("alpha")
    with server.steps.held(EMBEDDER):
        running, replies = in_thread(embed, server, EMBEDDER)
        wait_until(lambda: embedder.worker.has_work, "the request reached the embedder")
        refused = chat(server, "alpha")
        assert not replies
    running.join()
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "model_unavailable" and int(refused.headers["Retry-After"]) >= 1
    assert server.loads.count("alpha") == alpha_loads
    assert replies[0].status_code == 200
    assert chat(server, "alpha").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[EMBEDDER]["value"]) == ("loaded", "unloaded")


def speech_folder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    tiny_speecht5.build(models / SPEAKER)


# A text-to-speech model beside a generation model, room for one of them, and a load
# waits at most 1 s for it.
speech_in_process = room_for_one("speech_in_process", speech_folder)


def speak(server: InProcessServer, text: str = "Hello there. Bye.") -> httpx.Response:
    body = {"model": SPEAKER, "input": text, "voice": "alloy", "response_format": "pcm"}
    return loopback.post(server.base_url + "/v1/audio/speech", json=body, timeout=HANG_CAP)


def test_the_speech_model_of_the_folder_loads_on_demand_and_makes_room(speech_in_process):
    server = speech_in_process
    for name in ("alpha", SPEAKER):
        assert unload(server, name).status_code == 200
    listed = cards(server)
    assert listed[SPEAKER]["kind"] == "speech" and listed[SPEAKER]["status"]["value"] == "unloaded"
    counted = server.loads.count(SPEAKER)
    first = speak(server)
    assert first.status_code == 200 and first.content, first.text
    assert states(server)[SPEAKER]["value"] == "loaded"
    assert server.loads.count(SPEAKER) == counted + 1
    loaded = loads(server, SPEAKER)
    # By hand: unloaded, and loaded again on the next request, saying the same.
    reply = unload(server, SPEAKER)
    assert reply.status_code == 200 and reply.json()["status"]["value"] == "unloaded", reply.text
    assert server.metric("ovtrio_model_loaded", model_name=SPEAKER) == 0
    again = speak(server)
    assert again.status_code == 200 and again.content == first.content
    assert loads(server, SPEAKER) == loaded + 1 and server.loads.count(SPEAKER) == counted + 2
    # One model at a time: the generation model takes its place, and gives it back.
    lru = count(server, "ovtrio_model_unloads_total", model_name=SPEAKER, reason="lru")
    assert chat(server, "alpha").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[SPEAKER]["value"]) == ("loaded", "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name=SPEAKER, reason="lru") == lru + 1
    back = speak(server)
    assert back.status_code == 200 and back.content == first.content
    assert states(server)["alpha"]["value"] == "unloaded"


def sent_and_left_open(server: InProcessServer, path: str, body: dict[str, Any]) -> socket.socket:
    """A connection that has sent a POST of `body` to `path` and reads nothing: its
    client leaves when the test closes it."""
    address = server.base_url.removeprefix("http://")
    host, port = address.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    connection.sendall(head.encode() + payload)
    return connection


def test_a_client_that_leaves_mid_synthesis_gives_the_models_lease_back(speech_in_process):
    """While a request speaks, its model is held: an unload that refuses a held model
    (`"drain": false`) is a 409; once its client has left, the unload goes through."""
    server = speech_in_process
    speaker = encoder(server, SPEAKER)
    long = " ".join(f"Sentence number {index} is here." for index in range(100))
    body = {"model": SPEAKER, "input": long, "voice": "alloy", "response_format": "pcm"}
    with server.steps.held(SPEAKER):
        connection = sent_and_left_open(server, "/v1/audio/speech", body)
        try:
            wait_until(lambda: speaker.worker.has_work, "the request reached the model")
            held = unload(server, SPEAKER, drain=False)
            assert held.status_code == 409 and held.json()["error"]["code"] == "model_busy", held.text
        finally:
            connection.close()  # it leaves while its first sentence is spoken
    # The request stops at its next sentence, and gives the model back.
    wait_until(lambda: unload(server, SPEAKER, drain=False).status_code != 409, "the lease was given back")
    assert states(server)[SPEAKER]["value"] == "unloaded"
    assert not speaker.worker.has_work
