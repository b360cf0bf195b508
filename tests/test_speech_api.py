"""/v1/audio/speech on a real server serving the tiny SpeechT5 (tiny_speecht5.py) and the
tiny Whisper (tiny_whisper.py) beside the embedded model, driven by the official SDK.

The random SpeechT5 says noise, so the server is held to the pipeline's own samples:
the text is spoken a sentence at a time (ovtrio/speech/pieces.py), and the server's pcm
and wav samples are, exactly, the pipeline's for each sentence with the same voice,
written as round(x * 32767). The other containers decode back (PyAV) to that many
samples' duration at the model's rate (Opus decodes at 48 kHz, as every Opus stream
does), within the encoder's padding.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import subprocess
import threading
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import tiny_speecht5
import tiny_whisper
from helpers import assert_error, beside_innocent_streams, health_stays_fast, metric_value
from js_clients import js_clients  # noqa: F401 (the fixture)
from openai_schema import validate
from server_pool import server_fixture

pytestmark = pytest.mark.slow

SPEECH = "speecht5"
WHISPER = "whisper"
QUEUED = 4  # the requests the model takes at once (--speech-max-requests)
TEXT = "Hello there. How are you today? Fine, thanks."
SENTENCES = ["Hello there.", "How are you today?", "Fine, thanks."]
BRIGHT = tiny_speecht5.speaker(7)
DEEP = tiny_speecht5.speaker(8)
# Opus streams decode at 48 kHz whatever they were encoded at (RFC 7845).
DECODED_RATE = {"opus": 48000}
# Samples an encoder may add (its priming and its last frame's padding), in seconds.
PADDING_SECONDS = {"mp3": 0.15, "aac": 0.15, "opus": 0.03, "flac": 0.0, "wav": 0.0}


def _prepare(folder):
    tiny_speecht5.build(folder / SPEECH)
    tiny_whisper.build(folder / WHISPER)
    voices = folder / "voices"
    voices.mkdir()
    (voices / "bright.bin").write_bytes(BRIGHT.astype("<f4").tobytes())
    np.save(voices / "deep.npy", DEEP)
    (voices / "broken.bin").write_bytes(b"\0" * 12)  # not 512 numbers: left out


speech_server = server_fixture(
    "speech_server",
    "--speech-model",
    "{folder}/" + SPEECH,
    "--speech-voices",
    "{folder}/voices",
    "--speech-max-requests",
    str(QUEUED),
    "--transcription-model",
    "{folder}/" + WHISPER,
    "--no-embeddings",
    prepare=_prepare,
)


@pytest.fixture(scope="module")
def client(speech_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=speech_server.v1, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import openvino_genai

    return openvino_genai.Text2SpeechPipeline(str(tiny_speecht5.build(tmp_path_factory.mktemp("speecht5"))), "CPU")


def reference(pipeline: Any, sentences: list[str], voice: np.ndarray | None = None) -> np.ndarray:
    """The pipeline's samples for each sentence, one after the other."""
    import openvino as ov

    parts = []
    for sentence in sentences:
        result = pipeline.generate(sentence, None if voice is None else ov.Tensor(voice))
        parts.append(np.array(result.speeches[0].data, dtype=np.float32).reshape(-1))
    return np.concatenate(parts)


def pcm(samples: np.ndarray) -> bytes:
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def decoded(data: bytes) -> tuple[int, int]:
    """(sample rate, samples) of an audio file, decoded with PyAV."""
    import av

    count, rate = 0, 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(container.streams.audio[0]):
            count += frame.samples
            rate = frame.sample_rate
    return rate, count


def speak(server, **body: Any) -> httpx.Response:
    body.setdefault("model", SPEECH)
    body.setdefault("voice", "alloy")
    return httpx.post(server.v1 + "/audio/speech", json=body, timeout=120)


def test_the_folder_is_a_speech_model_listed_with_its_kind(speech_server, client, tmp_path):
    from ovtrio.embedding.kinds import detect_kind
    from ovtrio.model.source import ModelLoadError
    from ovtrio.speech.service import check_speech_folder

    folder = tiny_speecht5.build(tmp_path / "tts")
    assert detect_kind(folder) == "speech"
    (folder / "openvino_vocoder.xml").unlink()
    with pytest.raises(ModelLoadError, match="optimum-cli export openvino --model microsoft/speecht5_tts"):
        check_speech_folder(folder)
    card = client.models.retrieve(SPEECH).model_dump()
    assert card["kind"] == "speech" and card["input_modalities"] == ["text"]


def test_the_config_file_serves_a_speech_model_beside_the_llm(tmp_path):
    from ovtrio.embedding.kinds import served_models
    from ovtrio.server.app import ServedModels
    from ovtrio.settings.server import Settings

    folder = tiny_speecht5.build(tmp_path / "tts")
    whisper = tiny_whisper.build(tmp_path / "whisper")
    config = tmp_path / "models.json"
    models = [
        {"served_model_name": "chat"},
        {"served_model_name": "voice", "model": str(folder)},
        {"served_model_name": "ears", "model": str(whisper)},
    ]
    config.write_text(json.dumps({"models": models}))
    settings = Settings(config=str(config))
    generation, encoders = served_models(settings)
    assert [model.served_model_name for model in generation] == ["chat"]
    assert [(model.served_model_name, kind) for model, kind in encoders] == [
        ("voice", "speech"),
        ("ears", "transcription"),
    ]
    served = ServedModels.read(settings)
    assert [(name, path) for name, _, path in served.speakers] == [("voice", folder)]
    assert [name for name, _, _ in served.transcribers] == ["ears"]


@pytest.mark.parametrize("response_format", ["pcm", "wav"])
def test_pcm_and_wav_are_the_pipelines_samples(client, pipeline, response_format):
    data = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format=response_format).read()
    expected = pcm(reference(pipeline, SENTENCES))
    if response_format == "wav":
        assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
        assert int.from_bytes(data[24:28], "little") == tiny_speecht5.SAMPLE_RATE
        data = data[44:]
    assert data == expected


def test_one_sentence_is_a_wav_that_says_its_length(client, pipeline):
    data = client.audio.speech.create(model=SPEECH, input="Hello there.", voice="alloy", response_format="wav").read()
    samples = pcm(reference(pipeline, ["Hello there."]))
    assert int.from_bytes(data[40:44], "little") == len(samples) == len(data) - 44
    assert len(samples) // 2 == tiny_speecht5.samples_for(tiny_speecht5.tokens_of("Hello there."))


def test_v3_speaks_as_v1_does(speech_server, client):
    body = {"model": SPEECH, "input": TEXT, "voice": "alloy", "response_format": "flac"}
    v3 = httpx.post(speech_server.base_url + "/v3/audio/speech", json=body, timeout=120)
    assert v3.status_code == 200 and v3.headers["content-type"] == "audio/flac"
    assert v3.content == client.audio.speech.create(**body).read()


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav"])
def test_each_container_decodes_to_the_same_audio_length(client, pipeline, response_format):
    data = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format=response_format).read()
    rate, count = decoded(data)
    assert rate == DECODED_RATE.get(response_format, tiny_speecht5.SAMPLE_RATE)
    seconds = len(reference(pipeline, SENTENCES)) / tiny_speecht5.SAMPLE_RATE
    assert seconds <= count / rate <= seconds + PADDING_SECONDS[response_format] + 1e-9, (count / rate, seconds)


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_streamed_response_is_the_same_bytes_in_pieces(client, response_format):
    whole = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format=response_format).read()
    with client.audio.speech.with_streaming_response.create(
        model=SPEECH, input=TEXT, voice="alloy", response_format=response_format
    ) as response:
        assert response.headers["content-type"].startswith("audio/")
        chunks = list(response.iter_bytes(chunk_size=None))
    assert b"".join(chunks) == whole


def test_the_javascript_sdk_speaks_every_format_as_the_python_sdk_does(speech_server, client, js_clients):
    """OpenAI's Node SDK, unmodified (tests/js/speech_client.mjs): each format's bytes,
    read whole and as a stream, and an SSE stream's audio, are the Python SDK's."""
    run = subprocess.run(
        ["node", str(js_clients / "speech_client.mjs"), speech_server.v1, SPEECH, TEXT],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    formats = ["wav", "pcm", "flac", "mp3", "opus", "aac"]
    assert [(line["call"], line["format"]) for line in lines] == [
        *((call, f) for f in formats for call in ("create", "stream")),
        ("sse", "pcm"),
    ]
    whole = {
        f: client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format=f).read()
        for f in formats
    }
    for line in lines[:-1]:
        expected = whole[line["format"]]
        assert (line["sha256"], line["bytes"]) == (hashlib.sha256(expected).hexdigest(), len(expected)), line
    streamed = [line for line in lines if line["call"] == "stream"]
    assert all(line["chunks"] >= 1 for line in streamed)
    sse = lines[-1]
    assert sse["events"] == ["speech.audio.delta"] * len(SENTENCES) + ["speech.audio.done"]
    assert sse["sha256"] == hashlib.sha256(whole["pcm"]).hexdigest()


def test_sse_gives_the_audio_as_delta_events_then_the_usage(speech_server, client):
    whole = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format="pcm").read()
    response = speak(speech_server, input=TEXT, response_format="pcm", stream_format="sse")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    for event in events:
        validate(event, "CreateSpeechResponseStreamEvent")
    assert [event["type"] for event in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert b"".join(base64.b64decode(event["audio"]) for event in events[:-1]) == whole
    tokens = sum(tiny_speecht5.tokens_of(sentence) for sentence in SENTENCES)
    steps = sum(tiny_speecht5.steps_for(tiny_speecht5.tokens_of(sentence)) for sentence in SENTENCES)
    assert events[-1]["usage"] == {"input_tokens": tokens, "output_tokens": steps, "total_tokens": tokens + steps}


def test_named_voices_are_their_embeddings(speech_server, client, pipeline):
    def spoken(voice: Any) -> bytes:
        response = speak(speech_server, input="Hello there.", voice=voice, response_format="pcm")
        assert response.status_code == 200, response.text
        return response.content

    assert spoken("bright") == pcm(reference(pipeline, ["Hello there."], BRIGHT))
    assert spoken({"id": "deep"}) == pcm(reference(pipeline, ["Hello there."], DEEP))
    default = pcm(reference(pipeline, ["Hello there."]))
    assert spoken("default") == spoken("alloy") == spoken("shimmer") == default
    assert spoken("bright") != default
    error = assert_error(speak(speech_server, input="Hi.", voice="whisperer"), 400, param="voice", code="unknown_voice")
    assert "bright" in error["message"] and "deep" in error["message"] and "broken" not in error["message"]


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_stretches_each_sentence_and_keeps_its_rate(client, pipeline, speed):
    """FFmpeg's atempo filter, a sentence at a time: about len / speed samples a
    sentence (its windows cut a little at the ends: up to a tenth of a short sentence at
    4x), at the model's rate; the flac of it decodes to as many samples."""
    data = client.audio.speech.create(
        model=SPEECH, input=TEXT, voice="alloy", response_format="pcm", speed=speed
    ).read()
    plain = len(reference(pipeline, SENTENCES))
    assert len(data) % 2 == 0
    assert 0.85 <= (len(data) // 2) * speed / plain <= 1.05, (len(data) // 2, plain / speed)
    flac = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format="flac", speed=speed)
    assert decoded(flac.read()) == (tiny_speecht5.SAMPLE_RATE, len(data) // 2)


def test_instructions_are_taken_and_change_nothing(speech_server, client):
    plain = client.audio.speech.create(model=SPEECH, input="Hello there.", voice="alloy", response_format="pcm").read()
    told = client.audio.speech.create(
        model=SPEECH, input="Hello there.", voice="alloy", response_format="pcm", instructions="Whisper it."
    ).read()
    assert told == plain


def test_the_first_audio_leaves_before_the_last_sentence_is_spoken(speech_server):
    """The server's own record: how many sentences were spoken when a request's first
    audio was sent (ovtrio_speech_first_audio_pieces). Of the three sentences here the
    first is one word and the other two each take about sixty times its decoder steps:
    the first audio leaves once the first is spoken, and must leave before the third is
    done (the sum grows by 1, at most 2 on a machine that stalls the server for longer
    than the second sentence takes; 3 is a server that waited for the whole text)."""
    labels = {"model_name": SPEECH, "kind": "speech"}

    def recorded() -> tuple[float, float]:
        text = httpx.get(speech_server.base_url + "/metrics", timeout=30).text
        return (
            metric_value(text, "ovtrio_speech_first_audio_pieces_count", **labels),
            metric_value(text, "ovtrio_speech_first_audio_pieces_sum", **labels),
        )

    count, total = recorded()
    long = "And then, " + "on and on, " * 25 + "the end."  # one piece: under 300 characters
    sentences = ["Hi.", long, long.replace("then", "so")]
    with httpx.stream(
        "POST",
        speech_server.v1 + "/audio/speech",
        json={"model": SPEECH, "voice": "alloy", "input": " ".join(sentences), "response_format": "pcm"},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        chunks = [len(chunk) for chunk in response.iter_raw()]
    now_count, now_total = recorded()
    assert now_count == count + 1
    assert now_total - total < 3, "the first audio waited for the last sentence"
    assert sum(chunks) == 2 * sum(tiny_speecht5.samples_for(tiny_speecht5.tokens_of(s)) for s in sentences)


def test_bad_requests_are_400s_naming_the_field_beside_innocent_streams(speech_server):
    def hostile() -> None:
        for body, param, code in (
            ({"input": ""}, "input", None),
            ({"input": " \n\t "}, "input", None),
            ({"input": "a" * 4097}, "input", "string_above_max_length"),
            ({"input": "Hi.", "response_format": "ogg"}, "response_format", None),
            ({"input": "Hi.", "stream_format": "chunks"}, "stream_format", None),
            ({"input": "Hi.", "voice": "nobody"}, "voice", "unknown_voice"),
            ({"input": "Hi.", "voice": {"id": "nobody"}}, "voice.id", "unknown_voice"),
            ({"input": "Hi.", "speed": 4.5}, "speed", None),
            ({"input": "Hi.", "speed": 0.1}, "speed", None),
            ({"input": "Hi.", "speed": "fast"}, "speed", None),
            ({"input": ["Hi."]}, "input", None),
            ({"input": "Hi.", "instructions": "x" * 4097}, "instructions", None),
            ({"input": "Hi.", "model": "SmolLM2-135M-Instruct"}, "model", "model_kind_mismatch"),
        ):
            assert_error(speak(speech_server, **body), 400, param=param, code=code)
        assert_error(speak(speech_server, input="Hi.", model="no-such-model"), 404, param="model")
        response = httpx.post(speech_server.v1 + "/audio/speech", json={"model": SPEECH, "input": "Hi."}, timeout=60)
        assert_error(response, 400, param="voice")

    beside_innocent_streams(speech_server, hostile)


LONG = " ".join(f"Sentence number {index} is here." for index in range(100))  # 100 pieces, < 4096 characters


def _inputs_spoken(server) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    # One batch is one sentence spoken (a request's inputs are counted when it ends).
    return metric_value(text, "ovtrio_encoder_batch_size_sum", model_name=SPEECH, kind="speech")


def _settled_inputs(server) -> float:
    """The sentences spoken so far, once the model has stopped speaking."""
    before = _inputs_spoken(server)
    while True:
        time.sleep(0.5)  # polled until two readings agree: the model has stopped
        now = _inputs_spoken(server)
        if now == before:
            return now
        before = now


def test_a_client_that_leaves_stops_its_synthesis_beside_innocent_streams(speech_server):
    assert len(LONG) < 4096
    started = _settled_inputs(speech_server)

    def hostile() -> None:
        for stream_format in ("audio", "sse"):
            with httpx.stream(
                "POST",
                speech_server.v1 + "/audio/speech",
                json={
                    "model": SPEECH,
                    "voice": "alloy",
                    "input": LONG,
                    "response_format": "wav",
                    "stream_format": stream_format,
                },
                timeout=120,
            ) as response:
                assert response.status_code == 200
                next(response.iter_raw())  # the first sentence's audio, then gone

    beside_innocent_streams(speech_server, hostile)
    spoken = _settled_inputs(speech_server) - started
    assert 2 <= spoken < 100, f"{spoken} sentences spoken for two clients that left after the first"


REQUESTS = 200


def test_many_requests_at_once_get_429s_and_the_rest_are_spoken(speech_server):
    outcomes: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        response = speak(speech_server, input=" ".join(SENTENCES * 4), response_format="pcm")
        if response.status_code == 429:
            assert_error(response, 429, param=None, code="rate_limit_exceeded", type="requests")
            assert int(response.headers["retry-after"]) >= 1
        else:
            assert response.status_code == 200, response.text
            assert len(response.content) > 0
        with lock:
            outcomes.append(response.status_code)

    def hostile() -> None:
        threads = [threading.Thread(target=one) for _ in range(REQUESTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    beside_innocent_streams(speech_server, hostile)
    assert len(outcomes) == REQUESTS and set(outcomes) <= {200, 429}
    assert 429 in outcomes and outcomes.count(200) >= QUEUED, outcomes


def test_a_model_takes_at_most_its_requests_at_once(speech_server):
    """--speech-max-requests bounds the requests being spoken, not only those waiting to
    start: with QUEUED long requests under way (each past its first sentence, 300
    sentences between them still to speak), the next is a 429; once they end, it is
    taken."""
    body = {"model": SPEECH, "voice": "alloy", "input": LONG, "response_format": "pcm"}
    readers = []  # kept: a reader let go closes its response, and its client has left
    with contextlib.ExitStack() as held:
        for _ in range(QUEUED):
            response = held.enter_context(
                httpx.stream("POST", speech_server.v1 + "/audio/speech", json=body, timeout=120)
            )
            assert response.status_code == 200
            readers.append(response.iter_raw())
            next(readers[-1])  # its first sentence is spoken: it holds no place of the queue
        refused = speak(speech_server, input="Hi.", response_format="pcm")
        assert_error(refused, 429, param=None, code="rate_limit_exceeded", type="requests")
    # The clients left: their requests stop at their next sentence and give their places back.
    wait_until = 0
    while (taken := speak(speech_server, input="Hi.", response_format="pcm")).status_code == 429:
        wait_until += 1
        assert wait_until < 600, "the places of requests whose clients left never came back"
        time.sleep(0.1)
    assert taken.status_code == 200
    # Every place came back: QUEUED long requests at once are all taken.
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(speak(speech_server, **body).status_code)) for _ in range(QUEUED)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [200] * QUEUED


def test_a_text_without_sentence_ends_is_spoken_in_bounded_pieces_beside_innocent_streams(speech_server):
    """4096 characters with no full stop, comma or space, the longest text taken: spoken
    in pieces of at most 300 characters, each as long as its characters make it."""
    text = "a" * 4096
    sizes = [300] * 13 + [196]

    def hostile() -> None:
        response = speak(speech_server, input=text, response_format="pcm")
        assert response.status_code == 200
        assert len(response.content) == 2 * sum(tiny_speecht5.samples_for(size + 1) for size in sizes)

    beside_innocent_streams(speech_server, hostile)


def test_health_stays_fast_while_four_syntheses_run(speech_server):
    def four() -> None:
        held: list[int] = []

        def one() -> None:
            held.append(speak(speech_server, input=LONG, response_format="mp3").status_code)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert held == [200] * 4

    health_stays_fast(speech_server, four)


def test_spoken_audio_is_transcribed_by_the_same_server(speech_server, client):
    """The plumbing of a voice round trip, not the words (both models are random): the
    speech model's wav goes to the Whisper model as it is, which hears all of it."""
    audio = client.audio.speech.create(model=SPEECH, input=TEXT, voice="alloy", response_format="wav").read()
    samples = (len(audio) - 44) // 2
    for response_format, name in (("wav", "speech.wav"), ("flac", "speech.flac"), ("mp3", "speech.mp3")):
        data = (
            audio
            if response_format == "wav"
            else client.audio.speech.create(
                model=SPEECH, input=TEXT, voice="alloy", response_format=response_format
            ).read()
        )
        result = client.audio.transcriptions.create(model=WHISPER, file=(name, data), response_format="verbose_json")
        assert isinstance(result.text, str)
        expected = samples / tiny_speecht5.SAMPLE_RATE
        assert expected <= result.duration <= expected + PADDING_SECONDS.get(response_format, 0.0) + 1e-3


def test_a_piece_stops_at_the_decoders_positions(tmp_path, pipeline):
    """A text the model never stops on ends where the decoder's positions do: here 24
    positions (config.json's max_speech_positions) for a sentence that would take 39
    steps; a shorter one is spoken whole, as the pipeline speaks it."""
    import json as json_module

    from ovtrio.speech.engine import Speaker

    folder = tiny_speecht5.build(tmp_path / "short")
    config = json_module.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json_module.dumps({**config, "max_speech_positions": 24}))
    speaker = Speaker(folder, "CPU", {})
    long = speaker.speak("Hello there, how are you doing today?", None)
    assert tiny_speecht5.steps_for(tiny_speecht5.tokens_of("Hello there, how are you doing today?")) > 22
    assert long.output_steps == 22 and len(long.samples) == 22 * 2 * tiny_speecht5.HOP
    short = speaker.speak("Hi.", None)
    assert np.array_equal(short.samples, reference(pipeline, ["Hi."]))
