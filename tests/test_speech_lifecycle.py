"""A text-to-speech model (tiny_speecht5.py) in --models-dir, on a real server with room
for one model (--models-max 1) beside the embedded GGUF: found and served as its kind
under its folder's name, listed unloaded until its first request, unloaded by hand and
to make room, loaded again with the same voice, and a broken folder listed failed while
the others serve. What the model says is compared with itself across its loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import loopback
import tiny_speecht5
from conftest import RunningServer
from ovtrio.model import embedded_model_path
from server_pool import server_fixture
from test_models_on_demand import HANG_CAP, KV_BLOCKS, chat, count, loads, states, unload

pytestmark = pytest.mark.slow

SPEECH = "speecht5"
BROKEN = "speecht5-no-vocoder-weights"
CUT_CONFIG = "speecht5-config-cut-short"


def speech_folder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / "alpha.gguf").symlink_to(embedded_model_path())
    tiny_speecht5.build(models / SPEECH)
    # Its vocoder's weights cut short: found (its files are all there), failed when loaded.
    broken = models / BROKEN
    broken.mkdir()
    for entry in (models / SPEECH).iterdir():
        if entry.name != "openvino_vocoder.bin":
            (broken / entry.name).symlink_to(entry)
    (broken / "openvino_vocoder.bin").write_bytes((models / SPEECH / "openvino_vocoder.bin").read_bytes()[:100])
    # And one whose config.json is cut short: still a speech model by its files, failed when loaded.
    cut = models / CUT_CONFIG
    cut.mkdir()
    for entry in (models / SPEECH).iterdir():
        if entry.name != "config.json":
            (cut / entry.name).symlink_to(entry)
    (cut / "config.json").write_text('{"model_type": "speec')


speech_one_model = server_fixture(
    "speech_one_model",
    "--models-dir",
    "{folder}/models",
    "--models-max",
    "1",
    "--models-load-wait",
    "1",
    "--num-kv-blocks",
    KV_BLOCKS,
    prepare=speech_folder,
)


def speak(server: RunningServer, model: str = SPEECH, **body: Any) -> httpx.Response:
    body = {"model": model, "input": "Hello there. Bye.", "voice": "alloy", "response_format": "pcm", **body}
    return httpx.post(server.base_url + "/v1/audio/speech", json=body, timeout=120)


def test_the_speech_model_of_the_folder_loads_on_demand_and_makes_room(speech_one_model):
    server = speech_one_model
    cards = {card["id"]: card for card in loopback.get(server.base_url + "/v1/models", timeout=30).json()["data"]}
    assert cards[SPEECH]["kind"] == "speech" and cards[SPEECH]["status"]["value"] == "unloaded"
    first = speak(server)
    assert first.status_code == 200, first.text
    assert states(server)[SPEECH]["value"] == "loaded"
    loaded = loads(server, SPEECH)
    # By hand: unloaded, and loaded again on the next request, saying the same.
    reply = unload(server, SPEECH)
    assert reply.status_code == 200 and reply.json()["status"]["value"] == "unloaded", reply.text
    assert server.metric("ovtrio_model_loaded", model_name=SPEECH) == 0
    again = speak(server)
    assert again.status_code == 200 and again.content == first.content
    assert loads(server, SPEECH) == loaded + 1
    # One model at a time: the generation model takes its place, and gives it back.
    assert chat(server, "alpha").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now[SPEECH]["value"]) == ("loaded", "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name=SPEECH, reason="lru") >= 1
    back = speak(server)
    assert back.status_code == 200 and back.content == first.content
    assert states(server)["alpha"]["value"] == "unloaded"


def test_a_client_that_leaves_mid_synthesis_gives_the_models_lease_back(speech_one_model):
    """While a request speaks, its model is held: an unload that refuses a held model
    (`"drain": false`) is a 409; once its client has left, the unload goes through."""
    import time

    server = speech_one_model
    long = " ".join(f"Sentence number {index} is here." for index in range(100))
    body = {"model": SPEECH, "input": long, "voice": "alloy", "response_format": "pcm"}
    with httpx.stream("POST", server.base_url + "/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        reader = response.iter_raw()  # kept: a reader let go closes the response
        next(reader)  # the first sentence's audio
        held = unload(server, SPEECH, drain=False)
        assert held.status_code == 409 and held.json()["error"]["code"] == "model_busy", held.text
    deadline = time.monotonic() + HANG_CAP  # a cap for a hang: the request stops at its next sentence
    while (reply := unload(server, SPEECH, drain=False)).status_code == 409:
        assert time.monotonic() < deadline, "a lease of a client that left was never given back"
        time.sleep(0.05)
    assert reply.status_code == 200, reply.text
    assert states(server)[SPEECH]["value"] == "unloaded"


def test_a_broken_speech_folder_is_a_503_and_listed_failed(speech_one_model):
    server = speech_one_model
    refused = speak(server, BROKEN)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_unavailable" and BROKEN in error["message"], error
    assert "/" not in error["message"].split(BROKEN)[-1], "no paths in messages"
    assert states(server)[BROKEN]["value"] == "failed"
    cards = {card["id"]: card for card in loopback.get(server.base_url + "/v1/models", timeout=30).json()["data"]}
    assert cards[CUT_CONFIG]["kind"] == "speech"
    refused = speak(server, CUT_CONFIG)
    assert refused.status_code == 503 and CUT_CONFIG in refused.json()["error"]["message"], refused.text
    assert states(server)[CUT_CONFIG]["value"] == "failed"
    assert speak(server).status_code == 200


stop_speech = server_fixture(
    "stop_speech",
    "--speech-model",
    "{folder}/" + SPEECH,
    "--drain-timeout",
    "300",
    "--no-embeddings",
    prepare=lambda folder: tiny_speecht5.build(folder / SPEECH),
)
LONG = [f"Sentence number {index} is here." for index in range(100)]


async def test_sigterm_lets_a_synthesis_in_flight_speak_to_its_end(server_pool):
    """A speech request streaming when the signal comes is spoken to its last sentence
    within the drain, as generation streams are, and the server then exits cleanly."""
    import signal

    import trio

    from conftest import sample_value

    server: RunningServer = server_pool.take("stop_speech")
    body = {"model": SPEECH, "input": " ".join(LONG), "voice": "alloy", "response_format": "pcm"}
    try:
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=330, limits=fresh) as http:

            async def spoken() -> float:
                text = (await http.get("/metrics")).text
                return sample_value(text, "ovtrio_encoder_batch_size_count", model_name=SPEECH)

            warm = await http.post("/v1/audio/speech", json={**body, "input": "Hi."})
            assert warm.status_code == 200, warm.text
            received = bytearray()
            with trio.fail_after(330):  # a cap for a hang, not a deadline
                async with trio.open_nursery() as nursery:
                    before = await spoken()

                    async def speak_long() -> None:
                        async with http.stream("POST", "/v1/audio/speech", json=body) as response:
                            assert response.status_code == 200
                            async for chunk in response.aiter_raw():
                                received.extend(chunk)

                    nursery.start_soon(speak_long)
                    while await spoken() == before:  # its first sentence is spoken: it runs
                        await trio.sleep(0.02)
                    server.process.send_signal(signal.SIGTERM)
            exit_code = await trio.to_thread.run_sync(lambda: server.process.wait(timeout=330))
    finally:
        if server.process.poll() is None:
            server.process.kill()
    expected = sum(tiny_speecht5.samples_for(tiny_speecht5.tokens_of(sentence)) for sentence in LONG)
    log = server.log_path.read_text()
    assert len(received) == 2 * expected, log
    assert "draining 1 requests" in log and "drained in" in log, log
    assert exit_code == 0
