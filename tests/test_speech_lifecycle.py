"""A text-to-speech model (tiny_speecht5.py) in --models-dir, on a real server beside the
embedded GGUF: it speaks once loaded on its first request while broken folders are
listed failed with what the engine said, and a synthesis in flight at SIGTERM is spoken
to its end. Its residency rules (loads on demand, unloads by hand and to make room, a
client that leaves gives its lease back) run in process over a fake speaker:
test_encoder_residency_in_process.py."""

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
from test_models_on_demand import KV_BLOCKS, states

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
    assert states(server)[SPEECH]["value"] == "unloaded"
    spoken = speak(server)
    assert spoken.status_code == 200 and spoken.content, spoken.text
    assert states(server)[SPEECH]["value"] == "loaded"


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
